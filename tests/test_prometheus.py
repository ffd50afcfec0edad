"""The live endpoint scraped by a real Prometheus server (Debian's, installed by .ci/setup-prometheus),
started on loopback with a scrape config written here, while a real 2-rank gloo run trains; its
numbers, read back through Prometheus' HTTP API, are the summary's to the digit; the Grafana
dashboard's queries return data from it; the alert rules load and evaluate there (promtool tests
what they fire on: test_prometheus_alerts.py)."""

import json
import math
import os
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch

from conftest import free_port, prometheus_binary, read_json, run_train_tiny
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.explain.telemetry import FIELDS
from nemo_throughput.explain.telemetry_stats import GIB, TelemetryStats
from nemo_throughput.progress import summary_metrics
from nemo_throughput.prometheus import RANK_LABELS, RUN_LABELS, PrometheusEndpoint, prometheus_setting

DASHBOARD = Path(__file__).parents[1] / "launchers" / "grafana" / "nemo-throughput.json"
ALERT_RULES = Path(__file__).parents[1] / "launchers" / "prometheus" / "nemo-throughput-alerts.yml"
SCRAPE_S = 0.5





class PrometheusServer:
    """A real Prometheus on 127.0.0.1, scraping ``targets`` and evaluating ``rule_files`` every SCRAPE_S seconds."""

    def __init__(self, directory: Path, targets: list[int], rule_files: tuple[Path, ...] = ()):
        self.port = free_port()
        config = directory / "prometheus.yml"
        every = f"{int(SCRAPE_S * 1000)}ms"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [{"job_name": "nemo-throughput",
                                "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in targets]}]}]}))
        self.process = subprocess.Popen(
            [prometheus_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=open(directory / "prometheus.log", "w"))
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(directory / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> list:
        return self._data(path, **params)["result"]

    def rules(self) -> dict[str, dict]:
        """Every loaded rule by its name, with its health and last error."""
        return {rule["name"]: rule for group in self._data("rules")["groups"] for rule in group["rules"]}

    def _data(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def last(self, selector: str) -> list:
        """Each series' last scraped sample (the targets are gone: their series are stale now)."""
        return self.api("query", query=f"last_over_time({selector}[10m])")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def serve_synthetic_telemetry(port: int, summary: dict) -> PrometheusEndpoint:
    """An endpoint of two ranks with GPU readings (a CPU has none): real prometheus_client, real NVML
    field layout, made-up numbers, so that the per-rank and energy panels have data to show; the
    run window is ``summary``'s with that telemetry."""
    places = [{"rank": rank, "host": "node0", "gpu_index": rank} for rank in range(2)]
    stats = TelemetryStats(places, {"nvml": "synthetic"})
    for step, joules in ((10, 0.0), (20, 5000.0)):
        rows = []
        for rank in range(2):
            row = dict.fromkeys(FIELDS, math.nan)
            row.update(power_w=500.0 + rank, sm_clock_mhz=1980.0, mem_peak_reserved_bytes=40 * GIB,
                       throttle_reasons=0.0, energy_j=joules)
            rows.append([row[name] for name in FIELDS])
        stats.add(torch.tensor(rows, dtype=torch.float64), step=step, is_measured=lambda step: True)
    endpoint = PrometheusEndpoint({"port": port, "addr": "127.0.0.1", "linger_s": 0.0},
                                  {"run": "synthetic", "run_id": "synthetic", "label": "", "model": "", "job_id": ""})
    assert endpoint.serve()
    live = {f"throughput/{key}": value for key, value in stats.live(tokens_per_step=1000).items()}
    endpoint.interval(live, [0.5, 0.5], stats.latest, places)
    endpoint.summary({**summary, "telemetry": stats.section(tokens_per_step=1000)})
    return endpoint


def test_an_ipv6_address_is_served_and_printed_as_a_valid_url(caplog):
    import logging
    import urllib.request

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        pytest.skip(f"no IPv6 loopback on this machine ({error})")

    endpoint = PrometheusEndpoint({"port": 0, "addr": "::1", "linger_s": 0.0},
                                  dict.fromkeys(("run", "run_id", "label", "model", "job_id"), "x"))
    with caplog.at_level(logging.INFO, logger="nemo_throughput"):
        assert endpoint.serve()
    try:
        url = f"http://{endpoint.address}/metrics"
        assert url.startswith("http://[::1]:") and f"Prometheus metrics at {url}" in caplog.text
        with urllib.request.urlopen(url, timeout=10) as response:  # the printed URL is one a client opens
            assert b"nemo_throughput_status" in response.read()
    finally:
        endpoint.close()


@pytest.mark.slow
def test_a_real_prometheus_scrapes_a_two_rank_run_and_holds_the_summary_s_numbers(tmp_path):
    run_port, synthetic_port = free_port(), free_port()
    # The shipped rules fire after minutes; one that fires at once gives the dashboard's alert panel data.
    firing = tmp_path / "firing.yml"
    firing.write_text(json.dumps({"groups": [{"name": "test", "rules": [
        {"alert": "NemoThroughputTestFiring", "expr": "nemo_throughput_steps_done >= 0"}]}]}))
    started = time.time()
    server = PrometheusServer(tmp_path, [run_port, synthetic_port], rule_files=(ALERT_RULES, firing))
    synthetic = None
    try:
        process = run_train_tiny("--output-dir", tmp_path / "run", "--devices", 2, "--steps", 30, "--log-every", 5,
                                 "--step-sleep-s", 0.05, "--peak-tflops", 1e-3, "--prometheus-port", run_port,
                                 "--linger-s", 4 * SCRAPE_S)
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output[-3000:]
        summary = read_json(tmp_path / "run" / "summary.json")
        synthetic = serve_synthetic_telemetry(synthetic_port, summary)
        time.sleep(4 * SCRAPE_S)  # a few scrapes of the synthetic endpoint
        assert summary["status"] == "completed"

        run = {"run": summary["run"]["name"]}
        expected = summary_metrics(summary)
        assert {"tokens_per_s", "mfu", "step_time_s", "slowest_rank", "straggler_excess_pct", "goodput_pct"} <= set(
            expected)
        for key, value in expected.items():
            (series,) = server.last(f'nemo_throughput_{key}{{window="run",run="{run["run"]}"}}')
            assert series["metric"]["run_id"] == summary["run"]["id"]
            assert float(series["value"][1]) == value, key  # to the digit
        (status,) = server.api("query", query=f'last_over_time(nemo_throughput_status{{run="{run["run"]}"}}[10m]) == 1')
        assert status["metric"]["nemo_throughput_status"] == "completed"
        (steps,) = server.last(f'nemo_throughput_steps_done{{run="{run["run"]}"}}')
        assert float(steps["value"][1]) == summary["timing"]["last_step"] == 30
        (count,) = server.last(f'nemo_throughput_step_seconds_count{{run="{run["run"]}"}}')
        (total,) = server.last(f'nemo_throughput_step_seconds_sum{{run="{run["run"]}"}}')
        assert float(count["value"][1]) == summary["timing"]["steps_measured"]
        assert float(total["value"][1]) / float(count["value"][1]) == pytest.approx(
            summary["timing"]["step_time_s"]["mean"], rel=1e-12)
        # The interval window: the loggers' figures of the last interval (steps 26-30).
        (interval,) = server.last(f'nemo_throughput_tokens_per_s{{window="interval",run="{run["run"]}"}}')
        (seconds,) = server.last(f'nemo_throughput_step_time_s{{window="interval",run="{run["run"]}"}}')
        tokens = summary["batch"]["tokens_per_step"]
        assert float(interval["value"][1]) == pytest.approx(tokens / float(seconds["value"][1]), rel=1e-12)
        # What the alert rules read: each rank's time before its first collective, the last log step's time.
        ranks = server.last(f'nemo_throughput_rank_straggler_time_s{{run="{run["run"]}"}}')
        assert sorted(series["metric"]["rank"] for series in ranks) == ["0", "1"]
        assert all(0 < float(series["value"][1]) < summary["timing"]["step_time_s"]["max"] for series in ranks)
        assert summary["timing"]["straggler"]["metric"] == "local_time_s"  # what the gauge holds here too
        (stamp,) = server.last(f'nemo_throughput_last_step_timestamp_seconds{{run="{run["run"]}"}}')
        assert started < float(stamp["value"][1]) < time.time()
        loaded = server.rules()
        assert {"NemoThroughputStalled", "NemoThroughputSlowdown", "NemoThroughputStraggler",
                "NemoThroughputThrottled"} < set(loaded)
        assert all(rule["health"] == "ok" for rule in loaded.values()), loaded

        # Every query of the Grafana dashboard returns data from this Prometheus; each label a legend shows
        # is one the endpoint exports (the alerts' are the rules' own; an empty one, a CPU's gpu, Prometheus
        # drops); the Status panel shows its label by name (it showed only `1`: the status is a label).
        end = time.time()
        for panel in json.loads(DASHBOARD.read_text())["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$run", ".+").replace("$__rate_interval", "5s")
                result = server.api("query_range", query=expr, start=end - 120, end=end, step=SCRAPE_S)
                assert result, f"{panel['title']}: {expr} returned no data"
                shown = re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")) if "ALERTS" not in expr else []
                assert set(shown) <= {*RUN_LABELS, *RANK_LABELS, "nemo_throughput_status"}, panel["title"]
            if panel["title"] == "Status":
                assert panel["options"]["textMode"] == "name" and "{{nemo_throughput_status}}" in target["legendFormat"]
    finally:
        if synthetic is not None:
            synthetic.close()
        server.stop()


def test_the_endpoint_is_opt_in_by_setting_or_variable_and_a_taken_port_is_a_warning(caplog):
    assert prometheus_setting(None, {}) is None
    assert prometheus_setting(None, {"NEMO_THROUGHPUT_PROMETHEUS_PORT": "9464"}) == {
        "port": 9464, "addr": "0.0.0.0", "linger_s": 30.0}
    setting = prometheus_setting({"port": 0, "addr": "127.0.0.1"}, {"NEMO_THROUGHPUT_PROMETHEUS_PORT": "9464"})
    assert setting == {"port": 0, "addr": "127.0.0.1", "linger_s": 30.0}  # the setting wins
    for bad in ({"port": 70000}, {"addr": "x"}, {"port": "9464"}, {"port": 1, "linger_s": -1}, 9464,
                {"port": 1, "linger_s": 1e300}, {"port": 1, "linger_s": 3601}, {"port": 1, "linger_s": math.nan}):
        with pytest.raises(ValueError, match="prometheus"):
            ThroughputConfig(prometheus=bad)
    for bad in ("http", "99999", "-1", "²", "1e3", "٣"):  # "²".isdigit() is True, and int("²") raises
        with pytest.raises(ValueError, match="NEMO_THROUGHPUT_PROMETHEUS_PORT must be a TCP port"):
            prometheus_setting(None, {"NEMO_THROUGHPUT_PROMETHEUS_PORT": bad})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = PrometheusEndpoint({"port": taken.getsockname()[1], "addr": "127.0.0.1", "linger_s": 0.0},
                                      dict.fromkeys(("run", "run_id", "label", "model", "job_id"), "x"))
        assert not endpoint.serve()
    assert "Training goes on" in caplog.text


def scrape(address: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
        return response.read()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_idle_connections_cost_the_run_a_bounded_number_of_descriptors_and_then_are_dropped(monkeypatch):
    """Connections that send nothing each held a thread and a file descriptor for good: some hundreds
    exhausted the training process's descriptors and failed the run. At most MAX_CONNECTIONS are
    served at once (more are closed at once), and a silent one is dropped after the timeout."""
    from nemo_throughput import prometheus

    monkeypatch.setattr(prometheus._QuietHandler, "timeout", 0.5)
    endpoint = PrometheusEndpoint({"port": 0, "addr": "127.0.0.1", "linger_s": 0.0}, dict.fromkeys(RUN_LABELS, "x"))
    assert endpoint.serve()
    host, port = endpoint.address.rsplit(":", 1)
    before = open_descriptors()
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3 * prometheus.MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        # each idle client's own socket, and the server's for at most MAX_CONNECTIONS of them (+ a slack of 2)
        assert open_descriptors() - before <= len(idle) + prometheus.MAX_CONNECTIONS + 2
        refused = 0
        for client in idle:
            client.settimeout(5)
            try:
                refused += client.recv(1) == b""  # closed by the server: the cap, or the timeout
            except ConnectionResetError:
                refused += 1
        assert refused == len(idle)
        assert b"nemo_throughput_status" in scrape(endpoint.address)  # the slots are free again
    finally:
        for client in idle:
            client.close()
        endpoint.close()


def test_after_the_run_the_endpoint_serves_until_a_scrape_reads_its_final_figures():
    """linger_s is the most it waits; the first scrape after the run's end ends it (before: a run without
    linger_s was last seen running, one or two log intervals behind its summary). An endpoint nothing
    scraped while the run trained stops at once."""
    unscraped = PrometheusEndpoint({"port": 0, "addr": "127.0.0.1", "linger_s": 60.0}, dict.fromkeys(RUN_LABELS, "x"))
    assert unscraped.serve()
    unscraped.close(linger_s=60.0)
    with pytest.raises(OSError):
        scrape(unscraped.address, timeout=2)

    endpoint = PrometheusEndpoint({"port": 0, "addr": "127.0.0.1", "linger_s": 60.0}, dict.fromkeys(RUN_LABELS, "x"))
    assert endpoint.serve()
    scrape(endpoint.address)  # a scraper reads it while the run trains
    endpoint._status.labels(*endpoint._labels).state("completed")  # as the final summary sets it
    started = time.monotonic()
    endpoint.close(linger_s=60.0)
    assert 'nemo_throughput_status{job_id="x",label="x",model="x",nemo_throughput_status="completed",run="x",' \
           'run_id="x"} 1.0' in scrape(endpoint.address).decode()
    while True:  # served until then, closed soon after
        try:
            scrape(endpoint.address, timeout=2)
        except OSError:
            break
        assert time.monotonic() - started < 20
        time.sleep(0.1)


def test_a_second_run_in_one_process_takes_the_port_its_lingering_predecessor_holds(caplog):
    """A notebook or sweep that fits again within linger_s: the new run serves (before: the port was
    taken, and scrapers read the first run's figures all through the second)."""
    port = free_port()
    first = PrometheusEndpoint({"port": port, "addr": "127.0.0.1", "linger_s": 60.0}, dict.fromkeys(RUN_LABELS, "a"))
    second = PrometheusEndpoint({"port": port, "addr": "127.0.0.1", "linger_s": 0.0}, dict.fromkeys(RUN_LABELS, "b"))
    assert first.serve()
    scrape(first.address)
    first.close(linger_s=60.0)
    try:
        assert second.serve(), caplog.text
        assert b'run="b"' in scrape(second.address) and b'run="a"' not in scrape(second.address)
    finally:
        second.close()


@pytest.mark.slow
def test_a_wrong_port_variable_stops_every_rank_before_training_with_its_name(tmp_path, monkeypatch):
    """Checked on every rank before the first collective: no rank waits for a rank 0 that is gone."""
    monkeypatch.setenv("NEMO_THROUGHPUT_PROMETHEUS_PORT", "99999")
    process = run_train_tiny("--output-dir", tmp_path, "--devices", 2, "--steps", 4)
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0
    message = "ValueError: NEMO_THROUGHPUT_PROMETHEUS_PORT must be a TCP port (0-65535; 0: any free one), got '99999'"
    assert f"[rank0]: {message}" in output and f"[rank1]: {message}" in output
    assert "Connection closed by peer" not in output  # rank 1 met the error itself, not rank 0's death
