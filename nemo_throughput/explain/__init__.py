"""What explains a run's number: memory and device telemetry, network, profiler window, fabric probe."""
