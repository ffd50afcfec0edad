"""Goodput per run in a report: where each run's wall-clock time went, across its segments."""

from __future__ import annotations

from typing import Any

from nemo_throughput.goodput.ledger import CATEGORIES

GOODPUT_FIELDS = ("run_id", "segments", "steps_last", "steps_lost", "wall_h", "goodput_pct",
                  *(f"{category}_h" for category in CATEGORIES))


def latest_per_run(sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's goodput as its latest segment's summary has it (a later segment's holds the earlier
    ones), in the order the runs were first seen."""
    latest: dict[str, dict[str, Any]] = {}
    for section in sections:
        held = latest.get(section["run_id"])
        if held is None or section.get("segment", 1) > held.get("segment", 1):
            latest[section["run_id"]] = section
    return list(latest.values())


def goodput_records(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per run: GOODPUT_FIELDS, hours."""
    return [{"run_id": run["run_id"], "segments": len(run["segments"]), "steps_last": run["steps"]["last"],
             "steps_lost": run["steps"]["lost"], "wall_h": run["wall_s"] / 3600, "goodput_pct": run["goodput_pct"],
             **{f"{category}_h": run["seconds"].get(category, 0.0) / 3600 for category in CATEGORIES}}
            for run in runs]
