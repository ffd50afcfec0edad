"""A run resumed from its checkpoints is one run in `report` and `compare` (report.segments), runs
measured after different warm-ups are named, and `report --baseline` says how many runs each side
averaged. Segments are written as the callback writes them: RunGoodput joins each to the run it
continues (by the checkpoint's state), and build_summary writes its goodput section."""

import json
import shutil
from pathlib import Path

import pytest

from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.goodput.ledger import DATA
from nemo_throughput.goodput.run import RunGoodput
from nemo_throughput.hardware import resolve_peak
from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.runs import ReportError, load_run
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.run_stats import RunStats, rank_rows
from nemo_throughput.summary import build_summary, write_json_atomic
from nemo_throughput.timing import StepTimes

H100 = "NVIDIA H100 80GB HBM3"
GBS, SEQ = 128, 2048
MIXTRAL_LOG = Path(__file__).parent / "data" / "import" / "megatron_lm_mixtral_issue756.log"


def facts(name: str, label: str = "bm", gbs: int = GBS, gpus: int = 8) -> RunFacts:
    spec = ModelSpec(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=SEQ, vocab_size=51200)
    peak, source = resolve_peak(None, H100, "bf16")
    return RunFacts(name=name, label=label, global_batch_size=gbs, micro_batch_size=1, seq_length=SEQ,
                    model_name="gpt3-126m", model_spec=spec, flops_formula="megatron",
                    flops_per_sample=model_flops_per_sample(spec), gpu_name=H100, num_gpus=gpus, num_nodes=gpus // 8,
                    dtype="bf16", peak_tflops=peak, peak_source=source)


def write_segments(root: Path, segments: list[list[float]], warmup: int = 2, **options) -> list[Path]:
    """One run trained in segments (each list: a process's step times), each resumed from the
    checkpoint the one before saved at its last step; the summaries, as the callback writes them."""
    paths, state, step = [], None, 0
    for number, times in enumerate(segments, 1):
        out = root / f"segment-{number}"
        out.mkdir(parents=True)
        run_facts, goodput = facts(f"{root.name}-{number}", **options), RunGoodput(root, out)
        if state is not None:
            goodput.checkpoint_loaded(state)
        goodput.start(step, run_facts.run_id, env={})
        stats, rows = RunStats(world_size=1, warmup_steps=warmup, start_step=step), []
        for seconds in times:
            step += 1
            goodput.ledger.switch(DATA, step)
            rows.append(StepTimes(step, seconds))
        goodput.ledger.checkpoint(step)
        state = goodput.checkpoint_state()
        stats.add(rank_rows([rows]))
        section = goodput.section()
        goodput.ledger.close()
        paths.append(out / "summary.json")
        write_json_atomic(paths[-1], build_summary(run_facts, stats, "completed", goodput=section))
    return paths


def tokens_per_s(segments: list[list[float]], warmup: int = 2) -> float:
    """By hand: the tokens of every counted step (each segment's after its warm-up) over their time."""
    counted = [seconds for times in segments for seconds in times[warmup:]]
    return GBS * SEQ * len(counted) / sum(counted)


def cli(*args, capsys) -> tuple[int, str, str]:
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def edited(path: Path, edit) -> Path:
    summary = json.loads(path.read_text())
    edit(summary)
    path.write_text(json.dumps(summary))
    return path


RESUMED = [[1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [1.2, 1.2, 2.0, 2.0]]  # 4 and 2 counted steps, 1.0 s and 2.0 s


# ------------------------------------------------------------------------------- one resumed run
def test_a_resumed_run_is_one_run_its_tokens_over_all_its_counted_steps(tmp_path, capsys):
    """Before, the two segments were two repeats: mean of 1.0 s and 2.0 s steps, a spread out of one
    run. Now: one run, 6 counted steps in 8 s, beside one other run of the configuration."""
    segments = write_segments(tmp_path / "resumed", RESUMED)
    other = write_segments(tmp_path / "other", [[1.5] * 6])
    code, out, err = cli("report", tmp_path, "--format", "json", capsys=capsys)
    assert code == 0, err
    (group,) = json.loads(out)["groups"]
    joined = tokens_per_s(RESUMED)
    assert joined == pytest.approx(GBS * SEQ * 6 / 8.0)  # not the mean of the segments' rates
    assert group["runs"] == 2
    assert group["tokens_per_s"] == pytest.approx((joined + tokens_per_s([[1.5] * 6])) / 2)
    assert group["tokens_per_s_std"] == pytest.approx(abs(joined - tokens_per_s([[1.5] * 6])) / 2 ** 0.5)
    assert sorted(group["files"]) == sorted(map(str, [*segments, *other]))
    run_id = json.loads(segments[0].read_text())["run"]["id"]
    assert (f"2 summaries are segments of one resumed run {run_id} (goodput.run_id): counted as one run, its step "
            f"time over all 6 counted steps (segment 1: {segments[0]} (4 steps), 2: {segments[1]} (2 steps))") in err
    assert "warm-up" not in err  # every segment left out warmup_steps 2


def test_a_copied_segment_counts_once_and_the_run_is_still_one(tmp_path, capsys):
    segments = write_segments(tmp_path / "run", RESUMED)
    copy = tmp_path / "copy" / "summary.json"
    copy.parent.mkdir()
    shutil.copy(segments[1], copy)
    code, out, err = cli("report", tmp_path, "--format", "json", capsys=capsys)
    assert code == 0, err
    (group,) = json.loads(out)["groups"]
    assert group["runs"] == 1 and group["tokens_per_s"] == pytest.approx(tokens_per_s(RESUMED))
    assert "counted once" in err and "2 summaries are segments of one resumed run" in err


def test_a_segment_given_alone_is_a_run_and_a_missing_one_is_named(tmp_path, capsys):
    segments = write_segments(tmp_path / "run", [[1.0] * 4, [1.1] * 4, [1.2] * 4])
    (group,) = build_report([load_run(segments[1])]).groups
    assert group.runs == 1 and group.step_time_s == pytest.approx(1.1)
    report = build_report([load_run(path) for path in (segments[0], segments[2])])
    assert report.groups[0].runs == 1 and report.groups[0].step_time_s == pytest.approx(1.1)
    assert "segment(s) 2 not among them" in report.notes[0]


def test_summaries_without_goodput_are_never_joined(tmp_path):
    """Ranks other than 0 and imported runs have goodput null: they stay repeats, with no new note."""
    paths = write_segments(tmp_path / "run", RESUMED)
    for path in paths:
        edited(path, lambda summary: summary.update(goodput=None))
    report = build_report([load_run(path) for path in paths])
    assert report.groups[0].runs == 2 and report.notes == []


@pytest.mark.invalid_summaries
@pytest.mark.parametrize(("edit", "field"), [
    (lambda s: s["batch"].update(global_batch_size=256), "global batch"),
    (lambda s: s["hardware"].update(dtype="fp8"), "dtype"),
    (lambda s: s["run"].update(label="kubernetes"), "label"),
])
def test_segments_that_disagree_are_refused_naming_the_difference(tmp_path, capsys, edit, field):
    """A run's segments cannot change configuration or label: two runs claim one id, or a file was
    edited; nothing says which is right."""
    segments = write_segments(tmp_path / "run", RESUMED)
    edited(segments[1], edit)
    code, _, err = cli("report", tmp_path, capsys=capsys)
    assert code == 2
    assert "differ in " + field in err and str(segments[0]) in err and str(segments[1]) in err
    with pytest.raises(ReportError, match=field):
        build_report([load_run(path) for path in segments])


def test_another_run_claiming_the_run_s_id_is_refused(tmp_path, capsys):
    """Run b's second segment says it continues run a (its goodput.run_id): refused where the
    configurations differ, and as a second segment 2 where they agree."""
    a = write_segments(tmp_path / "a", RESUMED)
    b = write_segments(tmp_path / "b", RESUMED, gbs=256)
    a_id = json.loads(a[0].read_text())["run"]["id"]
    edited(b[1], lambda summary: summary["goodput"].update(run_id=a_id))
    with pytest.raises(ReportError, match="differ in global batch"):
        build_report([load_run(path) for path in (*a, b[1])])
    c = write_segments(tmp_path / "c", RESUMED)
    edited(c[1], lambda summary: summary["goodput"].update(run_id=a_id))
    code, _, err = cli("report", a[0], a[1], c[1], capsys=capsys)
    assert code == 2 and f"both say they are segment 2 of run {a_id}" in err
    assert str(a[1]) in err and str(c[1]) in err


@pytest.mark.invalid_summaries
@pytest.mark.parametrize(("edit", "message"), [
    (lambda g: g.pop("run_id"), "goodput.run_id is None; it must be the run's id"),
    (lambda g: g.update(run_id=""), "goodput.run_id is ''; it must be the run's id"),
    (lambda g: g.update(run_id=7), "goodput.run_id is 7; it must be the run's id"),
    (lambda g: g.update(run_id="x" * 100_000), "goodput.run_id is 'xxxxx"),
    (lambda g: g.update(run_id="a\x1b[31m"), "goodput.run_id is 'a\\x1b[31m'"),
    (lambda g: g.update(segment=0), "goodput.segment is 0; it must be an integer >= 1"),
    (lambda g: g.update(segment=-2), "goodput.segment is -2; it must be an integer >= 1"),
    (lambda g: g.update(segment=True), "goodput.segment is True; it must be an integer >= 1"),
    (lambda g: g.update(segment=1), "goodput.segment 1 and goodput.run_id"),
])
def test_a_segment_s_goodput_that_cannot_be_trusted_excludes_its_summary(tmp_path, capsys, edit, message):
    """The second segment's goodput edited: it is left out (exit 1), naming the field; the first
    segment is reported alone, and the message is one short line whatever the value's size."""
    segments = write_segments(tmp_path / "run", RESUMED)
    edited(segments[1], lambda summary: edit(summary["goodput"]))
    code, out, err = cli("report", tmp_path, "--format", "json", capsys=capsys)
    assert code == 1
    excluded = next(line for line in err.splitlines() if line.startswith(f"excluded: {segments[1]}"))
    assert message in excluded and len(excluded) < 500
    assert json.loads(out)["groups"][0]["runs"] == 1 and "segments of one resumed run" not in err


@pytest.mark.invalid_summaries
def test_a_first_segment_naming_another_run_is_excluded(tmp_path, capsys):
    (first,) = write_segments(tmp_path / "run", [[1.0] * 4])
    edited(first, lambda summary: summary["goodput"].update(run_id="someone-else"))
    with pytest.raises(ReportError, match="say it is the first segment of another run"):
        load_run(first)


# ------------------------------------------------------------------------------- compare
def test_compare_counts_a_resumed_run_once(tmp_path, capsys):
    base = tmp_path / "base"
    write_segments(base / "resumed", RESUMED)
    write_segments(base / "other", [[1.5] * 6])
    write_segments(tmp_path / "cand" / "one", [[1.4] * 6])
    write_segments(tmp_path / "cand" / "two", [[1.45] * 6])
    code, out, err = cli("compare", base, tmp_path / "cand", "--format", "json", capsys=capsys)
    assert code in (0, 1), err
    result = json.loads(out)
    tokens = next(m for m in result["metrics"] if m["metric"] == "tokens_per_s")
    assert (result["baseline"]["runs"], tokens["baseline_runs"], tokens["method"]) == (2, 2, "runs")
    assert len(result["baseline"]["files"]) == 3
    expected = (tokens_per_s(RESUMED) * tokens_per_s([[1.5] * 6])) ** 0.5  # the geometric mean of the two runs
    assert tokens["baseline_mean"] == pytest.approx(expected)
    assert "segments of one resumed run" in err


def test_compare_refuses_disagreeing_segments_and_notes_a_run_split_across_the_sides(tmp_path, capsys):
    segments = write_segments(tmp_path / "run", RESUMED)
    code, _, err = cli("compare", segments[0], segments[1], capsys=capsys)
    assert "1 run(s) are on both sides" in err and "segments of one resumed run" in err
    edited(segments[1], lambda summary: summary["hardware"].update(dtype="fp8"))
    code, _, err = cli("compare", tmp_path / "run", segments[0], capsys=capsys)
    assert code == 2 and "differ in dtype" in err


# ------------------------------------------------------------------------------- warm-up
def import_copy(tmp_path: Path, name: str, *options: str) -> Path:
    """The Mixtral log imported under another file name (so another run), with its own warm-up."""
    log = tmp_path / "logs" / f"{name}.log"
    log.parent.mkdir(exist_ok=True)
    shutil.copy(MIXTRAL_LOG, log)
    assert main(["import", str(log), "--label", "bm", "--output-dir", str(tmp_path / "runs"), "--model",
                 "mixtral-8x7b", "--seq-length", "4096", "--num-gpus", "16", "--gpu-name", H100, "--dtype", "bf16",
                 *options]) == 0
    return tmp_path / "runs" / name / "summary.json"


def test_runs_measured_after_different_warm_ups_are_named_not_refused(tmp_path, capsys):
    default = import_copy(tmp_path, "default")  # its log starts at step 43; --warmup 10: window 53:
    later = import_copy(tmp_path, "later", "--window", "63:")
    capsys.readouterr()
    code, out, err = cli("report", default, later, "--format", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["groups"][0]["runs"] == 2
    assert ("the runs left out different numbers of warm-up steps before the steps they count "
            f"({default}: 10 (window 53:); {later}: 20 (window 63:))") in err
    code, _, err = cli("compare", default, later, capsys=capsys)
    assert code in (0, 1) and f"{default}: 10 (window 53:); {later}: 20 (window 63:)" in err
    code, _, err = cli("report", default, later, "--window", "30:", capsys=capsys)
    assert code == 0 and "warm-up" not in err  # one window, chosen for both


def test_a_callback_run_s_warm_up_is_its_warmup_steps_and_segments_that_differ_are_said(tmp_path, capsys):
    short = write_segments(tmp_path / "short", [[1.0] * 6], warmup=1)
    long = write_segments(tmp_path / "long", [[1.0] * 6], warmup=3)
    report = build_report([load_run(path) for path in (*short, *long)])
    assert f"{short[0]}: 1 (warmup_steps 1); {long[0]}: 3 (warmup_steps 3)" in report.notes[0]
    resumed = write_segments(tmp_path / "resumed", RESUMED)
    edited(resumed[1], lambda summary: summary["timing"].update(warmup_steps=3))
    report = build_report([load_run(path) for path in resumed])
    assert "its segments left out different warm-ups (1: warmup_steps 2, 2: warmup_steps 3)" in report.notes[0]


# ------------------------------------------------------------------------------- --baseline
def test_the_baseline_comparison_says_how_many_runs_each_side_averaged(tmp_path, capsys):
    write_segments(tmp_path / "bm-resumed", RESUMED)
    write_segments(tmp_path / "bm-other", [[1.5] * 6])
    write_segments(tmp_path / "k8s", [[1.6] * 6], label="k8s")
    code, out, err = cli("report", tmp_path, "--baseline", "bm", capsys=capsys)
    assert code == 0, err
    header, _, row = out.split("\n\n")[1].splitlines()[:3]
    assert header.split()[3:7] == ["baseline", "runs", "other", "runs"]
    assert row.split()[3:7] == ["bm", "2", "k8s", "1"]
    code, out, _ = cli("report", tmp_path, "--baseline", "bm", "--format", "json", capsys=capsys)
    (compared,) = json.loads(out)["comparisons"]
    assert (compared["baseline_runs"], compared["other_runs"]) == (2, 1)
