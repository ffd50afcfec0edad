# Makes `pkg://nemo_throughput.conf` importable (nemo_throughput/conf links here).
