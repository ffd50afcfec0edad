"""A measured run, framework-free: its life cycle and hot path (measurement), its one set-up for
every stack (startup), the steps' exchange across ranks (intervals), the reporting of each interval
(reporting) and where its summary goes (publishing). Every adapter drives a
:class:`~nemo_throughput.run.measurement.Measurement`."""
