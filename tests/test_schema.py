"""The summary schema: shipped in the package, a valid JSON Schema whose every field is described,
the one identity the writer and the reader use, met by every route's summary, and the report's
explanation of a summary that breaks it."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest
from test_report import write_run

from nemo_throughput.aggregation import steps_tensor
from nemo_throughput.run_stats import RunStats
from nemo_throughput.flops import ModelSpec
from nemo_throughput.report.runs import ReportError, load_run
from nemo_throughput.schemas import (
    MAX_PROBLEMS,
    SUMMARY_SCHEMA_FILE,
    SUMMARY_SCHEMA_ID,
    load_summary_schema,
    validate_summary,
)
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.summary import SCHEMA, LogTiming, ResultRate, build_summary, write_json_atomic
from nemo_throughput.timing import StepTimes

REPO = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=256)
ONLY_SOME_ROUTES = {"time_to_train": "imported MLPerf results", "end": "final summaries, added by the run's end"}


def facts(**changes) -> RunFacts:
    values = dict(name="run", label="bare-metal", global_batch_size=16, micro_batch_size=1, seq_length=128,
                  model_name="gpt", model_spec=SPEC, flops_formula="megatron", flops_per_sample=1e9,
                  gpu_name="NVIDIA H100 80GB HBM3", num_gpus=2, num_nodes=1, dtype="bf16", peak_tflops=989.5,
                  peak_source="table:H100 SXM", places=[{"rank": r, "host": "node-0", "gpu_index": r} for r in (0, 1)],
                  steps_jsonl={"path": "steps.jsonl", "complete": True, "error": None})
    return RunFacts(**(values | changes))


def measured_stats() -> RunStats:
    stats = RunStats(world_size=2, warmup_steps=0)
    stats.add(steps_tensor([[StepTimes(i + 1, 1.0, data_s=0.01, forward_s=0.3, backward_s=0.6, optimizer_s=0.05)
                             for i in range(3)],
                            [StepTimes(i + 1, 1.0, data_s=0.02, forward_s=0.35, backward_s=0.55, optimizer_s=0.05)
                             for i in range(3)]]))
    return stats


def described(schema, path="(schema)"):
    """(path, node) of every property definition in the schema, nested ones included."""
    for name, node in schema.get("properties", {}).items():
        yield f"{path}.{name}", node
        yield from described(node, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from described(schema[key], f"{path}[]")


def test_the_schema_is_a_valid_json_schema_with_one_identity():
    schema = load_summary_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == schema["properties"]["schema"]["const"] == SUMMARY_SCHEMA_ID == SCHEMA


def test_every_field_is_described():
    undescribed = [path for path, node in described(load_summary_schema()) if not node.get("description")]
    assert not undescribed


def test_the_wheel_ships_the_schema(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("nemo_throughput-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = json.loads(archive.read(f"nemo_throughput/schemas/{SUMMARY_SCHEMA_FILE}"))
    assert shipped == load_summary_schema()


def test_a_callback_summary_has_every_field_the_schema_describes():
    section = {"note": "collected"}
    summary = build_summary(facts(), measured_stats(), "completed",
                            explained={"telemetry": section, "communication": section, "network": section,
                                       "probe": section}, stalls=[],
                            time_to_target={"status": "target_reached", "seconds": 3.0, "step": 3, "metric": "loss",
                                            "value": 0.9, "target": 1.0, "mode": "min"})
    assert validate_summary(summary) == []
    schema = load_summary_schema()
    assert set(summary) == set(schema["properties"]) - set(ONLY_SOME_ROUTES)
    for name in ("run", "throughput", "batch", "model", "hardware"):
        # rate_source: MLPerf imports; measured_flops: flops_formula measured; flops_crosscheck: imported logs
        assert set(summary[name]) >= (set(schema["properties"][name]["properties"])
                                      - {"rate_source", "measured_flops", "flops_crosscheck"})


def test_the_peak_is_written_once():
    summary = build_summary(facts(), measured_stats(), "completed")
    assert summary["hardware"]["peak_tflops"] == 989.5 and summary["hardware"]["peak_source"] == "table:H100 SXM"
    assert summary["model"]["mfu_convention"] == {"formula": "megatron", "causal_attention": "half"}


def test_an_imported_log_summary_is_built_whole():
    timing = LogTiming(window="2:", steps=[[1, 1.5], [2, 1.0], [3, 1.0]],
                       excluded_step_times={"count": 0, "steps": []})
    summary = build_summary(facts(source="import:nemo", places=[], steps_jsonl=None), measured_stats(), "completed",
                            log_timing=timing)
    assert validate_summary(summary) == []
    assert summary["timing"]["window"] == "2:" and summary["timing"]["steps"] == timing.steps
    # one rank's view of the run: no per-rank figures, no straggler
    assert [summary["timing"][name] for name in ("per_rank_step_time_s", "per_rank_local_time_s", "slowest_rank",
                                                 "straggler")] == [None] * 4


@pytest.mark.parametrize("bad", [["5001", 1.0], [True, 1.0], [5001, None], [5001], [5001, 1.0, 2.0], {"step": 5001},
                                 None, [[5001], 1.0], [5001, "1.5"], [5001.0, 1.5], [5001.5, 1.5]])
def test_a_long_list_of_imported_steps_is_judged_as_item_by_item(bad):
    """A million-step log's timing.steps validated item by item took 40 s in report: an item of a type-only
    schema is valid or not by its values' JSON types, so one of each shape is checked. Whatever the
    bad item, the problems said are those of the whole list validated item by item, at its index."""
    steps = [[step, 1.0 + step % 7 / 10] for step in range(1, 10_001)]
    steps[5000] = bad
    timing = LogTiming(window="2:", steps=steps, excluded_step_times={"count": 0, "steps": []})
    summary = build_summary(facts(source="import:nemo", places=[], steps_jsonl=None), measured_stats(), "completed",
                            log_timing=timing)
    validator = jsonschema.Draft202012Validator(load_summary_schema())
    expected = sorted(f"timing.steps[5000]{''.join(f'[{p}]' for p in list(e.absolute_path)[3:])}: "
                      for e in validator.iter_errors(summary))
    assert sorted(problem[:problem.index(": ") + 2] for problem in validate_summary(summary)) == expected
    assert (validate_summary(summary) == []) == (bad in ([5001.0, 1.5],))  # an integral float is an integer


def test_an_imported_result_summary_is_built_whole():
    result = facts(global_batch_size=None, seq_length=None, rate="samples", model_spec=None, flops_formula=None,
                   flops_per_sample=None, dtype=None, peak_tflops=None, peak_source=None, source="import:mlperf")
    summary = build_summary(result, RunStats(world_size=1, warmup_steps=0), "completed",
                            result_rate=ResultRate(123.0, "log:tracked_stats.throughput"),
                            time_to_train={"benchmark": "bert", "minutes": 10.0})
    assert validate_summary(summary) == []
    assert summary["batch"]["global_batch_size"] is None and summary["model"]["flops_formula"] is None
    assert summary["throughput"]["samples_per_s"] == 123.0
    assert summary["throughput"]["rate_source"] == "log:tracked_stats.throughput"
    assert summary["time_to_train"] == {"benchmark": "bert", "minutes": 10.0}


def test_problems_name_the_field_and_what_was_expected():
    summary = build_summary(facts(), measured_stats(), "completed")
    summary["timing"]["step_time_s"]["mean"] = "fast"
    summary["hardware"]["dtype"] = "bf17"
    del summary["run"]["name"]
    assert validate_summary(summary) == [
        "run: missing 'name'",
        "hardware.dtype: 'bf17' is not one of ['fp4', 'fp8', 'bf16', 'fp16', 'tf32', 'fp32', None]",
        "timing.step_time_s.mean: 'fast' is not of type 'number'",
    ]


def test_problems_are_a_few_lines_at_most():
    summary = build_summary(facts(), measured_stats(), "completed")
    for name in summary["throughput"]:
        summary["throughput"][name] = "x"
    problems = validate_summary(summary)
    assert len(problems) == MAX_PROBLEMS + 1 and problems[-1].startswith("... and ")


@pytest.mark.invalid_summaries  # broken on purpose
def test_report_leaves_out_a_summary_that_breaks_the_schema_naming_the_field(tmp_path):
    path = write_run(tmp_path / "a" / "summary.json", label="x", step_times=[1.0, 1.0])
    summary = json.loads(path.read_text())
    summary["run"]["started_at"] = 1700000000  # a field the report itself does not read
    write_json_atomic(path, summary)
    with pytest.raises(ReportError) as raised:
        load_run(path)
    assert str(raised.value).splitlines() == [f"{path}: not a valid {SUMMARY_SCHEMA_ID} summary:",
                                              "  run.started_at: 1700000000 is not of type 'string'"]
