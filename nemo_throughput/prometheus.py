"""Live metrics for Prometheus: rank 0 serves ``/metrics`` with ``prometheus_client``.

Rank 0 serves, one endpoint per run: every rank's step times and telemetry already reach it on
the log steps' all-gather, so it alone knows the run's figures, and serving them needs no new
collective. Scrape the node of rank 0 (the Kubernetes launcher annotates the Master pod for it;
under Slurm, the first node of the job); per-rank series carry ``rank``, ``node`` and ``gpu``.

Every figure the loggers get (progress.LOGGED_METRICS) is a gauge ``nemo_throughput_<key>`` with
``window="interval"`` (the latest log interval's, as logged) and ``window="run"`` (the run's so
far, as its summary gives them); every measured step's global time goes into the histogram
``nemo_throughput_step_seconds``; ``nemo_throughput_status`` is the summary's status. For the
alert rules (launchers/prometheus/nemo-throughput-alerts.yml): ``nemo_throughput_rank_straggler_time_s``
is each rank's time per step that names the straggler (run_stats.Interval.rank_straggler_s), and
``nemo_throughput_last_step_timestamp_seconds`` the Unix time rank 0's latest step ended, set by
:meth:`PrometheusEndpoint.last_step` (from the stall watch's looks, and at log steps). The gauges
change on the reporting thread, never on a step. A port already taken is a warning: training goes on without
the endpoint.

The endpoint shares the training process, so no peer may cost it more than a bounded share of it: at
most MAX_CONNECTIONS requests are served at once (more are closed at once), and a peer that sends
nothing for REQUEST_TIMEOUT_S is dropped (idle connections, each a thread and a file descriptor,
had exhausted the process's descriptors and failed the run).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from nemo_throughput.config import checked_prometheus
from nemo_throughput.environment import ENV_PROMETHEUS_PORT, job_details
from nemo_throughput.explain.telemetry import throttled
from nemo_throughput.explain.telemetry_stats import GIB
from nemo_throughput.progress import LOGGED_METRICS, summary_metrics
from nemo_throughput.summary import STATUSES
from nemo_throughput.text import package_logger
from nemo_throughput.values import whole_number

log = package_logger(__name__)

PREFIX = "nemo_throughput_"
MAX_CONNECTIONS = 16  # requests served at once; a scraper needs one
REQUEST_TIMEOUT_S = 10.0  # a peer silent this long is dropped
_serving: dict[tuple[str, int], PrometheusEndpoint] = {}  # this process's endpoints, by address: a lingering one yields
RUN_LABELS = ("run", "run_id", "label", "model", "job_id")  # on every series
RANK_LABELS = ("rank", "node", "gpu")  # on the per-rank series
# Global step times from tens of milliseconds (small models) to minutes (the largest, at scale).
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
# Per-rank gauges: (name, unit and meaning, the telemetry FIELDS value it shows).
PER_RANK = (
    ("rank_power_w", "board power, W (NVML)", lambda row: row["power_w"]),
    ("rank_memory_reserved_gib", "the allocator's reserved peak so far, GiB",
     lambda row: row["mem_peak_reserved_bytes"] / GIB),
    ("rank_sm_clock_mhz", "SM clock, MHz (NVML)", lambda row: row["sm_clock_mhz"]),
    ("rank_throttled", "1 when a power cap or a thermal or hardware slowdown lowers the clocks (NVML)",
     lambda row: math.nan if (state := throttled(row["throttle_reasons"])) is None else float(state)),
)


def prometheus_setting(setting: Mapping[str, Any] | None, env: Mapping[str, str]) -> dict[str, Any] | None:
    """The setting, else the port in ``$NEMO_THROUGHPUT_PROMETHEUS_PORT`` (None: no endpoint)."""
    if setting is not None or not env.get(ENV_PROMETHEUS_PORT):
        return checked_prometheus(setting)
    text = env[ENV_PROMETHEUS_PORT].strip()
    port = whole_number(text)
    if port is None or port > 65535:
        raise ValueError(f"{ENV_PROMETHEUS_PORT} must be a TCP port (0-65535; 0: any free one), got {text!r}")
    return checked_prometheus({"port": port})


def job_id(env: Mapping[str, str]) -> str:
    """The scheduler's name for the job: Slurm's job id, the Kubernetes job's name, torchrun's run id."""
    details = job_details(env)
    return next((details[key] for key in ("slurm_job_id", "job_name", "torchelastic_run_id") if key in details), "")


class PrometheusEndpoint:
    """Rank 0's ``/metrics``: made at set-up, updated at log steps, closed at the end of the run."""

    def __init__(self, setting: Mapping[str, Any], labels: Mapping[str, str]) -> None:
        from prometheus_client import CollectorRegistry, Enum, Gauge, Histogram

        self.setting = dict(setting)
        self.address: str | None = None  # host:port as a URL has it, once serving
        self._labels = [labels[name] for name in RUN_LABELS]
        self.registry = CollectorRegistry()
        with_window = (*RUN_LABELS, "window")
        self._figures = {m.key: Gauge(PREFIX + m.key, f"{m.meaning} ({m.unit})", with_window, registry=self.registry)
                         for m in LOGGED_METRICS}
        self._per_rank = {name: Gauge(PREFIX + name, meaning, (*RUN_LABELS, *RANK_LABELS), registry=self.registry)
                          for name, meaning, _ in PER_RANK}
        self._step_seconds = Histogram(PREFIX + "step_seconds", "every measured step's global (slowest-rank) time, s",
                                       RUN_LABELS, buckets=STEP_BUCKETS, registry=self.registry)
        self._straggler_s = Gauge(
            PREFIX + "rank_straggler_time_s", "the rank's mean time per step that names the straggler, s: its local "
            "time (data + forward, before its first collective) where every rank observed it, else its step time; "
            "over the latest log interval's counted steps", (*RUN_LABELS, *RANK_LABELS), registry=self.registry)
        self._last_step = Gauge(PREFIX + "last_step_timestamp_seconds",
                                "Unix time rank 0's latest step ended, as its stall watch saw it (every few "
                                "seconds; at log steps with the watch off), s", RUN_LABELS,
                                registry=self.registry)
        self._last_step_s = 0.0
        self._steps = Gauge(PREFIX + "steps_done", "optimizer steps finished and exchanged (the summary's last step)",
                            RUN_LABELS, registry=self.registry)
        self._status = Enum(PREFIX + "status", "the run's status, as its summary says", RUN_LABELS,
                            states=list(STATUSES), registry=self.registry)
        self._status.labels(*self._labels).state("running")
        self._server: _BoundedServer | None = None
        self._closed_at: float | None = None  # time.monotonic() when the run ended
        self._scraped = False  # a request was answered: something scrapes this endpoint
        self._final_read = threading.Event()  # a scrape that began after the run ended was served
        self._linger: threading.Thread | None = None  # serving on after the run ended, until _final_read
        self._lock = threading.Lock()  # the reporting thread and the end of the run both update

    def serve(self) -> bool:
        """Start serving; a port already taken (or any other error) is a warning, and no endpoint. An
        endpoint of this process's previous run still lingering on the port stops first."""
        port, addr = self.setting["port"], self.setting["addr"]
        previous = _serving.get((addr, port))
        if previous is not None and previous._linger is not None:
            previous._final_read.set()  # its run has ended: it stops serving now, freeing the port
            previous._linger.join()
        try:
            self._server = _BoundedServer.serve(addr, port, self.registry, self._served)
        except OSError as error:
            log.warning("nemo-throughput: no Prometheus endpoint: could not listen on %s:%d (%s). Training goes "
                        "on; choose a free port with prometheus.port or %s.", addr, port, error,
                        ENV_PROMETHEUS_PORT)
            return False
        host = f"[{addr}]" if ":" in addr else addr  # an IPv6 address is bracketed in a URL (RFC 3986)
        self.address = f"{host}:{self._server.server_port}"
        if port:
            _serving[(addr, port)] = self
        log.info("nemo-throughput: Prometheus metrics at http://%s/metrics", self.address)
        return True

    def interval(self, figures: Mapping[str, float], measured_step_s: Iterable[float],
                 telemetry: list[dict[str, float]], places: list[dict[str, Any]],
                 rank_straggler_s: Sequence[float] = ()) -> None:
        """A log interval: the loggers' figures (``throughput/<key>``), its measured steps' global times,
        every rank's latest telemetry (explain's FIELDS per rank) and every rank's time per step that
        names the straggler, s (run_stats.Interval.rank_straggler_s)."""
        with self._lock:
            self._set_window("interval", {key.removeprefix("throughput/"): value for key, value in figures.items()})
            histogram = self._step_seconds.labels(*self._labels)
            for seconds in measured_step_s:
                histogram.observe(seconds)
            for row, place in zip(telemetry, places, strict=False):
                for name, _, read in PER_RANK:
                    _set_or_remove(self._per_rank[name], (*self._labels, *_rank_labels(place)), read(row))
            for seconds, place in zip(rank_straggler_s, places, strict=False):
                _set_or_remove(self._straggler_s, (*self._labels, *_rank_labels(place)), seconds)

    def last_step(self, epoch_s: float) -> None:
        """Steps ended at ``epoch_s`` (Unix time, s): what the stall alert measures from. Any thread;
        never back in time (the log step's stamp may arrive after the stall watch's later one)."""
        with self._lock:
            if epoch_s > self._last_step_s:
                self._last_step_s = epoch_s
                self._last_step.labels(*self._labels).set(epoch_s)

    def summary(self, summary: Mapping[str, Any]) -> None:
        """The run's figures as its (running or final) summary gives them, its last step and status."""
        with self._lock:
            self._set_window("run", summary_metrics(dict(summary)))
            _set_or_remove(self._steps, self._labels, summary["timing"]["last_step"])
            self._status.labels(*self._labels).state(summary["status"])

    def _set_window(self, window: str, values: Mapping[str, float]) -> None:
        for key, gauge in self._figures.items():
            _set_or_remove(gauge, (*self._labels, window), values.get(key))

    def close(self, linger_s: float = 0.0) -> None:
        """Stop serving once a scrape has read the final figures, or after ``linger_s`` seconds at most
        (a thread the interpreter waits for at exit); at once with ``linger_s`` 0, or where nothing
        scraped the endpoint while the run trained (nothing will read its end)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closed_at = time.monotonic()

        def stop() -> None:
            server.shutdown()
            server.server_close()
            if _serving.get((self.setting["addr"], self.setting["port"])) is self:
                del _serving[(self.setting["addr"], self.setting["port"])]

        def stop_once_read() -> None:
            self._final_read.wait(linger_s)
            stop()

        if linger_s > 0 and self._scraped:
            self._linger = threading.Thread(target=stop_once_read, name="nemo-throughput-prometheus-linger",
                                            daemon=False)
            self._linger.start()
        else:
            stop()

    def _served(self, began: float) -> None:
        """A request that began at ``began`` (time.monotonic()) was answered."""
        self._scraped = True
        if self._closed_at is not None and began >= self._closed_at:
            self._final_read.set()


class _QuietHandler(WSGIRequestHandler):
    """Logs no request; a peer that sends nothing for REQUEST_TIMEOUT_S is dropped."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """prometheus_client's WSGI app, a thread per request, at most MAX_CONNECTIONS at once."""

    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds until accepted (socketserver's 5 made peers retry)

    @classmethod
    def serve(cls, addr: str, port: int, registry: Any, served: Callable[[float], None]) -> _BoundedServer:
        """Serving on a thread of its own; ``served(began)`` is told of each request answered."""
        from prometheus_client import make_wsgi_app

        app = make_wsgi_app(registry)

        def counted(environ: dict[str, Any], start_response: Any) -> Any:
            began = time.monotonic()
            try:
                return app(environ, start_response)
            finally:
                served(began)

        family, _, _, _, address = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        server_class = type(cls.__name__, (cls,), {"address_family": family})  # IPv6 where addr is one
        server = make_server(address[0], port, counted, server_class, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="nemo-throughput-prometheus", daemon=True).start()
        return server

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # every slot taken: this one is closed at once
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _rank_labels(place: Mapping[str, Any]) -> tuple[str, str, str]:
    """RANK_LABELS of a rank's place: its rank, host and GPU index ("" where it has none)."""
    return str(place["rank"]), str(place["host"]), "" if place["gpu_index"] is None else str(place["gpu_index"])


def _set_or_remove(gauge: Any, labels: Iterable[str], value: float | None) -> None:
    """A value sets the series; none (or NaN) removes it, so that no stale value is scraped."""
    labels = tuple(labels)
    if value is not None and math.isfinite(value):
        gauge.labels(*labels).set(value)
    else:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass
