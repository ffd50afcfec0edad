"""The alert rules shipped beside the Grafana dashboard, checked and unit-tested by the real promtool
(Debian's prometheus package, installed by .ci/setup-prometheus): tests/data/prometheus holds input
series that fire each alert and series that must not. test_prometheus.py loads the same rules into
its real Prometheus and checks that they evaluate there."""

import importlib.resources
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import prometheus_binary
from nemo_throughput.prometheus import PrometheusEndpoint

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "launchers" / "prometheus" / "nemo-throughput-alerts.yml"
RULES_TEST = REPO / "tests" / "data" / "prometheus" / "nemo-throughput-alerts.test.yml"
ALERTS = {"NemoThroughputStalled": None, "NemoThroughputSlowdown": "10m", "NemoThroughputStraggler": "10m",
          "NemoThroughputThrottled": "5m"}  # each alert and its `for` (Stalled holds its 10 minutes in its expression)
RUN_LABELS = ("run", "run_id", "label", "model", "job_id")





def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules():
    result = subprocess.run([prometheus_binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_fires_each_alert_on_its_series_and_never_on_the_others():
    result = subprocess.run([prometheus_binary("promtool"), "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == set(ALERTS)


def test_each_alert_has_its_duration_severity_and_a_summary_naming_the_run():
    assert {rule["alert"]: rule.get("for") for rule in rules()} == ALERTS
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        summary = rule["annotations"]["summary"]
        assert "\n" not in summary and "{{ $labels.run }}" in summary, rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
        # Only a finished run's lingering figures: never an alert (a stalled run has not ended)
        ongoing = "running|stalled" if rule["alert"] == "NemoThroughputStalled" else "running"
        assert f'nemo_throughput_status{{nemo_throughput_status{"=~" if "|" in ongoing else "="}"{ongoing}"}} == 1' \
            in rule["expr"], rule["alert"]


def test_the_rules_read_only_series_the_endpoint_serves():
    endpoint = PrometheusEndpoint({"port": 0, "addr": "127.0.0.1", "linger_s": 0.0}, dict.fromkeys(RUN_LABELS, "x"))
    served = {family.name for family in endpoint.registry.collect()}
    used = {name for rule in rules() for name in re.findall(r"\bnemo_throughput_\w+", rule["expr"])}
    assert used and used <= served, used - served


def test_the_rules_ship_in_the_package_beside_the_dashboard():
    packaged = importlib.resources.files("nemo_throughput") / "launchers" / "prometheus" / RULES.name
    assert packaged.is_file() and packaged.read_text() == RULES.read_text()
    assert (importlib.resources.files("nemo_throughput") / "launchers" / "grafana" / "nemo-throughput.json").is_file()
