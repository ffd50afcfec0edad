"""`nemo-throughput report` on hostile and broken input: every case is a clear message naming the
file, the other runs are still reported, and nothing printed can drive a terminal or a spreadsheet."""

import csv
import io
import json
import os
from pathlib import Path

import pytest
from test_report import write_run

from conftest import nemo_throughput_cli
from nemo_throughput.cli import main
from nemo_throughput.report.comparable import configuration, described
from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.rendering import render
from nemo_throughput.report.runs import IncompleteRun, ReportError, Window, load_run
from nemo_throughput.run_facts import USER_FLOPS

# Summaries broken on purpose, one field at a time: the report's own checks are the subject.
pytestmark = pytest.mark.invalid_summaries

ESCAPES = ("\x1b", "\x07", "\x9b", "\x00", "\u202e")  # ESC, BEL, 8-bit CSI, NUL, right-to-left override


def edit(path: Path, dotted: str, value=None, *, delete: bool = False) -> Path:
    """Set (or delete) one field of a summary file, writing NaN and Infinity as Python's json does."""
    summary = json.loads(path.read_text())
    *parents, key = dotted.split(".")
    node = summary
    for name in parents:
        node = node[name]
    if delete:
        del node[key]
    else:
        node[key] = value
    path.write_text(json.dumps(summary))
    return path


def good_run(tmp_path: Path, name: str = "good", **kwargs) -> Path:
    kwargs.setdefault("label", "slurm")
    kwargs.setdefault("step_times", [1.0, 1.0])
    return write_run(tmp_path / name / "summary.json", **kwargs)


def report(*args, capsys) -> tuple[int, str, str]:
    """The real CLI, in this process."""
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------ one field at a time
@pytest.mark.parametrize("dotted, value, message", [
    ("timing.step_time_s.mean", float("nan"), r"timing.step_time_s.mean is nan; it must be a positive"),
    ("timing.step_time_s.mean", float("inf"), r"timing.step_time_s.mean is inf; it must be a positive"),
    ("timing.step_time_s.mean", -1.5, r"timing.step_time_s.mean is -1.5; it must be a positive"),
    ("timing.step_time_s.mean", "1.0", r"timing.step_time_s.mean is '1.0'; it must be a positive"),
    ("timing.steps_measured", 2.5, r"timing.steps_measured is 2.5; it must be an integer >= 1"),
    ("hardware.num_gpus", 0, r"hardware.num_gpus is 0; it must be an integer >= 1"),
    ("hardware.num_gpus", -8, r"hardware.num_gpus is -8; it must be an integer >= 1"),
    ("hardware.num_gpus", 8.5, r"hardware.num_gpus is 8.5; it must be an integer >= 1"),
    ("hardware.num_gpus", True, r"hardware.num_gpus is True; it must be an integer >= 1"),
    ("hardware.num_gpus", "8", r"hardware.num_gpus is '8'; it must be an integer >= 1"),
    ("hardware.num_nodes", 0, r"hardware.num_nodes is 0; it must be an integer >= 1"),
    ("hardware.num_nodes", 9, r"hardware.num_nodes 9 is more than hardware.num_gpus 8: no run has a node without"),
    ("batch.global_batch_size", 0, r"batch.global_batch_size is 0; it must be an integer >= 1"),
    ("batch.global_batch_size", 10 ** 400, r"its numbers give no finite throughput \(global batch 1000000000.*\); "
                                           r"check them"),
    ("batch.seq_length", None, r"batch.seq_length is None; it must be an integer >= 1"),
    ("run.label", 5, r"run.label is 5; it must be a non-empty string"),
    ("run.label", None, r"run.label is None; it must be a non-empty string"),
    ("run.label", ["a"], r"run.label is \['a'\]; it must be a non-empty string"),
    ("run.label", "", r"run.label is ''; it must be a non-empty string"),
    ("model.name", 3, r"model.name is 3; it must be a non-empty string"),
    ("model.flops_per_sample", -1.0, r"model.flops_per_sample is -1.0; it must be a positive finite number or "
                                     r"null \(unknown\)"),
    ("model.flops_per_sample", float("nan"), r"model.flops_per_sample is nan"),
    ("model.flops_formula", 7, r"model.flops_formula is 7; it must be a non-empty string"),
    ("hardware.peak_tflops", 0, r"hardware.peak_tflops is 0; it must be a positive finite number or null"),
    ("hardware.peak_tflops", float("-inf"), r"hardware.peak_tflops is -inf"),
    ("hardware.gpu_name", None, r"hardware.gpu_name is None; it must be a non-empty string"),
    ("hardware.dtype", 16, r"hardware.dtype is 16; it must be a string or null"),
    ("hardware", [], r"hardware is \[\]; it must be an object"),
    ("status", "weird", r"status 'weird' is not one of \('running', 'stalled', 'completed', 'failed', 'interrupted'\)"),
    ("status", None, r"status None is not one of"),
])
def test_every_field_the_report_uses_is_checked(tmp_path, dotted, value, message):
    path = edit(good_run(tmp_path), dotted, value)
    with pytest.raises(ReportError, match=f"{tmp_path}/good/summary.json: {message}") as caught:
        load_run(path)
    assert not isinstance(caught.value, IncompleteRun)


@pytest.mark.parametrize("dotted", ["status", "run.label", "hardware.num_gpus", "timing", "model.flops_per_sample"])
def test_a_missing_field_is_named(tmp_path, dotted):
    path = edit(good_run(tmp_path), dotted, delete=True)
    with pytest.raises(ReportError, match=f"{tmp_path}/good/summary.json: {dotted} is missing"):
        load_run(path)


def test_a_summary_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1" / "summary.json"
    path.parent.mkdir()
    path.write_bytes(b'{"schema": "caf\xe9"}')
    with pytest.raises(ReportError, match=f"{path}: not a readable JSON summary"):
        load_run(path)


# ------------------------------------------------------------------------ unknown and user-given FLOPs
def test_unknown_flops_per_sample_gives_mfu_and_tflops_na(tmp_path):
    path = edit(good_run(tmp_path), "model.flops_per_sample", None)
    run = load_run(path)
    assert run.flops_per_sample is None and described("FLOPs per sample", configuration(run)) == "unknown"
    report_ = build_report([run, load_run(edit(good_run(tmp_path, "again"), "model.flops_per_sample", None))])
    (group,) = report_.groups
    assert (group.mfu, group.model_tflops_per_gpu, group.runs) == (None, None, 2)
    assert group.tokens_per_s == pytest.approx(128 * 2048 / 1.0)
    assert "n/a" in render(report_, "table") and "n/a" in render(report_, "markdown")
    assert json.loads(render(report_, "json"))["groups"][0]["mfu"] is None
    row = list(csv.DictReader(io.StringIO(render(report_, "csv"))))[0]
    assert (row["mfu"], row["model_tflops_per_gpu"]) == ("", "")


def test_unknown_flops_are_never_averaged_with_known_ones(tmp_path):
    known = load_run(good_run(tmp_path, "known"))
    unknown = load_run(edit(good_run(tmp_path, "unknown"), "model.flops_per_sample", None))
    with pytest.raises(ReportError, match=r"cannot be averaged.*\n.*known/summary.json: .*FLOPs per sample "
                                          r"[0-9.e+]+ \(megatron\).*\n.*unknown/summary.json: .*FLOPs per sample "
                                          r"unknown"):
        build_report([known, unknown])


def test_user_given_flops_are_shown_as_such(tmp_path):
    computed = load_run(good_run(tmp_path, "computed"))
    given = load_run(edit(edit(good_run(tmp_path, "given"), "model.flops_formula", USER_FLOPS),
                          "model.flops_per_sample", 1.5e12))
    assert described("FLOPs per sample", configuration(given)) == "1.5e+12 (given by the user)"
    with pytest.raises(ReportError, match=r"given/summary.json: .*FLOPs per sample 1.5e\+12 \(given by the user\)"):
        build_report([computed, given])


# ------------------------------------------------------------------------ the CLI: bad ones out, good ones in
def test_bad_summaries_are_excluded_by_name_and_the_rest_reported(tmp_path, capsys):
    good_run(tmp_path, "good", label="bare-metal")
    bad = {
        "nan": ("timing.step_time_s.mean", float("nan"), "timing.step_time_s.mean is nan"),
        "zero-gpus": ("hardware.num_gpus", 0, "hardware.num_gpus is 0"),
        "int-label": ("run.label", 5, "run.label is 5"),
        "no-status": ("status", None, "status is missing"),
    }
    for name, (dotted, value, _) in bad.items():
        edit(good_run(tmp_path, name), dotted, value, delete=value is None and dotted == "status")
    cut = tmp_path / "cut" / "summary.json"
    cut.parent.mkdir()
    cut.write_text(good_run(tmp_path, "whole").read_text()[:200])
    (tmp_path / "whole" / "summary.json").unlink()
    code, out, err = report(tmp_path, capsys=capsys)
    assert code == 1
    assert "bare-metal" in out and "slurm" not in out
    for name, (_, _, reason) in bad.items():
        assert f"excluded: {tmp_path}/{name}/summary.json: {reason}" in err
    assert f"excluded: {tmp_path}/cut/summary.json: not a readable JSON summary" in err
    assert "5 of 6 summaries were excluded" in err and "Traceback" not in err


def test_nothing_reportable_is_exit_status_2(tmp_path, capsys):
    edit(good_run(tmp_path, "a"), "hardware.num_gpus", 0)
    good_run(tmp_path, "b", status="failed")
    code, out, err = report(tmp_path, capsys=capsys)
    assert (code, out) == (2, "")
    assert "excluded:" in err and err.rstrip().endswith("no run left to report on")


def test_only_incomplete_runs_left_out_is_exit_status_0(tmp_path, capsys):
    good_run(tmp_path, "a")
    good_run(tmp_path, "b", status="interrupted")
    code, out, err = report(tmp_path, capsys=capsys)
    assert code == 0 and "status 'interrupted'" in err and "slurm" in out


def test_a_missing_input_path_is_excluded_and_the_rest_reported(tmp_path, capsys):
    good_run(tmp_path, "a")
    code, out, err = report(tmp_path / "a", tmp_path / "typo", capsys=capsys)
    assert code == 1 and "slurm" in out and f"excluded: {tmp_path}/typo: no such file or directory" in err
    (tmp_path / "loop").symlink_to(tmp_path / "loop")  # a link that leads nowhere says so, not that it is absent
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    code, out, err = report(tmp_path / "a", tmp_path / "loop", tmp_path / "dangling", capsys=capsys)
    assert code == 1 and "slurm" in out
    for name in ("loop", "dangling"):
        assert f"excluded: {tmp_path}/{name}: a link to nothing, or a loop of links" in err


def test_a_summary_given_twice_counts_once(tmp_path, capsys):
    path = good_run(tmp_path, "a")
    code, out, _ = report(tmp_path, path, "--format", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["groups"][0]["runs"] == 1


@pytest.mark.parametrize("tokens", ["nan", "inf", "0", "-5", "many", "T", "0T", "infB", "1.5X", ""])
def test_the_token_budget_must_be_positive_and_finite(tmp_path, capsys, tokens):
    good_run(tmp_path, "a")
    with pytest.raises(SystemExit) as caught:
        main(["report", str(tmp_path), "--tokens", tokens])
    assert caught.value.code == 2
    assert "--tokens: must be a positive number of tokens, e.g. 1e12 or 15T" in capsys.readouterr().err


@pytest.mark.parametrize(("tokens", "meant"), [("15T", 15e12), ("300b", 300e9), (" 2.5M ", 2.5e6), ("1e12", 1e12)])
def test_a_token_budget_is_read_in_its_own_words(tmp_path, capsys, tokens, meant):
    good_run(tmp_path, "a")
    code, out, _ = report(tmp_path, "--tokens", tokens, "--format", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["tokens"] == meant


@pytest.mark.parametrize("tokens", ["15", "999999", "0.5K"])
def test_a_budget_no_run_trains_on_is_a_missing_unit(tmp_path, capsys, tokens):
    good_run(tmp_path, "a")
    with pytest.raises(SystemExit) as caught:
        main(["report", str(tmp_path), "--tokens", tokens])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and f"--tokens: {tokens} tokens is no training budget" in err
    assert ("give the unit" in err) == (not tokens.endswith("K"))  # 0.5K has one: never asked for as `0.5KT`


# ------------------------------------------------------------------------ where the output goes
def test_output_writes_the_rendering_to_a_file(tmp_path, capsys):
    good_run(tmp_path, "a")
    out_file = tmp_path / "report.csv"
    code, out, err = report(tmp_path, "--format", "csv", "--output", out_file, capsys=capsys)
    assert (code, out) == (0, "")
    assert out_file.read_text().startswith("label,model,") and f"report: {out_file}" in err


@pytest.mark.parametrize("option, name", [("--output", "report.md"), ("--plot", "scaling.png")])
def test_a_missing_output_directory_is_a_clear_error_before_any_work(tmp_path, capsys, option, name):
    good_run(tmp_path, "a")
    target = tmp_path / "no" / "such" / name
    code, out, err = report(tmp_path / "a", option, target, capsys=capsys)
    assert (code, out) == (2, "")
    assert f"{option} {target}: directory {tmp_path}/no/such does not exist; create it first" in err
    assert not (tmp_path / "no").exists()


def test_an_output_that_is_a_fifo_is_refused_without_waiting_for_a_reader(tmp_path, capsys):
    good_run(tmp_path, "a")
    fifo = tmp_path / "report.md"
    os.mkfifo(fifo)
    code, out, err = report(tmp_path / "a", "--output", fifo, capsys=capsys)
    assert (code, out) == (2, "")
    assert f"--output {fifo} is not a regular file (a FIFO, socket or device); give a file name" in err


def test_output_must_not_overwrite_an_input_summary(tmp_path, capsys):
    path = good_run(tmp_path, "a")
    before = path.read_text()
    code, _, err = report(tmp_path, "--output", path, capsys=capsys)
    assert code == 2 and f"--output {path} is one of the files this command reads" in err and path.read_text() == before


@pytest.mark.parametrize("window", [(), ("--window", "1:")])
def test_output_must_not_overwrite_the_steps_jsonl_beside_an_input_summary(tmp_path, capsys, window):
    path = good_run(tmp_path, "a")
    steps = path.parent / "steps.jsonl"
    steps.write_text('{"step": 1, "step_time_s": 1.0}\n')
    code, _, err = report(path, *window, "--output", steps, capsys=capsys)
    assert code == 2 and f"--output {steps} is one of the files this command reads" in err
    assert steps.read_text() == '{"step": 1, "step_time_s": 1.0}\n'


def test_output_must_not_overwrite_another_runs_summary_either(tmp_path, capsys):
    kept = good_run(tmp_path / "kept", "b")
    before = kept.read_text()
    code, _, err = report(good_run(tmp_path, "a"), "--output", kept, capsys=capsys)
    assert code == 2 and f"--output {kept} is a run's summary; write elsewhere" in err and kept.read_text() == before


def test_plot_needs_an_image_suffix(tmp_path, capsys):
    good_run(tmp_path, "a")
    code, _, err = report(tmp_path, "--plot", tmp_path / "scaling.txt", capsys=capsys)
    assert code == 2 and "--plot" in err and "end in .png, .svg or .pdf" in err


def test_plot_draws_labels_that_look_like_mathtext(tmp_path, capsys):
    good_run(tmp_path, "a", label=r"$\frac$ \x1b[31m|bad")
    plot = tmp_path / "scaling.png"
    code, _, err = report(tmp_path, "--plot", plot, capsys=capsys)
    assert code == 0, err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_at_a_link_replaces_the_link_and_leaves_its_target_alone(tmp_path, capsys):
    """savefig wrote through a link into the file it pointed to."""
    good_run(tmp_path, "a")
    private, plot = tmp_path / "private.txt", tmp_path / "scaling.svg"
    private.write_text("mine\n")
    plot.symlink_to(private)
    code, _, err = report(tmp_path, "--plot", plot, capsys=capsys)
    assert code == 0, err
    assert private.read_text() == "mine\n" and not plot.is_symlink() and b"<svg" in plot.read_bytes()[:400]


# ------------------------------------------------------------------------ steps.jsonl and embedded steps
def write_steps(path: Path, lines: list[str]) -> Path:
    (path.parent / "steps.jsonl").write_text("".join(lines))
    return path


def step_line(step: int, time_s) -> str:
    return json.dumps({"step": step, "warmup": False, "step_time_s": time_s, "ranks": []}) + "\n"


def test_a_cut_last_line_of_steps_jsonl_is_left_out_with_a_note(tmp_path, capsys):
    path = write_steps(good_run(tmp_path, "a"), [step_line(n, 1.0) for n in range(1, 10)] + [step_line(10, 9.0)[:30]])
    run = load_run(path, Window.parse("1:"))
    assert (run.step_time_s, run.steps_counted) == (1.0, 9)
    assert run.notes == [f"{tmp_path}/a/steps.jsonl: its last line is incomplete (cut off while being written?); "
                         "left out, 9 steps read"]
    code, out, err = report(tmp_path, "--window", "1:", capsys=capsys)
    assert code == 0 and f"note: {tmp_path}/a/steps.jsonl: its last line is incomplete" in err


def test_profiled_and_skipped_steps_in_steps_jsonl_are_left_out_of_a_window_with_a_note(tmp_path):
    profiled = [json.dumps({"step": n, "warmup": False, "profiled": True, "step_time_s": 7.0, "ranks": []}) + "\n"
                for n in (4, 5)]
    path = write_steps(good_run(tmp_path, "a"), [step_line(n, 1.0) for n in range(1, 4)] + profiled
                       + [step_line(n, 2.0) for n in range(6, 8)])
    run = load_run(path, Window.parse("1:"))
    assert (run.step_time_s, run.steps_counted) == (pytest.approx(7.0 / 5), 5)
    assert run.notes == [f"{tmp_path}/a/steps.jsonl: steps 4-5 ran under the profiler (profile_steps); left out"]
    skipped = json.dumps({"step": 8, "skipped": True, "step_time_s": 9.0, "ranks": []}) + "\n"
    write_steps(path, [step_line(n, 1.0) for n in range(1, 8)] + [skipped])
    run = load_run(path, Window.parse("1:"))
    assert (run.step_time_s, run.steps_counted) == (1.0, 7)
    assert run.notes == [f"{tmp_path}/a/steps.jsonl: 1 skipped iteration(s) (no optimizer update: 8); left out"]
    bad = json.dumps({"step": 8, "profiled": "yes", "step_time_s": 1.0}) + "\n"
    write_steps(path, [step_line(1, 1.0), bad])
    with pytest.raises(ReportError, match="line 2: profiled is 'yes'; it must be true or false"):
        load_run(path, Window.parse("1:"))


def test_warm_up_steps_and_another_run_s_steps_in_steps_jsonl_are_never_averaged(tmp_path):
    """`--window -100:` on a short run would reach into its warm-up (slow steps the summary leaves
    out); a steps.jsonl beside the summary whose lines are of another run is refused."""
    warm = [json.dumps({"step": n, "warmup": True, "step_time_s": 5.0, "ranks": []}) + "\n" for n in (1, 2)]
    path = write_steps(good_run(tmp_path, "a"), warm + [step_line(n, 1.0) for n in range(3, 8)])
    run = load_run(path, Window.parse("-100:"))
    assert (run.step_time_s, run.steps_counted) == (1.0, 5)
    assert run.notes == [f"{tmp_path}/a/steps.jsonl: steps 1-2 are the run's warm-up (warmup_steps); left out",
                         f"{path}: --window -100: asks for its last 100 counted steps; it has 5: all of them are "
                         "counted"]
    run_id = json.loads(path.read_text())["run"]["id"]
    other = json.dumps({"step": 8, "run_id": "0123456789ab", "step_time_s": 1.0, "ranks": []}) + "\n"
    mine = json.dumps({"step": 3, "run_id": run_id, "step_time_s": 1.0, "ranks": []}) + "\n"
    write_steps(path, [mine, other])
    with pytest.raises(ReportError, match=f"steps.jsonl: line 2: a step of run '0123456789ab', not of the summary's "
                                          f"run '{run_id}'"):
        load_run(path, Window.parse("1:"))


@pytest.mark.parametrize("bad_line, message", [
    (step_line(5, float("nan")), r"line 5: step_time_s is nan; it must be a positive finite number"),
    (step_line(5, -1.0), r"line 5: step_time_s is -1.0; it must be a positive finite number"),
    (step_line(5, None), r"line 5: step_time_s is None"),
    (json.dumps({"step": "five", "step_time_s": 1.0}) + "\n", r"line 5: step is 'five'; it must be an integer >= 1"),
    ("{garbage\n", r"line 5: not JSON"),
    ("[1, 2]\n", r"line 5: not a JSON object"),
    (step_line(4, 1.0), r"step 4 appears more than once"),
])
def test_a_bad_line_inside_steps_jsonl_rejects_the_run(tmp_path, bad_line, message):
    lines = [step_line(n, 1.0) for n in range(1, 5)] + [bad_line] + [step_line(n, 1.0) for n in range(6, 10)]
    path = write_steps(good_run(tmp_path, "a"), lines)
    with pytest.raises(ReportError, match=f"{tmp_path}/a/steps.jsonl: {message}"):
        load_run(path, Window.parse("1:"))


@pytest.mark.parametrize("steps, message", [
    ([[1, 1.0], [2, float("nan")]], r"timing.steps\[1\] is \[2, nan\]; it must be \[step >= 1, positive finite "
                                    r"step time in s\]"),
    ([[1, 1.0], ["x", 1.0]], r"timing.steps\[1\] is \['x', 1.0\]"),
    ([[1, 1.0], [1, 1.0]], r"timing.steps: step 1 appears more than once"),
    ("all", r"timing.steps is 'all'; it must be a list"),
])
def test_bad_embedded_steps_reject_the_run(tmp_path, steps, message):
    path = edit(good_run(tmp_path, "a"), "timing.steps", steps)
    with pytest.raises(ReportError, match=f"{tmp_path}/a/summary.json: {message}"):
        load_run(path, Window.parse("1:"))


def test_last_n_steps_are_the_last_by_step_number(tmp_path):
    lines = [step_line(n, 1.0) for n in range(6, 11)] + [step_line(n, 5.0) for n in range(1, 6)]  # out of order
    path = write_steps(good_run(tmp_path, "a"), lines)
    assert load_run(path, Window.parse("-5:")).step_time_s == 1.0


# ------------------------------------------------------------------------ nothing printed drives a terminal
EVIL_LABEL = "\x1b[31mred\x1b[0m\x1b]0;pwned\x07\x9b2J\u202eok\x00"


def test_labels_lose_terminal_escapes_in_tables(tmp_path):
    run = load_run(good_run(tmp_path, "a", label=EVIL_LABEL, model="m\x1b[2Jodel"))
    report_ = build_report([run])
    for fmt in ("table", "markdown", "csv"):
        text = render(report_, fmt)
        assert not any(escape in text for escape in ESCAPES), fmt
        assert "redok" in text and "model" in text
    assert json.loads(render(report_, "json"))["groups"][0]["label"] == EVIL_LABEL  # JSON escapes it, exactly


def test_error_messages_lose_terminal_escapes(tmp_path, capsys):
    good_run(tmp_path, "good")
    good_run(tmp_path, "failed", status="failed")
    edit(tmp_path / "failed" / "summary.json", "error", "boom\x1b[2J\x1b]0;pwned\x07\nexcluded: forged line")
    evil_dir = tmp_path / "evil\x1b[2J"
    evil_dir.mkdir()
    (evil_dir / "summary.json").write_text("{cut")
    code, out, err = report(tmp_path, capsys=capsys)
    assert code == 1 and "slurm" in out
    assert not any(escape in err for escape in ESCAPES)
    assert "boom" in err and f"{tmp_path}/evil/summary.json" in err
    assert not any(line.startswith("excluded: forged") for line in err.splitlines())


def test_a_lone_surrogate_in_a_label_does_not_break_printing(tmp_path):
    path = good_run(tmp_path, "a")
    path.write_text(path.read_text().replace('"label": "slurm"', '"label": "bad\\ud800label"'))
    result = nemo_throughput_cli("report", tmp_path, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "badlabel" in result.stdout


# ------------------------------------------------------------------------ spreadsheets and markdown
def test_csv_guards_text_cells_against_formulas_but_keeps_numbers(tmp_path):
    runs = [load_run(good_run(tmp_path, name, label=label, model="=1+1", step_times=[step]))
            for name, label, step in (("a", "-bare", 1.0), ("b", "=HYPERLINK(\"http://x\")", 1.04),
                                      ("c", "+k8s", 0.98), ("d", "@sum", 1.0))]
    text = render(build_report(runs, baseline="-bare"), "csv")
    groups, comparisons = text.split("\n\n")
    rows = list(csv.DictReader(io.StringIO(groups)))
    assert {row["label"] for row in rows} == {"'-bare", "'=HYPERLINK(\"http://x\")", "'+k8s", "'@sum"}
    assert {row["model"] for row in rows} == {"'=1+1"}
    diffs = {row["other"]: row["diff_pct"] for row in csv.DictReader(io.StringIO(comparisons))}
    assert diffs["'+k8s"].startswith("-") and float(diffs["'+k8s"]) < 0  # a number stays a number
    assert all(row["baseline"] == "'-bare" for row in csv.DictReader(io.StringIO(comparisons)))


def test_markdown_escapes_pipes_in_cells(tmp_path):
    run = load_run(good_run(tmp_path, "a", label="a|b"))
    header, _, row = render(build_report([run]), "markdown").splitlines()[:3]
    assert "a\\|b" in row
    assert row.replace("\\|", "").count("|") == header.count("|")


def test_labels_that_print_the_same_are_refused(tmp_path):
    runs = [load_run(good_run(tmp_path, name, label=label)) for name, label in (("a", "k8s"), ("b", "\x1b[1mk8s"))]
    with pytest.raises(ReportError, match=r"labels '\\x1b\[1mk8s', 'k8s' all print as 'k8s' once control "
                                          r"characters are removed; correct them in .*b/summary.json"):
        build_report(runs)


def test_a_primary_rate_that_is_neither_tokens_nor_samples_excludes_the_run(tmp_path, capsys):
    good_run(tmp_path, "tokens")
    odd = edit(good_run(tmp_path, "odd"), "throughput.primary", "images_per_s")
    code, out, err = report(tmp_path, capsys=capsys)
    assert code == 1 and "gpt3-126m" in out
    assert f"{odd}: throughput.primary is 'images_per_s'; it must be one of ['tokens_per_s', 'samples_per_s']" in err


@pytest.mark.parametrize("outliers, problem", [
    ([{"step": 3, "step_time_s": "25", "phase": "data"}], "timing.outlier_steps[0].step_time_s"),
    ([{"step": 3, "step_time_s": 25.0, "phase": "\x1b[31mdata"}], "timing.outlier_steps[0].phase"),
    ([{"step": 3, "step_time_s": -1.0, "phase": None}], "timing.outlier_steps[0].step_time_s"),
    ("step 3", "timing.outlier_steps"),
    ([{"step": 3}], "timing.outlier_steps[0]: missing"),
])
def test_hostile_outlier_steps_exclude_the_run_naming_the_field(tmp_path, outliers, problem):
    path = edit(edit(good_run(tmp_path), "timing.outlier_count", 1), "timing.outlier_steps", outliers)
    with pytest.raises(ReportError) as caught:
        load_run(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not a valid") and problem in message and "\x1b" not in message


def test_outlier_steps_become_a_note_beside_the_median(tmp_path):
    path = edit(edit(good_run(tmp_path, step_times=[1.0, 1.0, 1.0, 9.0]), "timing.outlier_count", 1),
                "timing.outlier_steps", [{"step": 4, "step_time_s": 9.0, "phase": "data"}])
    (note,) = load_run(path).notes
    assert note == (f"{path}: outlier steps: 1 (the longest: step 4, 9 s, in data); the mean step time 3 s counts "
                    "it, the median is 1 s")


@pytest.mark.parametrize("where", ["given", "in a folder"])
def test_a_fifo_where_a_summary_belongs_is_refused_at_once_never_waited_on(tmp_path, capsys, where):
    """A reader of a FIFO waits for a writer that never comes: report (and compare, import) would hang."""
    import os

    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "summary.json")
    target = tmp_path / "run" / "summary.json" if where == "given" else tmp_path
    code = main(["report", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and "not a summary file (a FIFO, device or directory" in err, err


EVO2_LOG = Path(__file__).parent / "data" / "import" / "nemo2_evo2_finetune_notebook.log"


@pytest.mark.parametrize("field, edited", [
    ("timing.step_time_s.mean", lambda summary: summary["timing"]["step_time_s"]["mean"] * 0.5),  # 2x the rate
    ("timing.steps_measured", lambda summary: summary["timing"]["steps_measured"] + 1),
    ("timing.steps", lambda summary: [[step, seconds / 2] for step, seconds in summary["timing"]["steps"]]),
])
def test_an_imported_summary_whose_mean_is_not_its_steps_is_refused(tmp_path, capsys, field, edited):
    """A real log's summary edited by hand (its mean halved: tokens/s doubled in the table, while a
    --window over its listed steps said otherwise). Unedited, it reports; edited, it is excluded."""
    assert main(["import", str(EVO2_LOG), "--label", "x", "--model", "gpt3-126m", "--seq-length", "2048",
                 "--num-gpus", "8", "--output-dir", str(tmp_path)]) == 0
    path = tmp_path / EVO2_LOG.stem / "summary.json"
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    edit(path, field, edited(json.loads(path.read_text())))
    capsys.readouterr()
    assert main(["report", str(path)]) == 2  # no run left
    err = capsys.readouterr().err
    assert f"excluded: {path}: timing.step_time_s.mean " in err and "is not what its timing.steps hold in its " \
        "window 11: (" in err and "edited by hand? import the log again" in err, err
