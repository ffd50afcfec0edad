"""`nemo-throughput report` on summaries that explain their numbers (issue 12): the columns,
the step-time and probe tables, grouping by network, the breakdown plot; and summaries from
before that report exactly as they did."""

import csv
import io
import json
import statistics
from pathlib import Path

import pytest

from nemo_throughput.aggregation import steps_tensor
from nemo_throughput.run_stats import RunStats
from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.rendering import render
from nemo_throughput.report.runs import ReportError, load_run
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.summary import build_summary
from nemo_throughput.timing import StepTimes

SMALL = ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=2048, vocab_size=51200)
OLD_OUTPUTS = Path(__file__).parent / "data" / "report" / "old-outputs.json"  # the report before issue 12
NEW_SECTIONS = ("telemetry", "communication", "network", "probe")
MiB = 1024 ** 2


def real_summary(label: str, nodes: int = 1, step_s: float = 1.0, peak: float | None = 989.5) -> dict:
    """A summary through the real RunFacts/RunStats/build_summary path: two ranks, with phases."""
    facts = RunFacts(name=label, label=label, global_batch_size=64 * nodes, micro_batch_size=1, seq_length=2048,
                     model_name="gpt3-126m", model_spec=SMALL, flops_formula="megatron",
                     flops_per_sample=model_flops_per_sample(SMALL), gpu_name="NVIDIA H100 80GB HBM3",
                     num_gpus=8 * nodes, num_nodes=nodes, dtype="bf16", peak_tflops=peak,
                     peak_source="table:H100 SXM")
    stats = RunStats(world_size=2, warmup_steps=0)
    stats.add(steps_tensor([[StepTimes(i + 1, step_s, data_s=0.01, forward_s=0.3 * step_s, backward_s=0.6 * step_s,
                                       optimizer_s=0.05) for i in range(3)],
                            [StepTimes(i + 1, step_s, data_s=0.02, forward_s=0.25 * step_s, backward_s=0.65 * step_s,
                                       optimizer_s=0.05) for i in range(3)]]))
    return build_summary(facts, stats, "completed")


def old_summary(label: str, nodes: int = 1, step_s: float = 1.0, peak: float | None = 989.5) -> dict:
    """As the version before issue 12 wrote it: no explaining sections, a straggler without host."""
    summary = real_summary(label, nodes, step_s, peak)
    for name in NEW_SECTIONS:
        summary.pop(name, None)
    straggler = summary["timing"]["straggler"]
    summary["timing"]["straggler"] = {name: straggler[name] for name in ("rank", "metric", "excess_pct")}
    return summary


def place(rank: int, host: str = "node-0") -> dict:
    return {"rank": rank, "host": host, "gpu_index": rank % 8}


def stat(minimum: float, median: float, maximum: float) -> dict:
    """A STAT of SPEC12: min / median / max over ranks, with where the extremes are."""
    return {"min": minimum, "median": median, "max": maximum, "min_at": place(0), "max_at": place(1)}


def telemetry(*, reserved_gib: float, allocated_gib: float, sm_mhz: float, power_w: float,
              joules_per_token: float | None) -> dict:
    return {
        "sources": {"memory": "torch.cuda.memory_stats", "nvml": "nvidia-ml-py 13.580"},
        "memory": {"peak_allocated_gib": stat(allocated_gib - 1, allocated_gib - 0.5, allocated_gib),
                   "peak_reserved_gib": stat(reserved_gib - 2, reserved_gib - 1, reserved_gib),
                   "alloc_retries": stat(0, 0, 0), "ooms": stat(0, 0, 0), "near_oom_ranks": []},
        "device": {"sm_clock_mhz": stat(sm_mhz - 100, sm_mhz, sm_mhz + 50), "mem_clock_mhz": stat(2619, 2619, 2619),
                   "power_w": stat(power_w - 50, power_w, power_w + 40), "temperature_c": stat(50, 55, 61),
                   "throttle_reasons": {}},
        "energy": {"joules": 1e6, "steps": 100, "joules_per_step": 1e4, "joules_per_token": joules_per_token,
                   "tokens_per_kwh": None if joules_per_token is None else 3.6e6 / joules_per_token, "ranks": 16},
    }


def communication(compute: float, communication_share: float, exposed: float, idle: float) -> dict:
    return {"window": {"first_step": 20, "last_step": 24, "mode": "torch"},
            "per_rank": [{**place(0), "window_s": 5.0, "compute_s": 5 * compute,
                          "communication_s": 5 * communication_share, "exposed_communication_s": 5 * exposed,
                          "idle_s": 5 * idle}],
            "fractions": {"compute": compute, "communication": communication_share,
                          "exposed_communication": exposed, "idle": idle},
            "traces": []}


def network(label: str | None) -> dict:
    transport = {"RDMA": "IB", "IPoIB": "Socket", "TCP": "Socket", None: None}[label]
    return {"backend": "nccl", "nccl_version": "2.21.5", "env": {"NCCL_IB_HCA": "mlx5"}, "transport": transport,
            "interface": "ib0", "transport_source": "env", "label": label}


def probe(busbw: dict[tuple[str, int], float]) -> dict:
    return {"backend": "nccl", "world_size": 16, "device": "cuda",
            "collectives": [{"op": op, "bytes": size, "time_us": 100.0, "algbw_gbps": value / 2,
                             "busbw_gbps": value} for (op, size), value in busbw.items()],
            "matmul_tflops": {"per_rank": [700.0, 710.0], "median": 705.0}, "flagged_ranks": []}


def straggler(summary: dict, rank: int, host: str, excess_pct: float) -> dict:
    summary["timing"]["straggler"].update(rank=rank, host=host, gpu_index=rank % 8, excess_pct=excess_pct,
                                          spread_s={"min": 0.2, "median": 0.25, "max": 0.3}, wait_s=0.05)
    return summary


def new_summary(label: str, nodes: int = 1, step_s: float = 1.0, **sections) -> dict:
    """A summary of this version: the explaining sections as SPEC12 gives them (None unless given)."""
    summary = real_summary(label, nodes, step_s)
    summary.update({name: sections.get(name) for name in NEW_SECTIONS})
    return summary


def write(tmp_path: Path, name: str, summary: dict) -> Path:
    """The summary as a file; NaN and Infinity written as Python's json does (a broken writer)."""
    path = tmp_path / name / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return path


def report_of(tmp_path: Path, summaries: dict[str, dict], **options):
    return build_report([load_run(write(tmp_path, name, s)) for name, s in summaries.items()], **options)


def cli(*args, capsys) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def csv_sections(text: str) -> list[list[dict]]:
    """The CSV's sections (separated by an empty line), each as dicts by its header."""
    return [list(csv.DictReader(io.StringIO(part))) for part in text.split("\n\n")]


# ------------------------------------------------------------------------------- older summaries
def old_campaign(tmp_path: Path) -> list[Path]:
    """The runs whose report before issue 12 is in tests/data/report/old-outputs.json."""
    runs = (("a1", "bare-metal", 1, 1.0, 989.5), ("a2", "bare-metal", 2, 1.05, 989.5),
            ("a2r", "bare-metal", 2, 1.07, 989.5), ("k1", "kubernetes", 1, 1.04, 989.5),
            ("k2", "kubernetes", 2, 1.1, None))
    return [write(tmp_path, name, old_summary(label, nodes, step, peak)) for name, label, nodes, step, peak in runs]


def test_older_summaries_give_exactly_the_old_output(tmp_path, capsys):
    paths = old_campaign(tmp_path)
    runs = [load_run(path) for path in paths]
    expected = json.loads(OLD_OUTPUTS.read_text())
    for baseline in (None, "bare-metal"):
        for fmt in ("table", "markdown", "csv", "json"):
            text = render(build_report(runs, baseline=baseline), fmt).replace(str(tmp_path), "<tmp>")
            assert text == expected[f"{fmt}-{baseline}"], (fmt, baseline)
    plot = tmp_path / "scaling.png"
    code, out, err = cli(*paths, "--plot", plot, capsys=capsys)
    assert code == 0 and out == expected["table-None"]
    assert plot.exists() and not (tmp_path / "scaling-breakdown.png").exists()
    assert "note:" not in err


def test_a_summary_of_this_version_without_telemetry_shows_its_phases_only(tmp_path):
    """What a CPU run writes now: every explaining section null, the phases timed."""
    report = report_of(tmp_path, {"a": new_summary("slurm")})
    assert report.shown == ()
    text = render(report, "table")
    group_header = text.splitlines()[0]
    assert group_header.endswith("days for 1T tokens")  # no new column
    assert "Where the step time goes" in text
    step_header = text.split("Where the step time goes")[1].split("\n\n")[1].splitlines()[0]
    assert step_header.split() == ["label", "model", "nodes", "GPUs", "step", "time", "s", "logging", "s", "data", "s",
                                   "forward", "s", "backward", "s", "optimizer", "s"]
    (row,) = json.loads(render(report, "json"))["step_time"]
    assert row["data_s"] == pytest.approx(0.015) and row["forward_s"] == pytest.approx(0.275)
    assert row["compute_share"] is None and "probe" not in json.loads(render(report, "json"))


# ------------------------------------------------------------------------------- the new columns
def explained(label: str, *, comm: float, exposed: float, reserved: float, sm: float, power: float,
              jpt: float | None, busbw: float, host: str, excess: float, net: str = "RDMA", step_s: float = 1.0,
              nodes: int = 1) -> dict:
    summary = new_summary(
        label, nodes, step_s, network=network(net),
        communication=communication(1 - exposed - 0.05, comm, exposed, 0.05),
        telemetry=telemetry(reserved_gib=reserved, allocated_gib=reserved - 6, sm_mhz=sm, power_w=power,
                            joules_per_token=jpt),
        probe=probe({("all_reduce", MiB): busbw / 4, ("all_reduce", 256 * MiB): busbw,
                     ("all_gather", 256 * MiB): busbw * 0.9}))
    return straggler(summary, rank=3, host=host, excess_pct=excess)


def test_explaining_values_become_columns_with_the_right_arithmetic(tmp_path):
    report = report_of(tmp_path, {
        "r1": explained("bare-metal", comm=0.30, exposed=0.10, reserved=70.0, sm=1980, power=650, jpt=0.04,
                        busbw=180.0, host="node-a", excess=5.0),
        "r2": explained("bare-metal", comm=0.20, exposed=0.06, reserved=72.5, sm=1900, power=610, jpt=0.05,
                        busbw=170.0, host="node-b", excess=12.5, step_s=1.02),
    })
    (group,) = report.groups
    assert group.runs == 2 and group.network == "RDMA"
    assert group.communication_share == pytest.approx(0.25)  # mean over the repeats
    assert group.exposed_communication_share == pytest.approx(0.08)
    assert group.memory_peak_reserved_gib == 72.5  # max over ranks, then over repeats
    assert group.memory_peak_allocated_gib == 66.5
    assert group.sm_clock_mhz == pytest.approx(1940)  # median over ranks, mean over repeats
    assert group.power_w == pytest.approx(630)
    assert group.joules_per_token == pytest.approx(0.045)
    assert (group.probe_all_reduce_busbw_gbps, group.probe_all_reduce_bytes) == (pytest.approx(175.0), 256 * MiB)
    assert (group.straggler_rank, group.straggler_host, group.straggler_excess_pct) == (3, "node-b", 12.5)

    header, _, row = render(report, "table").splitlines()[:3]
    for title in ("network", "communication %", "exposed comm. %", "peak memory GiB", "SM clock MHz", "power W",
                  "J/token", "all_reduce busbw GB/s @ 256 MiB", "slowest rank"):
        assert title in header
    for cell in ("RDMA", "25.0 %", "8.0 %", "72.5", "1,940", "630", "0.045", "175.0", "3@node-b +12.5 %"):
        assert cell in row
    data = json.loads(render(report, "json"))
    assert data["groups"][0]["communication_share"] == pytest.approx(0.25)
    assert data["groups"][0]["straggler_host"] == "node-b"
    assert "probe_busbw_gbps" not in data["groups"][0]  # the probe has its own table
    groups_csv = csv_sections(render(report, "csv"))[0]
    assert float(groups_csv[0]["joules_per_token"]) == pytest.approx(0.045)
    assert groups_csv[0]["network"] == "RDMA"
    markdown = render(report, "markdown").splitlines()[0]
    assert markdown.startswith("| label | network | model |") and "| slowest rank |" in markdown


def test_partly_present_data_is_missing_never_zero(tmp_path):
    """One repeat with telemetry, one without: the configuration has no value; another has one."""
    full = dict(comm=0.3, exposed=0.1, reserved=70.0, sm=1980, power=650, jpt=0.04, busbw=180.0, host="n",
                excess=5.0)
    report = report_of(tmp_path, {
        "with": explained("slurm", **full),
        "without": new_summary("slurm"),
        "other": explained("k8s", **full, net="TCP"),
    })
    partial, complete = sorted(report.groups, key=lambda g: g.label != "slurm")
    for name in ("communication_share", "memory_peak_reserved_gib", "sm_clock_mhz", "power_w", "joules_per_token",
                 "probe_all_reduce_busbw_gbps", "straggler_rank", "compute_share"):
        assert getattr(partial, name) is None, name
        assert getattr(complete, name) is not None, name
    assert partial.network == "mixed (RDMA, unknown)"
    assert report.notes and "differ in network (RDMA, unknown)" in report.notes[0]

    table = render(report, "table")
    row = next(line for line in table.splitlines() if line.startswith("slurm"))
    assert row.split("88.30")[1].split() == ["n/a"] * 8  # every explaining column after the days to train
    data = json.loads(render(report, "json"))
    slurm = next(g for g in data["groups"] if g["label"] == "slurm")
    assert slurm["joules_per_token"] is None and slurm["power_w"] is None
    slurm_csv = next(r for r in csv_sections(render(report, "csv"))[0] if r["label"] == "slurm")
    assert slurm_csv["joules_per_token"] == "" and slurm_csv["communication_share"] == ""
    step_time = {r["label"]: r for r in data["step_time"]}
    assert step_time["slurm"]["compute_share"] is None and step_time["k8s"]["compute_share"] == pytest.approx(0.85)
    assert step_time["slurm"]["data_s"] == pytest.approx(0.015)  # phases: every run has them
    probe_cells = {(r["label"], r["op"], r["bytes"]): r["busbw_gbps"] for r in data["probe"]}
    assert probe_cells[("slurm", "all_reduce", 256 * MiB)] is None
    assert probe_cells[("k8s", "all_reduce", 256 * MiB)] == 180.0


def test_a_column_no_run_has_is_not_shown(tmp_path):
    summary = new_summary("slurm", telemetry=telemetry(reserved_gib=70, allocated_gib=60, sm_mhz=1980, power_w=650,
                                                       joules_per_token=None))
    report = report_of(tmp_path, {"a": summary})
    header = render(report, "table").splitlines()[0]
    assert "peak memory GiB" in header and "power W" in header
    for absent in ("J/token", "communication %", "network", "busbw", "slowest rank"):
        assert absent not in header
    assert set(json.loads(render(report, "json"))["groups"][0]) >= {"memory_peak_reserved_gib", "power_w"}
    assert "joules_per_token" not in json.loads(render(report, "json"))["groups"][0]


def test_the_step_time_table_per_configuration(tmp_path):
    report = report_of(tmp_path, {
        "one": new_summary("rdma", communication=communication(0.70, 0.35, 0.20, 0.10)),
        "two": new_summary("rdma", 2, 1.2, communication=communication(0.60, 0.40, 0.30, 0.10)),
    })
    text = render(report, "table")
    title, table = text.split("Where the step time goes")[1].split("\n\n", 2)[:2]
    assert "compute + exposed communication +\nidle = 100 %" in title
    lines = table.splitlines()
    assert lines[0].split("  ")[0] == "label"
    for title_cell in ("compute %", "communication %", "exposed comm. %", "idle %", "data s", "forward s",
                       "backward s", "optimizer s"):
        assert title_cell in lines[0]
    assert "70.0 %" in lines[2] and "35.0 %" in lines[2] and "20.0 %" in lines[2] and "10.0 %" in lines[2]
    assert "1.200" in lines[3] and "60.0 %" in lines[3] and "0.330" in lines[3]  # forward (0.3 + 0.25) / 2 x 1.2 s
    sections = csv_sections(render(report, "csv"))
    step_time = sections[1]
    assert [float(r["compute_share"]) + float(r["exposed_communication_share"]) + float(r["idle_share"])
            for r in step_time] == [pytest.approx(1.0)] * 2
    assert float(step_time[1]["backward_s"]) == pytest.approx(statistics.fmean([0.6 * 1.2, 0.65 * 1.2]))


# ---------------------------------------------------------------------------- probe and network
def test_the_probe_table_compares_busbw_across_runs(tmp_path):
    report = report_of(tmp_path, {
        "bm": new_summary("bare-metal", 2, network=network("RDMA"),
                          probe=probe({("all_reduce", MiB): 40.0, ("all_reduce", 256 * MiB): 185.5,
                                       ("sendrecv", 256 * MiB): 45.0, ("all_gather", 256 * MiB): 170.0})),
        "k8s": new_summary("kubernetes", 2, network=network("TCP"),
                           probe=probe({("all_reduce", MiB): 2.0, ("all_reduce", 256 * MiB): 11.25,
                                        ("all_gather", 256 * MiB): 10.0})),
    })
    text = render(report, "table")
    probe_table = text.split("Start-up fabric probe")[1].split("\n\n")[1].splitlines()
    assert probe_table[0].split()[:2] == ["collective", "size"]
    assert "bare-metal 16 GPUs" in probe_table[0] and "kubernetes 16 GPUs" in probe_table[0]
    rows = [line.split() for line in probe_table[2:]]
    assert rows == [["all_reduce", "1", "MiB", "40.0", "2.0"], ["all_reduce", "256", "MiB", "185.5", "11.2"],
                    ["all_gather", "256", "MiB", "170.0", "10.0"], ["sendrecv", "256", "MiB", "45.0", "n/a"]]
    header = text.splitlines()[0]
    assert "all_reduce busbw GB/s @ 256 MiB" in header
    records = json.loads(render(report, "json"))["probe"]
    assert {"op": "sendrecv", "bytes": 256 * MiB, "label": "kubernetes", "model": "gpt3-126m", "num_nodes": 2,
            "num_gpus": 16, "busbw_gbps": None} in records
    assert len(records) == 4 * 2
    probe_csv = csv_sections(render(report, "csv"))[-1]
    assert list(probe_csv[0]) == ["op", "bytes", "label", "model", "num_nodes", "num_gpus", "busbw_gbps"]


def test_probe_sizes_that_differ_are_named_in_each_cell(tmp_path):
    report = report_of(tmp_path, {
        "a": new_summary("a", probe=probe({("all_reduce", 64 * MiB): 100.0})),
        "b": new_summary("b", probe=probe({("all_reduce", 1024 * MiB): 190.0})),
    })
    lines = render(report, "table").splitlines()
    assert "all_reduce busbw GB/s" in lines[0] and "@" not in lines[0]
    assert "100.0 @ 64 MiB" in lines[2] and "190.0 @ 1 GiB" in lines[3]


def campaign_over_networks(tmp_path: Path) -> list[Path]:
    """Two environments, each over two fabrics, at one and two nodes."""
    runs = (("bm-rdma-1", "bare-metal", "RDMA", 1, 1.00), ("bm-rdma-2", "bare-metal", "RDMA", 2, 1.04),
            ("k8s-rdma-1", "kubernetes", "RDMA", 1, 1.01), ("k8s-tcp-2", "kubernetes", "TCP", 2, 1.50),
            ("bm-ipoib-2", "bare-metal-ipoib", "IPoIB", 2, 1.20))
    return [write(tmp_path, name, new_summary(label, nodes, step, network=network(net)))
            for name, label, net, nodes, step in runs]


def test_group_by_network(tmp_path, capsys):
    paths = campaign_over_networks(tmp_path)
    code, out, _ = cli(*paths, "--format", "json", capsys=capsys)
    assert code == 0
    by_label = {(g["label"], g["num_nodes"]): g["network"] for g in json.loads(out)["groups"]}
    assert by_label == {("bare-metal", 1): "RDMA", ("bare-metal", 2): "RDMA", ("kubernetes", 1): "RDMA",
                        ("kubernetes", 2): "TCP", ("bare-metal-ipoib", 2): "IPoIB"}  # labels as given
    code, out, _ = cli(*paths, "--group-by", "network", "--baseline", "RDMA", "--format", "json", capsys=capsys)
    assert code == 0
    data = json.loads(out)
    assert data["group_by"] == "network"
    groups = {(g["label"], g["num_nodes"]): g for g in data["groups"]}
    assert set(groups) == {("RDMA", 1), ("RDMA", 2), ("TCP", 2), ("IPoIB", 2)}
    assert groups[("RDMA", 1)]["runs"] == 2  # bare-metal and kubernetes over RDMA at one node
    diffs = {c["other"]: c["diff_pct"] for c in data["comparisons"]}
    assert diffs == {"IPoIB": pytest.approx(100 * (1 - 1.04 / 1.20)), "TCP": pytest.approx(100 * (1 - 1.04 / 1.50))}
    code, out, _ = cli(*paths, "--group-by", "network", capsys=capsys)
    assert out.splitlines()[0].startswith("network  ") and out.count("RDMA") >= 2
    code, _, err = cli(*paths, "--group-by", "network", "--baseline", "bare-metal", capsys=capsys)
    assert code == 2 and "--baseline 'bare-metal' is not a network label of these runs" in err


def test_runs_without_a_network_label_group_as_unknown(tmp_path):
    report = report_of(tmp_path, {"a": new_summary("a", network=network("RDMA")), "b": old_summary("b")},
                       group_by="network")
    assert sorted(g.label for g in report.groups) == ["RDMA", "unknown"]


# ---------------------------------------------------------------------------------------- plots
def test_the_breakdown_plot_is_written_beside_the_scaling_plot(tmp_path, capsys):
    paths = [write(tmp_path, "a", new_summary("rdma", communication=communication(0.7, 0.35, 0.2, 0.1))),
             write(tmp_path, "b", new_summary("tcp", 2))]  # phases only: drawn as n/a in the shares panel
    plot = tmp_path / "scaling.png"
    code, _, err = cli(*paths, "--plot", plot, capsys=capsys)
    breakdown = tmp_path / "scaling-breakdown.png"
    assert code == 0 and f"plot: {breakdown}" in err
    assert breakdown.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "scaling.svg"
    assert cli(*paths, "--plot", svg, capsys=capsys)[0] == 0
    drawn = (tmp_path / "scaling-breakdown.svg").read_text()
    assert "n/a (not profiled)" in drawn and "exposed communication" in drawn


def test_the_breakdown_plot_never_overwrites_the_output(tmp_path, capsys):
    path = write(tmp_path, "a", new_summary("x"))
    code, _, err = cli(path, "--plot", tmp_path / "p.png", "--output", tmp_path / "p-breakdown.png", capsys=capsys)
    assert code == 2 and "--output and --plot's step-time breakdown are the same file" in err
    assert not (tmp_path / "p.png").exists()


# -------------------------------------------------------------------------------- hostile text
def test_new_text_cells_are_printed_safely(tmp_path):
    hostile = "=cmd|x\x1b[31m\u202e"
    summary = straggler(new_summary("slurm", network=network("RDMA"),
                                    probe=probe({("all_reduce", MiB): 10.0})), rank=1, host=hostile, excess_pct=3.0)
    summary["network"]["label"] = "-TCP|\x1b]0;title\x07"
    report = report_of(tmp_path, {"a": summary})
    table = render(report, "table")
    assert "\x1b" not in table and "\u202e" not in table and "\x07" not in table
    assert "1@=cmd|x +3.0 %" in table and "-TCP|" in table
    assert "-TCP\\|" in render(report, "markdown") and "=cmd\\|x" in render(report, "markdown")
    groups_csv = csv_sections(render(report, "csv"))[0][0]
    assert groups_csv["network"] == "'-TCP|" and groups_csv["straggler_host"] == "'=cmd|x"
    assert json.loads(render(report, "json"))["groups"][0]["straggler_host"] == hostile  # exact, escaped
    by_network = report_of(tmp_path, {"a": summary}, group_by="network")
    probe_header = render(by_network, "table").split("Start-up fabric probe")[1].split("\n\n")[1].splitlines()[0]
    assert "\x1b" not in probe_header and "-TCP|" in probe_header
    assert "-TCP\\|" in render(by_network, "markdown").split("Start-up fabric probe")[1]


# ------------------------------------------------------------------------------ checked fields
@pytest.mark.parametrize("section, value, message", [
    ("communication", {"fractions": {"compute": "0.7"}}, r"communication.fractions.compute is '0.7'; it must be a "
                                                         r"finite number >= 0 or null"),
    ("communication", {"fractions": {"idle": -0.1}}, r"communication.fractions.idle is -0.1"),
    ("communication", [], r"communication is \[\]; it must be an object or null"),
    ("telemetry", {"device": {"power_w": {"median": float("nan")}}}, r"telemetry.device.power_w.median is nan"),
    ("telemetry", {"energy": {"joules_per_token": float("inf")}}, r"telemetry.energy.joules_per_token is inf"),
    ("network", {"label": 5}, r"network.label is 5; it must be a non-empty string or null"),
    ("probe", {"collectives": {}}, r"probe.collectives is \{\}; it must be a list"),
    ("probe", {"collectives": [{"op": "all_reduce", "bytes": 0, "busbw_gbps": 1.0}]},
     r"probe.collectives\[0\].bytes is 0; it must be an integer >= 1"),
    ("probe", {"collectives": [{"op": "all_reduce", "bytes": 8, "busbw_gbps": None}]},
     r"probe.collectives\[0\].busbw_gbps is None"),
    ("probe", {"collectives": [{"op": "", "bytes": 8, "busbw_gbps": 1.0}]}, r"probe.collectives\[0\].op is ''"),
    ("probe", {"collectives": [{"op": "all_reduce", "bytes": 8, "busbw_gbps": 1.0}] * 2},
     r"probe.collectives\[1\] is .*; all_reduce at 8 bytes is listed twice; keep one"),
])
@pytest.mark.invalid_summaries  # broken on purpose: the report's own checks are the subject
def test_every_explaining_field_used_is_checked(tmp_path, section, value, message):
    path = write(tmp_path, "bad", new_summary("x", **{section: value}))
    with pytest.raises(ReportError, match=f"bad/summary.json: {message}"):
        load_run(path)


@pytest.mark.parametrize("straggler_fields, message", [
    ({"rank": -1}, r"timing.straggler.rank is -1; it must be an integer >= 0"),
    ({"gpu_index": "0"}, r"timing.straggler.gpu_index is '0'"),
    ({"excess_pct": None}, r"timing.straggler.excess_pct is None; it must be a finite number"),
    ({"host": 7}, r"timing.straggler.host is 7; it must be a string or null"),
])
@pytest.mark.invalid_summaries  # broken on purpose: the report's own checks are the subject
def test_the_straggler_fields_are_checked(tmp_path, straggler_fields, message):
    summary = straggler(new_summary("x"), rank=1, host="node-1", excess_pct=4.0)
    summary["timing"]["straggler"].update(straggler_fields)
    with pytest.raises(ReportError, match=message):
        load_run(write(tmp_path, "bad", summary))
