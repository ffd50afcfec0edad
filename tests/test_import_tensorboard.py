"""`nemo-throughput import` of Megatron-LM and Megatron-Bridge TensorBoard event files, written here
with the real writer (torch.utils.tensorboard.SummaryWriter, the one both use) with the tags, steps
and values their `training_log` writes; NeMo's event files beside them read as before."""

import math
import statistics

import pytest

from conftest import import_error_line, nemo_throughput_cli, summary_of
from nemo_throughput.cli import main

SEQ, GPUS = 2048, 16
# Megatron-LM timers written with --log-timers-to-tensorboard and --timing-log-level 1 or more
# (megatron/core/timers.py Timers.write: `<name>-time`)
TIMERS = ("forward-backward-time", "optimizer-time")


def megatron_lm_iteration(writer, iteration, seconds, batch=128, log_interval=10):
    """What Megatron-LM's megatron/training/training.py `training_log` writes at `iteration` (d98e8a64,
    the same tags since core 0.9, before which `batch-size` needed --log-batch-size-to-tensorboard), with
    --tensorboard-dir, --log-timers-to-tensorboard, --log-throughput, --timing-log-level 1 and
    --tensorboard-log-interval 1: every iteration the learning rate, batch size and losses, each again
    `... vs samples` at the consumed samples; every --log-interval iterations `iteration-time` (seconds,
    the mean since the last log), `throughput` (TFLOP/s/GPU) and the timers. `seconds` None: a run
    without --log-timers-to-tensorboard."""
    consumed = iteration * batch
    for tag, value in (("learning-rate", 3e-4), ("batch-size", batch), ("lm loss", 9.0 - iteration / 100),
                       ("loss-scale", 1.0), ("grad-norm", 1.5)):
        writer.add_scalar(tag, value, iteration)
        writer.add_scalar(f"{tag} vs samples", value, consumed)
    if iteration % log_interval == 0 and seconds is not None:
        writer.add_scalar("iteration-time", seconds, iteration)
        writer.add_scalar("throughput", 400.0, iteration)
        for timer in TIMERS:
            writer.add_scalar(timer, seconds / 2, iteration)


def bridge_iteration(writer, iteration, seconds, batch=256, log_interval=5):
    """What Megatron-Bridge's src/megatron/bridge/training/utils/train_utils.py `training_log` writes at
    `iteration` (067f987d; the same tags since v0.2.0) with logger.tensorboard_dir,
    log_timers_to_tensorboard and log_throughput_to_tensorboard: every iteration its rolling
    `throughput/*` (of the configured batch), learning rate, batch size and losses (and `... vs samples`);
    every log_interval iterations `throughput/tflops/device`, `throughput/tflops` and `iteration-time`."""
    consumed = iteration * batch
    for tag, value in (("throughput/samples_per_sec", 99.0), ("throughput/global_batch_size", batch),
                       ("learning-rate", 3e-4), ("batch-size", batch), ("lm loss", 5.0), ("loss-scale", 1.0)):
        writer.add_scalar(tag, value, iteration)
        if not tag.startswith("throughput/"):
            writer.add_scalar(f"{tag} vs samples", value, consumed)
    if iteration % log_interval == 0:
        writer.add_scalar("throughput/tflops/device", 500.0, iteration)
        writer.add_scalar("throughput/tflops", 500.0 * GPUS, iteration)
        writer.add_scalar("iteration-time", seconds, iteration)


def event_dir(path, iterations, seconds_at, write=megatron_lm_iteration, started=None, **kwargs):
    """One event file in `path`, as one process of the run writes it (`seconds_at(iteration)`); `started`:
    the time its name states (one writer per process in a real run; here many share one process)."""
    from torch.utils.tensorboard import SummaryWriter

    before = set(path.glob("*tfevents*"))
    writer = SummaryWriter(path)
    for iteration in iterations:
        write(writer, iteration, seconds_at(iteration), **kwargs)
    writer.close()
    if started is not None:
        (written,) = set(path.glob("*tfevents*")) - before
        written.rename(path / f"events.out.tfevents.{started}.node07.4242.0")
    return path


def run_import(capsys, log, *extra, out):
    """The real `nemo-throughput import` entry point, in this process: (exit code, stdout, stderr)."""
    code = main(["import", *map(str, log if isinstance(log, list) else [log]), "--label", "bare-metal", "--model",
                 "gpt3-126m", "--seq-length", str(SEQ), "--num-gpus", str(GPUS), "--output-dir", str(out),
                 *map(str, extra)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def alternating(iteration):
    """6 s for the first interval (warm-up), then 1.25 and 1.75 s in turn: exact in float32."""
    return 6.0 if iteration == 10 else (1.25 if (iteration // 10) % 2 == 0 else 1.75)


# ------------------------------------------------------------------------------- reading
def test_megatron_lm_event_file_reads_interval_means_and_its_batch_through_the_installed_command(tmp_path):
    event_dir(tmp_path / "tb", range(1, 101), alternating)
    out = tmp_path / "imported"
    result = nemo_throughput_cli("import", tmp_path / "tb", "--label", "bare-metal", "--model", "gpt3-126m",
                                 "--seq-length", SEQ, "--num-gpus", GPUS, "--output-dir", out, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = summary_of(out, "tb")
    timing = summary["timing"]
    assert timing["steps"] == [[it, alternating(it)] for it in range(10, 101, 10)]  # at the iteration, not +1
    # the first 10 iterations (the value at 10) are warm-up: 20..100, 5 x 1.25 s and 4 x 1.75 s
    assert timing["window"] == "20:" and timing["steps_measured"] == 9
    mean = (5 * 1.25 + 4 * 1.75) / 9
    assert timing["step_time_s"]["mean"] == pytest.approx(mean)
    assert summary["batch"]["global_batch_size"] == 128  # from `batch-size`, never given
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(128 * SEQ / mean)
    assert summary["throughput"]["tokens_per_s_per_gpu"] == pytest.approx(128 * SEQ / mean / GPUS)
    assert summary["run"]["source"] == "import:tensorboard"
    assert summary["environment"]["log_styles"] == [
        "TensorBoard `iteration-time` scalar of Megatron-LM / Megatron-Bridge (the mean of each log interval)"]
    assert ("step times from Megatron's `iteration-time` scalar: each the mean of the 10 iterations of its log "
            "interval up to its step, counted as one sample") in result.stderr


def test_megatron_bridge_event_file_with_a_window_of_the_last_values(tmp_path, capsys):
    event_dir(tmp_path / "bridge", range(1, 51), lambda it: 2.5 if it > 25 else 3.0, write=bridge_iteration)
    code, _, err = run_import(capsys, tmp_path / "bridge", "--window", "-3:", out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "bridge")
    assert [step for step, _ in summary["timing"]["steps"]] == list(range(5, 51, 5))
    assert summary["timing"]["steps_measured"] == 3 and summary["timing"]["step_time_s"]["mean"] == 2.5
    assert summary["batch"]["global_batch_size"] == 256
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(256 * SEQ / 2.5)
    assert "--window -3: counts printed values, each the mean of 5 iterations (the log interval)" in err
    code, _, err = run_import(capsys, tmp_path / "bridge", "--global-batch-size", "512", out=tmp_path / "out")
    assert code == 2
    assert ("--global-batch-size 512 but the log says 256 (step 15, from the `batch-size` scalar)"
            in import_error_line(err, "bridge"))


def test_a_window_narrower_than_the_log_interval_says_what_it_measures(tmp_path, capsys):
    event_dir(tmp_path / "tb", range(1, 101), alternating)
    code, _, err = run_import(capsys, tmp_path / "tb", "--window", "35:38", out=tmp_path / "out")
    assert code == 2 and "--window 35:38 selects none" in import_error_line(err, "tb")
    code, _, err = run_import(capsys, tmp_path / "tb", "--window", "38:41", out=tmp_path / "out")
    assert code == 0, err
    assert "spans 3 step(s), fewer than the log interval of 10" in err and "iterations 31-40" in err
    assert summary_of(tmp_path / "out", "tb")["timing"]["step_time_s"]["mean"] == 1.25


def test_an_event_file_without_batch_size_needs_it_given_and_is_detected_by_its_bytes(tmp_path, capsys):
    """Megatron-LM before core 0.9 wrote `batch-size` only with --log-batch-size-to-tensorboard."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "tb")
    for iteration in range(10, 201, 10):
        writer.add_scalar("lm loss", 4.0, iteration)
        writer.add_scalar("iteration-time", 0.75, iteration)
    writer.close()
    (event,) = (tmp_path / "tb").glob("*tfevents*")
    renamed = event.rename(tmp_path / "megatron-events.bin")  # no `tfevents` in the name: told by its first record
    code, _, err = run_import(capsys, renamed, out=tmp_path / "out")
    assert code == 2 and "does not state the global batch size (give --global-batch-size)" in import_error_line(
        err, "megatron-events.bin")
    code, _, err = run_import(capsys, renamed, "--global-batch-size", "64", "--format", "tensorboard",
                              out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "megatron-events")
    assert summary["timing"]["steps_measured"] == 19 and summary["throughput"]["tokens_per_s"] == pytest.approx(
        64 * SEQ / 0.75)


def test_a_nemo_event_file_reads_as_before_each_step_its_own(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "nemo")
    for step in range(30):  # NeMo 2: both at every 0-based global step
        writer.add_scalar("global_batch_size", 32.0, step)
        writer.add_scalar("train_step_timing in s", 0.5, step)
        writer.add_scalar("reduced_train_loss", 3.0, step)
    writer.close()
    code, _, err = run_import(capsys, tmp_path / "nemo", "--window", "14:16", out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "nemo")
    assert [step for step, _ in summary["timing"]["steps"]] == list(range(1, 31))
    assert summary["timing"]["steps_measured"] == 2 and summary["batch"]["global_batch_size"] == 32
    assert summary["environment"]["log_styles"] == ["TensorBoard scalar"]
    assert "mean of" not in err and "log interval" not in err


# ------------------------------------------------------------------------------- hostile
def test_iteration_times_that_are_nan_zero_negative_or_beyond_any_run_are_left_out_and_counted(tmp_path, capsys):
    bad = {20: math.nan, 40: 0.0, 60: -1.5, 80: 1e30, 90: math.inf}
    event_dir(tmp_path / "tb", range(1, 101), lambda it: bad.get(it, 2.0))
    code, _, err = run_import(capsys, tmp_path / "tb", "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    assert ("warning: 5 step time(s) left out, zero, negative, NaN, infinite or over a day: 20 (nan s), 40 (0 s), "
            "60 (-1.5 s), 80 (1e+30 s), 90 (inf s)") in err
    timing = summary_of(tmp_path / "out", "tb")["timing"]
    assert timing["excluded_step_times"]["count"] == 5
    assert [step for step, _ in timing["excluded_step_times"]["steps"]] == [20, 40, 60, 80, 90]
    assert timing["steps_measured"] == 5 and timing["step_time_s"]["mean"] == 2.0  # 10, 30, 50, 70, 100
    event_dir(tmp_path / "all-bad", range(1, 31), lambda it: math.nan)
    code, _, err = run_import(capsys, tmp_path / "all-bad", out=tmp_path / "out")
    assert code == 2 and "no step has a usable time: all 3 are zero, negative, NaN, infinite or over a day" in (
        import_error_line(err, "all-bad"))


@pytest.mark.parametrize("restarted_at, said, second", [
    (30, "step 40 is printed again with different values (value 4: 1.25 s, value 6: 3 s)",  # logged again
     list(range(40, 71, 10))),
    (25, "step numbers go backwards (step 28 after step 50 at value 5)", list(range(28, 71, 7))),  # another interval
])
def test_steps_going_backward_in_one_file_are_segments_of_which_one_is_imported(tmp_path, capsys, restarted_at,
                                                                                  said, second):
    """A job that restarted from a checkpoint into the same file (or files joined with cat): refused naming
    its two segments; --segment picks one, never both merged."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "tb")
    for iteration in range(1, 51):
        megatron_lm_iteration(writer, iteration, 1.25)
    for iteration in range(restarted_at + 1, 71):
        megatron_lm_iteration(writer, iteration, 3.0, log_interval=10 if restarted_at == 30 else 7)
    writer.close()
    code, _, err = run_import(capsys, tmp_path / "tb", out=tmp_path / "out")
    assert code == 2
    line = import_error_line(err, "tb")
    assert ": 2 segments, as a job restarted into the same log prints them: 1: steps 10-50, 5 printed" in line
    assert f"starting where {said} (import one with --segment N, from 1, or --segment last" in line
    code, _, err = run_import(capsys, tmp_path / "tb", "--segment", "last", "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    timing = summary_of(tmp_path / "out", "tb")["timing"]
    assert [step for step, _ in timing["steps"]] == second and timing["step_time_s"]["mean"] == pytest.approx(3.0)


def test_two_event_files_of_one_run(tmp_path, capsys):
    """A run resumed from its last checkpoint writes a second file beside the first (a new process's
    SummaryWriter): read in name order as one run. One resumed from an earlier checkpoint logs steps again."""
    event_dir(tmp_path / "run", range(1, 51), lambda it: 6.0 if it == 10 else 2.0, started=1700000000)
    event_dir(tmp_path / "run", range(51, 101), lambda it: 1.0, started=1700003600)
    assert len(list((tmp_path / "run").glob("*tfevents*"))) == 2
    code, _, err = run_import(capsys, tmp_path / "run", out=tmp_path / "out")
    assert code == 0, err
    timing = summary_of(tmp_path / "out", "run")["timing"]
    assert [step for step, _ in timing["steps"]] == list(range(10, 101, 10))
    # 20-50 at 2 s (the value at 10 is warm-up), 60-100 at 1 s
    assert timing["step_time_s"]["mean"] == pytest.approx(statistics.fmean([2.0] * 4 + [1.0] * 5))
    event_dir(tmp_path / "overlap", range(1, 51), lambda it: 2.0, started=1700000000)
    event_dir(tmp_path / "overlap", range(31, 101), lambda it: 1.0, started=1700003600)  # from iteration 30
    code, _, err = run_import(capsys, tmp_path / "overlap", out=tmp_path / "out")
    assert code == 2
    assert ("starting where step 40 is printed again with different values (value 4: 2 s, value 6: 1 s) (import one "
            "with --segment N, from 1, or --segment last; or import each event file on its own)") in \
        import_error_line(err, "overlap")


def test_event_files_holding_both_nemo_and_megatron_step_times_are_refused(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "one-file")
    for step in range(1, 31):
        writer.add_scalar("train_step_timing in s", 1.0, step)
        writer.add_scalar("iteration-time", 2.0, step)
    writer.close()
    code, _, err = run_import(capsys, tmp_path / "one-file", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2
    assert "both NeMo's `train_step_timing in s` scalar (events.out.tfevents." in import_error_line(err, "one-file")
    assert "no run writes both (import each run's event files on their own)" in err
    nemo = SummaryWriter(tmp_path / "mixed" / "nemo")
    for step in range(30):
        nemo.add_scalar("train_step_timing in s", 1.0, step)
    nemo.close()
    event_dir(tmp_path / "mixed" / "megatron", range(1, 31), lambda it: 2.0)
    code, _, err = run_import(capsys, tmp_path / "mixed", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2 and "and Megatron's `iteration-time` (events.out.tfevents." in import_error_line(err, "mixed")
    assert not (tmp_path / "out").exists()


def test_event_files_without_step_times_name_the_flag_that_writes_them(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    event_dir(tmp_path / "no-timers", range(1, 31), lambda it: None)  # every scalar but the timing ones
    loss_only = SummaryWriter(tmp_path / "loss-only")
    for iteration in range(1, 31):
        loss_only.add_scalar("lm loss", 4.0, iteration)
        loss_only.add_scalar("lm loss vs samples", 4.0, iteration * 128)
    loss_only.close()
    for name in ("no-timers", "loss-only"):
        code, _, err = run_import(capsys, tmp_path / name, "--global-batch-size", "8", out=tmp_path / "out")
        assert code == 2
        assert ("Megatron-LM / Megatron-Bridge event files without the `iteration-time` scalar, which they write "
                "only with --log-timers-to-tensorboard or Megatron-Bridge's logger.log_timers_to_tensorboard=True (run "
                "with it, or import the job's text log with --format megatron)") in import_error_line(err, name)
    other = SummaryWriter(tmp_path / "other")
    other.add_scalar("accuracy", 0.5, 1)
    other.close()
    code, _, err = run_import(capsys, tmp_path / "other", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2
    assert ("no `train_step_timing in s` scalar in its event files, nor Megatron's `iteration-time`"
            in import_error_line(err, "other"))
    assert "--log-timers-to-tensorboard" in err


def test_a_megatron_event_file_cut_short_is_a_clear_error(tmp_path, capsys):
    event_dir(tmp_path / "tb", range(1, 101), lambda it: 1.5)
    (event,) = (tmp_path / "tb").glob("*tfevents*")
    event.write_bytes(event.read_bytes()[:-5])  # the job killed while its writer flushed
    code, _, err = run_import(capsys, tmp_path / "tb", out=tmp_path / "out")
    assert code == 2 and "not a readable TensorBoard event file: record" in import_error_line(err, event.name)
    assert "is cut short" in err
