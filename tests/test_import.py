"""`nemo-throughput import`: real log lines from public sources first (tests/data/import, origins in
its ORIGIN.md), then logs written here the way NeMo, tqdm, Megatron and the launchers write them."""

import json
import math
import os
import re
import select
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import import_error_line, nemo_throughput_cli, run_train_tiny, summary_of
from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.importers.lines import WAITING
from nemo_throughput.importers.nemo import tqdm_range
from nemo_throughput.presets import preset
from nemo_throughput.report.runs import Window, load_run

DATA = Path(__file__).parent / "data" / "import"
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"  # NeMo 1.x
MEGATRON_LINE = (" iteration       10/     100 | consumed samples:         1280 | "
                 "elapsed time per iteration (ms): 1500.0 | global batch size:   128 |\n")


def run_import(capsys, log, *extra, out, model=("--model", "gpt3-126m")):
    """The real `nemo-throughput import` entry point, in this process: (exit code, stdout, stderr)."""
    code = main(["import", *map(str, log if isinstance(log, list) else [log]), "--label", "bare-metal", *model,
                 "--seq-length", "2048", "--num-gpus", "16", "--output-dir", str(out), *map(str, extra)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def steps_of(summary):
    return [step for step, _ in summary["timing"]["steps"]]


# ------------------------------------------------------------------------------- real logs
def test_real_nemo1_bar_reads_the_batch_from_consumed_samples(tmp_path, capsys):
    # NVIDIA's DGX Cloud recipe README: global_step=99.00, consumed_samples=12800.0 -> step 100, 128 per step
    code, out, err = run_import(capsys, DATA / "nemo1_dgxc_llama31_70b_last_step.out", "--window", "last",
                                out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "nemo1_dgxc_llama31_70b_last_step")
    assert summary["timing"]["steps"] == [[100, 11.2]] and summary["batch"]["global_batch_size"] == 128
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(128 * 2048 / 11.2)


def test_real_nemo1_bar_whose_batch_disagrees_with_the_given_one(tmp_path, capsys):
    # The Grok-1 README computes with 4096 per step; its own log line says 51200 samples after 50 steps.
    log = DATA / "nemo1_dgxc_grok1_last_step.out"
    code, _, err = run_import(capsys, log, "--global-batch-size", "4096", "--window", "last", out=tmp_path)
    assert code == 2
    assert "--global-batch-size 4096 but the log says 1024" in import_error_line(err, log.name)
    assert not (tmp_path / "nemo1_dgxc_grok1_last_step").exists()


@pytest.mark.parametrize("fixture, extra, allowed", [
    ("nemo1_compact_llama2_peft.out", ["--global-batch-size", "128"], "steps 1,997 to 2,003"),  # 2.56e+5 / 128
    ("nemo1_compact_eks.out", [], "steps 1,996 to 2,006"),
])
def test_real_nemo1_bar_with_only_rounded_step_numbers_is_refused(tmp_path, capsys, fixture, extra, allowed):
    code, _, err = run_import(capsys, DATA / fixture, *extra, "--window", "last", out=tmp_path)
    assert code == 2
    line = import_error_line(err, fixture)
    assert "rounded by tqdm" in line and allowed in line and "global_step=2e+3" in line
    assert "230400.0-last.ckpt" not in line  # the checkpoint path printed after the bar is not part of it


def test_real_nemo2_printer_lines_state_the_batch(tmp_path, capsys):
    log = DATA / "nemo2_evo2_finetune_notebook.log"  # indented notebook output, validation lines between
    code, _, err = run_import(capsys, log, "--warmup", "1", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "nemo2_evo2_finetune_notebook")
    assert steps_of(summary) == [*range(1, 14), *range(48, 54)]  # global_step 0-12 and 47-52
    assert summary["batch"]["global_batch_size"] == 4 and summary["timing"]["window"] == "2:"
    assert summary["timing"]["step_time_s"]["max"] == 2.262  # step 2; the 23.52 s of step 1 is warm-up
    code, _, err = run_import(capsys, log, "--global-batch-size", "8", out=tmp_path)
    assert code == 2 and "--global-batch-size 8 but the log says 4" in import_error_line(err, log.name)


def test_real_nemo2_lines_behind_timestamps(tmp_path, capsys):
    code, _, err = run_import(capsys, DATA / "nemo2_qwen3_8b_timestamped.log", "--warmup", "0", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "nemo2_qwen3_8b_timestamped")
    assert summary["timing"]["steps"] == [[528, 2.389], [529, 2.443], [530, 2.127]]
    assert summary["batch"]["global_batch_size"] == 32


def test_real_srun_label_prefix_says_which_rank_was_read(tmp_path, capsys):
    code, _, err = run_import(capsys, DATA / "nemo2_esm2_srun_label.out", "--warmup", "0", out=tmp_path)
    assert code == 0, err
    assert "read rank 0 (the only rank that prints step lines)" in err
    summary = summary_of(tmp_path, "nemo2_esm2_srun_label")
    assert steps_of(summary) == list(range(29, 36)) and summary["environment"]["imported_rank"] == "0"


def test_an_imported_summary_never_claims_this_machines_libraries_as_the_runs(tmp_path, capsys):
    from importlib import metadata

    code, _, err = run_import(capsys, DATA / "nemo2_esm2_srun_label.out", "--warmup", "0", out=tmp_path)
    assert code == 0, err
    recorded = summary_of(tmp_path, "nemo2_esm2_srun_label")["environment"]
    assert "versions" not in recorded  # the run's torch, NeMo, CUDA are not in its log
    assert recorded["imported_with"] == {"nemo-throughput": metadata.version("nemo-throughput")}


def test_a_warning_that_names_the_metric_is_not_a_step_line(tmp_path, capsys):
    warning = ("[NeMo W 2025-06-18 16:52:59 nemo_logging:405] /usr/local/lib/python3.12/dist-packages/lightning/"
               "pytorch/trainer/connectors/logger_connector/result.py:431: It is recommended to use "
               "`self.log('train_step_timing in s', ..., sync_dist=True)` when logging on epoch level in distributed "
               "setting to accumulate the metric across devices.\n")
    log = tmp_path / "esm2.out"
    log.write_text(warning + (DATA / "nemo2_esm2_srun_label.out").read_text())
    code, _, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    assert "read rank 0 (the only rank that prints step lines)" in err


def test_real_nemo_run_torchx_prefix(tmp_path, capsys):
    code, _, err = run_import(capsys, DATA / "nemo2_nemo_run_torchx_prefix.log", "--warmup", "0", out=tmp_path)
    assert code == 0, err
    assert "read rank 0/0 (the only rank that prints step lines)" in err
    summary = summary_of(tmp_path, "nemo2_nemo_run_torchx_prefix")
    assert summary["timing"]["steps"] == [[1, 5.276], [2, 2.008]] and summary["batch"]["global_batch_size"] == 4


def test_real_megatron_lines_behind_timestamps(tmp_path, capsys):
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", "--window", "last", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "megatron_lm_mixtral_issue756")
    assert steps_of(summary) == [43, 44, 45, 71, 72, 73] and summary["batch"]["global_batch_size"] == 128
    assert summary["timing"]["step_time_s"]["mean"] == pytest.approx(5.8299)
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", "--global-batch-size", "256",
                              out=tmp_path)
    assert code == 2 and "--global-batch-size 256 but the log says 128" in import_error_line(err, "issue756")


@pytest.mark.parametrize("fixture, step, seconds, batch", [
    ("megatron_lm_bert_nccl_issue743.log", 10, 0.3562, 4),  # no throughput field, skipped iterations
    ("megatron_llm_epfl_issue11.log", 125, 89.0752, 1024),
    ("megatron_openseek_torchrun_default0.log", 1, 271.607, 1024),
])
def test_real_megatron_lines(tmp_path, capsys, fixture, step, seconds, batch):
    code, _, err = run_import(capsys, DATA / fixture, "--window", "last", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, fixture.removesuffix(".log"))
    assert summary["timing"]["steps"][-1] == [step, pytest.approx(seconds)]
    assert summary["batch"]["global_batch_size"] == batch


def test_real_torchrun_log_where_only_the_last_rank_prints(tmp_path, capsys):
    # Megatron prints on the last rank (print_rank_last): here torchrun's [default7]
    code, _, err = run_import(capsys, DATA / "megatron_flagscale_torchrun_default7.log", "--window", "last",
                              out=tmp_path)
    assert code == 0, err
    assert "read rank 7 (the only rank that prints step lines)" in err


# ------------------------------------------------------------------------------- ranks
def _real_megatron_line(rank_prefix: str, seconds_ms: float) -> str:
    line = (DATA / "megatron_flagscale_torchrun_default7.log").read_text().strip()
    return line.replace("[default7]: ", rank_prefix).replace("1510.4", f"{seconds_ms:.1f}")


def test_several_ranks_with_prefixes_are_read_one_at_a_time(tmp_path, capsys):
    log = tmp_path / "torchrun.log"
    log.write_text("".join(_real_megatron_line(f"[default{r}]: ", 1000.0 + r) + "\n" for r in (3, 0, 7)))
    code, _, err = run_import(capsys, log, "--window", "last", out=tmp_path / "out")
    assert code == 0, err
    assert "read rank 0 of 3 that print step lines (0, 3, 7; --rank picks another)" in err
    assert summary_of(tmp_path / "out", "torchrun")["timing"]["steps"] == [[561, 1.0]]
    code, _, err = run_import(capsys, log, "--window", "last", "--rank", "7", out=tmp_path / "out")
    assert code == 0 and summary_of(tmp_path / "out", "torchrun")["timing"]["steps"] == [[561, 1.007]]
    code, _, err = run_import(capsys, log, "--rank", "5", out=tmp_path / "out")
    assert code == 2 and "--rank 5: no step lines from it (ranks that print step lines: 0, 3, 7)" in err


def test_several_ranks_without_prefixes_are_refused_not_merged(tmp_path, capsys):
    log = tmp_path / "noprefix.log"
    log.write_text("".join(_real_megatron_line("", 1000.0 + r) + "\n" for r in (0, 1)))
    code, _, err = run_import(capsys, log, "--window", "last", out=tmp_path / "out")
    assert code == 2
    line = import_error_line(err, "noprefix.log")
    assert "step 561 is printed again with different values (line 1: 1 s, line 2: 1.001 s)" in line
    assert "srun --label" in line


def test_srun_label_with_progress_bars_redrawn_by_carriage_returns(tmp_path, capsys):
    # srun labels each \n-line; the \r redraws inside it belong to the same rank
    def bar(rank, steps):
        pieces = [f"Epoch 0: : {s}/{steps} [00:00<00:00, global_step={s - 1}.000, consumed_samples={8 * s}.0, "
                  f"train_step_timing in s={rank + 1}.000]" for s in range(1, steps + 1)]
        return f"{rank:2d}: " + "\r".join(pieces) + "\n"
    log = tmp_path / "srun.out"
    log.write_text(bar(1, 12) + bar(0, 12) + " 1: [NeMo I 2024-06-17 08:36:41 nlp_overrides:480] done\n")
    code, _, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "srun")
    assert summary["timing"]["steps"] == [[s, 1.0] for s in range(1, 13)] and "read rank 0 of 2" in err


# ------------------------------------------------------------------------------- restarted logs (segments)
MIXTRAL = DATA / "megatron_lm_mixtral_issue756.log"  # iterations 43, 44, 45 (5444.9, 5533.8, 5718.6 ms), 71, 72, 73
MEGATRON_START = "      > initializing torch distributed ...\n"  # as a real Megatron-LM log prints it (rank 0)


def requeued_megatron_log(path: Path, restarts: int = 1) -> Path:
    """The real log's iterations 43-45, then ``restarts`` times 44-45 again, as a job requeued into the
    same file after its checkpoint at 43 prints them: with other times (6000 + r, 6100 + r ms)."""
    lines = MIXTRAL.read_text().splitlines(keepends=True)
    again = [lines[1].replace("5533.8", "{:.1f}"), lines[2].replace("5718.6", "{:.1f}")]
    path.write_text("".join([*lines[:3], *(a.format(base + r) for r in range(restarts)
                                           for a, base in zip(again, (6000, 6100), strict=True))]))
    return path


def test_real_megatron_log_a_job_restarted_into_is_refused_naming_its_segments(tmp_path, capsys):
    log = requeued_megatron_log(tmp_path / "requeued.log")
    code, _, err = run_import(capsys, log, "--warmup", "1", out=tmp_path / "out")
    line = import_error_line(err, "requeued.log")
    assert code == 2 and ("2 segments, as a job restarted into the same log prints them: 1: steps 43-45, 3 printed, "
                          "lines 1-3; 2: steps 44-45, 2 printed, lines 4-5, starting where step 44 is printed again "
                          "with different values (line 2: 5.5338 s, line 4: 6 s) (import one with --segment N, "
                          "from 1, or --segment last; or several ranks print") in line
    assert not (tmp_path / "out" / "requeued").exists()


@pytest.mark.parametrize("choice, steps, window, mean", [
    ("1", [[43, 5.4449], [44, 5.5338], [45, 5.7186]], "44:", (5.5338 + 5.7186) / 2),
    ("2", [[44, 6.0], [45, 6.1]], "45:", 6.1),  # its own warm-up: step 44, the first after the restart
    ("last", [[44, 6.0], [45, 6.1]], "45:", 6.1),
    ("LAST", [[44, 6.0], [45, 6.1]], "45:", 6.1),
])
def test_segment_imports_only_the_chosen_segment_with_its_own_warmup(tmp_path, capsys, choice, steps, window, mean):
    log = requeued_megatron_log(tmp_path / "requeued.log")
    code, _, err = run_import(capsys, log, "--warmup", "1", "--segment", choice, out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "requeued")
    assert summary["timing"]["steps"] == [[step, pytest.approx(seconds)] for step, seconds in steps]
    assert summary["timing"]["window"] == window and summary["timing"]["step_time_s"]["mean"] == pytest.approx(mean)
    number, lines = (1, [1, 3]) if choice == "1" else (2, [4, 5])
    assert summary["environment"]["imported_segment"] == {"number": number, "of": 2, "steps": [steps[0][0], 45],
                                                          "lines": lines}
    assert f"read segment {number} of 2 (steps {steps[0][0]}-45, {len(steps)} printed, lines {lines[0]}-{lines[1]}): " \
           "the job restarted into this log (--segment picks another)" in err


def test_real_nemo2_log_reprinting_steps_after_a_restart(tmp_path, capsys):
    lines = (DATA / "nemo2_qwen3_8b_timestamped.log").read_text().splitlines(keepends=True)  # steps 528-530
    resumed = [lines[1].replace("2.443", "3.5"), lines[2].replace("2.127", "2.25")]  # from the checkpoint at 527
    log = tmp_path / "nemo2.log"
    log.write_text("".join([*lines, lines[2], *resumed]))  # step 530 printed twice alike: the same step
    code, _, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    assert code == 2 and "1: steps 528-530, 3 printed, lines 1-3; 2: steps 529-530, 2 printed, lines 5-6, starting " \
        "where step 529 is printed again with different values (line 2: 2.443 s, line 5: 3.5 s)" in err
    code, _, err = run_import(capsys, log, "--warmup", "0", "--segment", "2", out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "nemo2")
    assert summary["timing"]["steps"] == [[529, 3.5], [530, 2.25]] and summary["batch"]["global_batch_size"] == 32


def test_megatron_process_start_after_a_step_starts_a_segment_that_resumes_forward(tmp_path, capsys):
    # checkpoint at 45, killed before the next print: the next process prints 71 on, no step again
    lines = MIXTRAL.read_text().splitlines(keepends=True)
    log = tmp_path / "forward.log"
    log.write_text("".join([MEGATRON_START, *lines[:3], MEGATRON_START, MEGATRON_START, *lines[3:]]))
    code, _, err = run_import(capsys, log, "--warmup", "0", out=tmp_path / "out")
    assert code == 2 and "1: steps 43-45, 3 printed, lines 2-4; 2: steps 71-73, 3 printed, lines 7-9, starting " \
        "where a process starts at line 6 (`> initializing torch distributed`)" in err  # the latest banner, once
    code, _, err = run_import(capsys, log, "--warmup", "0", "--segment", "last", out=tmp_path / "out")
    assert code == 0, err
    assert steps_of(summary_of(tmp_path / "out", "forward")) == [71, 72, 73]


def test_segments_of_one_rank_among_prefixed_ranks(tmp_path, capsys):
    # torchrun --tee: rank 0 prints the process start, ranks 3 and 7 their steps; the restart re-prints 561
    first = "".join(_real_megatron_line(f"[default{r}]: ", 1000.0 + r) + "\n" for r in (3, 7))
    again = "".join(_real_megatron_line(f"[default{r}]: ", 2000.0 + r) + "\n" for r in (3, 7))
    log = tmp_path / "torchrun.log"
    log.write_text(first + "[default0]: " + MEGATRON_START + again)
    code, _, err = run_import(capsys, log, "--window", "last", "--rank", "7", out=tmp_path / "out")
    assert code == 2 and "1: step 561, line 2; 2: step 561, line 5, starting where a process starts at line 3" in err
    code, _, err = run_import(capsys, log, "--window", "last", "--rank", "7", "--segment", "2", out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "torchrun")["timing"]["steps"] == [[561, 2.007]]
    assert "read rank 7 of 2 that print step lines" in err and "read segment 2 of 2 (step 561, line 5)" in err


@pytest.mark.parametrize("choice, said", [
    ("0", "--segment 0: not a segment (give a number from 1, the log's first, or last)"),
    ("-1", "--segment -1: not a segment"),
    ("abc", "--segment abc: not a segment"),
    ("1.5", "--segment 1.5: not a segment"),
    ("3", "--segment 3: the log has 2 segments: 1: steps 43-45, 3 printed, lines 1-3; 2: steps 44-45"),
])
def test_a_segment_the_log_lacks_is_refused(tmp_path, capsys, choice, said):
    log = requeued_megatron_log(tmp_path / "requeued.log")
    code, _, err = run_import(capsys, log, "--segment", choice, out=tmp_path / "out")
    assert code == 2 and said in err.strip().splitlines()[-1] and "Traceback" not in err
    if choice == "3":
        assert "(give a number from 1 to 2, or last)" in import_error_line(err, "requeued.log")


@pytest.mark.parametrize("choice", ["1", "last"])
def test_segment_of_a_log_without_a_restart(tmp_path, capsys, choice):
    code, _, err = run_import(capsys, MIXTRAL, "--warmup", "0", "--segment", choice, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "megatron_lm_mixtral_issue756")
    assert steps_of(summary) == [43, 44, 45, 71, 72, 73] and summary["environment"]["imported_segment"] is None
    assert "segment" not in err
    code, _, err = run_import(capsys, MIXTRAL, "--segment", "2", out=tmp_path)
    assert code == 2 and "--segment 2: the log has one segment (no restart found) (give a number from 1 to 1, or " \
        "last)" in import_error_line(err, "issue756")


def test_a_log_of_fifty_restarts_names_a_few_segments_and_the_count(tmp_path, capsys):
    log = requeued_megatron_log(tmp_path / "requeued.log", restarts=50)
    code, _, err = run_import(capsys, log, out=tmp_path / "out")
    line = import_error_line(err, "requeued.log")
    assert code == 2 and "51 segments" in line and "; 3: steps 44-45, 2 printed, lines 6-7, starting where" in line
    assert "; ... 47 more ...; 51: steps 44-45, 2 printed, lines 102-103, starting where" in line
    assert "4: steps" not in line and len(line) < 1200
    code, _, err = run_import(capsys, log, "--warmup", "1", "--segment", "51", out=tmp_path / "out")
    assert code == 0 and summary_of(tmp_path / "out", "requeued")["timing"]["steps"] == [[44, 6.049], [45, 6.149]]


def test_a_segment_with_no_step_after_its_warmup_says_so(tmp_path, capsys):
    log = requeued_megatron_log(tmp_path / "requeued.log")
    code, _, err = run_import(capsys, log, "--segment", "last", out=tmp_path / "out")  # warm-up 10 of its 2 steps
    assert code == 2 and ("requeued.log: segment 2 of 2 (steps 44-45, 2 printed, lines 4-5): no step left to measure: "
                          "it has steps 44 to 45, the first 10 are warm-up (give --warmup or --window)") in err


def test_segment_does_not_apply_to_mlperf_results(tmp_path, capsys):
    code = main(["import", str(MIXTRAL), "--format", "mlperf", "--segment", "1", "--output-dir", str(tmp_path)])
    assert code == 2 and "--segment do(es) not apply to --format mlperf" in capsys.readouterr().err


# ------------------------------------------------------------------------------- NeMo 1.x bars
def megatron_bar_log(path: Path, step_times: list[float], global_batch_size: int, validate_every: int = 0) -> None:
    """A NeMo 1.x log drawn by Lightning's real tqdm bar the way MegatronProgressBar drives it: at
    each step the bar moves to the new count and redraws (still showing the previous step's
    metrics), then takes the new metrics without drawing; validation redraws with fresh ones."""
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    with path.open("w") as f:
        bar = Tqdm(desc="Epoch 0", total=len(step_times), file=f, mininterval=0, bar_format=BAR_FORMAT)
        for global_step, seconds in enumerate(step_times):
            bar.n = global_step + 1
            bar.refresh()
            metrics = {"reduced_train_loss": 2.6, "global_step": float(global_step),
                       "consumed_samples": float((global_step + 1) * global_batch_size),
                       "train_step_timing in s": seconds}
            bar.set_postfix(metrics, refresh=False)
            if validate_every and (global_step + 1) % validate_every == 0:
                bar.set_postfix({**metrics, "val_loss": 2.8})
        bar.refresh()
        bar.close()


def test_nemo1_bar_past_step_999_keeps_every_step(tmp_path, capsys):
    # 1000 prints as 1e+3, 1995-2005 all as 2e+3; the same time every 7 steps; validation every 500
    times = [1.0 + (s % 7) / 100 for s in range(2600)]
    log = tmp_path / "slurm-77.out"
    megatron_bar_log(log, times, 128, validate_every=500)
    text = log.read_text()
    assert "global_step=1e+3" in text and "global_step=2e+3" in text and "consumed_samples=1.28e+5" in text
    code, _, err = run_import(capsys, log, "--warmup", "0", "--global-batch-size", "128", out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "slurm-77")
    assert summary["timing"]["steps"] == [[s + 1, times[s]] for s in range(2600)]
    assert summary["batch"]["global_batch_size"] == 128


def test_nemo1_bar_that_does_not_fit_the_given_batch_is_refused(tmp_path, capsys):
    log = tmp_path / "job.out"
    megatron_bar_log(log, [1.0] * 30, 128)
    code, _, err = run_import(capsys, log, "--global-batch-size", "256", out=tmp_path / "out")
    assert code == 2 and "--global-batch-size 256 but the log says 128" in import_error_line(err, "job.out")


def test_two_runs_in_one_log_are_refused_until_one_is_chosen(tmp_path, capsys):
    first, second = tmp_path / "a.out", tmp_path / "b.out"
    megatron_bar_log(first, [1.0] * 20, 8)
    megatron_bar_log(second, [2.0] * 20, 8)  # the job restarted from scratch into the same file
    log = tmp_path / "requeued.out"
    log.write_text(first.read_text() + "\n" + second.read_text())
    code, _, err = run_import(capsys, log, out=tmp_path / "out")
    line = import_error_line(err, "requeued.out")
    assert code == 2 and "1: steps 1-20, 20 printed, lines 4-23; 2: steps 1-20, 20 printed, lines 29-48, starting " \
        "where step 1 is printed again with different values (line 4: 1 s, line 29: 2 s)" in line
    code, _, err = run_import(capsys, log, "--segment", "2", out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "requeued")["timing"]["steps"] == [[s, 2.0] for s in range(1, 21)]


@pytest.mark.slow
def test_nemo1_bar_of_130000_steps_imports_all_of_them(tmp_path, capsys):
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    steps, batch = 130_000, 256
    log = tmp_path / "long.out"
    with log.open("w") as f:  # MegatronProgressBar's layout, numbers by Lightning's own Tqdm.format_num
        shown = ""
        for global_step in range(steps):
            f.write(f"\rEpoch 0:  50%|█████     | {global_step + 1}/{steps} [12:00<12:00{shown}]")
            shown = (f", reduced_train_loss=2.600, global_step={Tqdm.format_num(float(global_step))}, "
                     f"consumed_samples={Tqdm.format_num(float((global_step + 1) * batch))}, "
                     f"train_step_timing in s={Tqdm.format_num(1.0 + global_step % 5 / 100)}")
        f.write(f"\rEpoch 0: 100%|██████████| {steps}/{steps} [24:00<00:00{shown}]\n")
    assert "global_step=1.3e+5" in log.read_text()[-300:]
    code, _, err = run_import(capsys, log, "--warmup", "0", "--global-batch-size", "256", out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "long")
    assert steps_of(summary) == list(range(1, steps + 1)) and summary["timing"]["steps_measured"] == steps
    assert summary["timing"]["step_time_s"]["mean"] == pytest.approx(statistics.fmean(1.0 + s % 5 / 100
                                                                                      for s in range(steps)))


@pytest.mark.parametrize("text, low, high", [
    ("2e+3", 1995, 2005), ("1.2e+4", 11950, 12050), ("1.3e+5", 129500, 130500), ("99.00", 99, 99),
    ("12800.0", 12800, 12800), ("1e+5", 99500, 100500),
])
def test_tqdm_rounded_values_read_as_ranges_that_hold_every_value_printed_so(text, low, high):
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    assert tqdm_range(text) == (low, high)
    printed_so = [v for v in range(low - 3000, high + 3000) if Tqdm.format_num(float(v)) == text]
    assert printed_so and all(low <= v <= high for v in printed_so)


# ------------------------------------------------------------------------------- global batch
def test_batch_ramp_within_the_counted_steps_is_refused(tmp_path, capsys):
    lines = []
    for iteration in range(1, 31):
        batch = 32 if iteration <= 10 else 64 if iteration <= 20 else 128
        line = _real_megatron_line("", 1500.0).replace("561/", f"{iteration}/")
        lines.append(line.replace("global batch size:    32", f"global batch size: {batch:5d}"))
    log = tmp_path / "rampup.log"
    log.write_text("\n".join(lines) + "\n")
    code, _, err = run_import(capsys, log, out=tmp_path / "out")
    assert code == 2
    line = import_error_line(err, "rampup.log")
    assert "changes within the counted steps (64 at step 11, 128 at step 21): a batch-size ramp" in line
    assert "--window 21:" in line
    code, _, err = run_import(capsys, log, "--window", "21:", out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "rampup")["batch"]["global_batch_size"] == 128


def test_megatron_lines_without_the_batch_state_it_through_consumed_samples(tmp_path, capsys):
    """A real log (log interval 5) whose lines end after the throughput: consumed samples 51200, 56320,
    61440 at iterations 50, 55, 60 make 1024 a step. Half of it given is refused, not half the tokens/s."""
    log = DATA / "megatron_deepseek_v2_lite_no_trailing_fields.log"
    common = ("--warmup", "0", "--seq-length", "4096", "--num-gpus", "8")
    code, _, err = run_import(capsys, log, *common, "--global-batch-size", "512", out=tmp_path)
    assert code == 2
    assert ("--global-batch-size 512 but the log says 1024 (line 2, from `global batch size:`, or `consumed samples:` "
            "from one printed iteration to the next)") in import_error_line(err, "deepseek")
    code, _, err = run_import(capsys, log, *common, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    assert summary["batch"]["global_batch_size"] == 1024
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(1024 * 4096 / ((61674.3 + 61614.9 + 61681.5) / 3e3))
    uneven = tmp_path / "uneven.log"  # 5121 samples over 5 iterations is no whole batch: stated nowhere
    uneven.write_text(log.read_text().replace("56320", "56321").replace("61440", "61442"))
    code, _, err = run_import(capsys, uneven, *common, out=tmp_path)
    assert code == 2 and "does not state the global batch size" in import_error_line(err, "uneven")


def test_iterations_printed_unevenly_apart_are_warned_about(tmp_path, capsys):
    """The issue's excerpt keeps iterations 43-45 and 71-73: each printed time is one sample, the 26
    iterations between them are not in the log. A whole log (every 5 iterations) gets no warning."""
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", "--warmup", "0", out=tmp_path)
    assert code == 0, err
    assert "warning: the counted iterations are printed unevenly, 1, 26 apart (lines missing from the log?)" in err
    code, _, err = run_import(capsys, DATA / "megatron_deepseek_v2_lite_no_trailing_fields.log", "--warmup", "0",
                              "--seq-length", "4096", out=tmp_path)
    assert code == 0 and "unevenly" not in err, err


def test_a_window_between_two_printed_iterations_says_which_are_printed(tmp_path, capsys):
    log = DATA / "megatron_deepseek_v2_lite_no_trailing_fields.log"  # iterations 50, 55 and 60
    code, _, err = run_import(capsys, log, "--seq-length", "4096", "--num-gpus", "8", "--window", "51:55",
                              out=tmp_path)
    assert code == 2
    assert ("--window 51:55 selects none (the log prints steps 50, 55, 60; a window A:B holds A to B-1)"
            in import_error_line(err, "deepseek"))


def test_a_log_that_states_no_batch_needs_it_given(tmp_path, capsys):
    log = tmp_path / "bare.log"
    log.write_text("".join(f" iteration {i:8d}/      50 | elapsed time per iteration (ms): 1500.0 |\n"
                           for i in range(1, 21)))
    code, _, err = run_import(capsys, log, out=tmp_path / "out")
    assert code == 2 and "does not state the global batch size (give --global-batch-size)" in import_error_line(err, "bare")
    code, _, err = run_import(capsys, log, "--global-batch-size", "64", out=tmp_path / "out")
    assert code == 0 and summary_of(tmp_path / "out", "bare")["batch"]["global_batch_size"] == 64


# ------------------------------------------------------------------------------- bad step times
def test_bad_step_times_are_left_out_and_counted(tmp_path, capsys):
    times = ["1.5", "nan", "1.5", "inf", "0", "-1.5", "1.5", "2.5", "1e30"]  # 1e30: no run's, a corrupt value
    log = tmp_path / "nemo2.log"
    log.write_text("".join(f"Training epoch 0, iteration {s}/99 | global_batch_size: 8 | global_step: {s} | "
                           f"train_step_timing in s: {t}\n" for s, t in enumerate(times)))
    code, _, err = run_import(capsys, log, "--warmup", "0", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 0, err
    assert ("warning: 5 step time(s) left out, zero, negative, NaN, infinite or over a day: 2 (nan s), 4 (inf s), "
            "5 (0 s), 6 (-1.5 s), 9 (1e+30 s)") in err
    timing = summary_of(tmp_path / "out", "nemo2")["timing"]
    assert timing["excluded_step_times"] == {"count": 5, "steps": [[2, "nan"], [4, "inf"], [5, "0.0"], [6, "-1.5"],
                                                                  [9, "1e+30"]]}
    assert timing["steps_measured"] == 4 and timing["step_time_s"]["mean"] == pytest.approx(7 / 4)


def test_nan_in_a_tqdm_bar_is_counted_not_dropped(tmp_path, capsys):
    log = tmp_path / "bar.out"
    megatron_bar_log(log, [1.0, 1.0, math.nan, 1.0, 1.0], 8)
    assert "train_step_timing in s=nan.0" in log.read_text()
    code, _, err = run_import(capsys, log, "--warmup", "0", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 0, err
    timing = summary_of(tmp_path / "out", "bar")["timing"]
    assert timing["excluded_step_times"]["count"] == 1 and steps_of({"timing": timing}) == [1, 2, 4, 5]


# ------------------------------------------------------------------------------- binary input
def test_an_image_is_a_clear_error(tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image = tmp_path / "plot.png"
    plt.plot([1, 2]), plt.savefig(image), plt.close()
    code, _, err = run_import(capsys, image, "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2 and "binary data (NUL bytes), not a text log" in import_error_line(err, "plot.png")


def test_random_bytes_are_a_clear_error(tmp_path, capsys):
    noise = bytes(b for b in os.urandom(300_000) if b)[:200_000]
    log = tmp_path / "noise.out"
    log.write_bytes(noise)
    code, _, err = run_import(capsys, log, "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2 and "not UTF-8 text" in import_error_line(err, "noise.out")


def test_a_file_named_like_an_event_file_that_is_not_one(tmp_path, capsys):
    fake = tmp_path / "events.out.tfevents.1700000000.node01"
    fake.write_text(MEGATRON_LINE * 5)
    code, _, err = run_import(capsys, fake, "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2
    assert "not a readable TensorBoard event file: record 1's header checksum does not match" in import_error_line(
        err, fake.name)


def test_an_event_file_cut_short_is_a_clear_error(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "tb")
    for step in range(20):
        writer.add_scalar("train_step_timing in s", 1.25, step)
    writer.close()
    (event,) = (tmp_path / "tb").glob("*tfevents*")
    event.write_bytes(event.read_bytes()[:-7])
    code, _, err = run_import(capsys, tmp_path / "tb", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2 and "is cut short" in import_error_line(err, event.name)


@pytest.mark.parametrize("name", ["megatron_lm_mixtral_issue756.log", "nemo2_evo2_finetune_notebook.log",
                                  "nemo1_dgxc_llama31_70b_last_step.out"])
def test_a_real_log_with_crlf_line_ends_reads_as_the_same_steps(tmp_path, capsys, name):
    """A log saved on Windows, or passed through a tool that writes CRLF: each \\r before a \\n must not
    read as a progress bar's redraw that hides or doubles a step."""
    crlf = tmp_path / f"crlf_{name}"
    crlf.write_bytes((DATA / name).read_bytes().replace(b"\n", b"\r\n"))
    steps = []
    for log, out in ((DATA / name, tmp_path / "lf"), (crlf, tmp_path / "crlf")):
        code, _, err = run_import(capsys, log, "--warmup", "0", "--global-batch-size", "4" if "evo2" in name else "128",
                                  out=out)
        assert code == 0, err
        steps.append(summary_of(out, log.stem)["timing"]["steps"])
    assert steps[0] == steps[1] and steps[0]


def test_a_huge_line_without_breaks_is_read_in_bounded_memory(tmp_path, capsys):
    import tracemalloc

    log = tmp_path / "huge.out"
    with log.open("w") as f:
        for _ in range(48):
            f.write("x" * (1 << 20))  # 48 MiB without a line break, then a real step line
        f.write("\n" + MEGATRON_LINE)
    tracemalloc.start()
    code, _, err = run_import(capsys, log, "--window", "last", out=tmp_path / "out")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert code == 0, err
    assert peak < 16 << 20  # the file is 48 MiB
    assert summary_of(tmp_path / "out", "huge")["timing"]["steps"] == [[10, 1.5]]


def test_a_long_run_s_log_is_read_in_linear_time(tmp_path):
    """A real iteration line repeated for 50,000 iterations (a long run at --log-interval 1). The
    cross-check once compared every line with every other (quadratic: minutes here, hours at a
    million); the limit is a guard some 20 times what a linear read takes, not a timing figure."""
    line = next(text for text in (DATA / "megatron_lm_mixtral_issue756.log").read_text().splitlines()
                if "elapsed time per iteration" in text)
    log = tmp_path / "long.log"
    with log.open("w") as f:
        for iteration in range(1, 50_001):
            f.write(re.sub(r"iteration\s+\d+/", f"iteration {iteration:8d}/", line) + "\n")
    result = nemo_throughput_cli("import", log, "--label", "x", "--model", "mixtral-8x7b", "--seq-length", "2048",
                                 "--num-gpus", "16", "--output-dir", tmp_path / "out", timeout=60)
    assert result.returncode == 0, result.stderr
    summary = summary_of(tmp_path / "out", "long")
    assert summary["timing"]["steps_measured"] == 50_000 - 10
    assert summary["model"]["flops_crosscheck"][0]["lines"] == 50_000


def test_a_long_read_says_how_far_it_is(tmp_path, capsys, monkeypatch):
    """A pass over a million-step log takes a minute: every PROGRESS_EVERY_S (here every chunk read) a
    line on stderr says how far it is; a file read sooner says nothing."""
    from nemo_throughput.importers import lines

    log = tmp_path / "long.log"
    log.write_text("".join(MEGATRON_LINE.replace("      10/", f"{i:8d}/") for i in range(1, 20_001)))
    code, _, err = run_import(capsys, log, "--window", "-10:", out=tmp_path / "quiet")
    assert code == 0 and "still reading" not in err
    monkeypatch.setattr(lines, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(lines, "CHUNK_BYTES", log.stat().st_size // 2 + 1)
    code, _, err = run_import(capsys, log, "--window", "-10:", out=tmp_path / "out")
    assert code == 0, err
    said = [line for line in err.splitlines() if "still reading" in line]
    megabytes = round(log.stat().st_size / 1e6)
    assert said[:2] == [f"nemo-throughput import: {log}: still reading: 50% of its {megabytes} MB in this pass",
                        f"nemo-throughput import: {log}: still reading: 100% of its {megabytes} MB in this pass"]
    assert len(said) % 2 == 0  # two chunks a pass, every pass said


def test_how_far_a_read_is_when_its_file_is_cut_or_removed_meanwhile(tmp_path, capsys, monkeypatch):
    """A log truncated (logrotate's copytruncate) or removed while a pass reads it: the bytes read are
    said, never a division by its size of 0, never an error that stops the import."""
    from nemo_throughput.importers import lines

    monkeypatch.setattr(lines, "PROGRESS_EVERY_S", 0.0)
    log = tmp_path / "rotated.log"
    log.write_text("x" * 3_000_000)
    progress = lines._Progress(log)
    progress.read(1_500_000)
    log.write_text("")  # truncated
    progress.read(1_500_000)
    log.unlink()
    progress.read(1_000_000)
    said = capsys.readouterr().err.splitlines()
    assert said == [f"nemo-throughput import: {log}: still reading: 50% of its 3 MB in this pass",
                    f"nemo-throughput import: {log}: still reading: 3 MB read in this pass",
                    f"nemo-throughput import: {log}: still reading: 4 MB read in this pass"]


# ------------------------------------------------------------------------------- output names
def test_inputs_with_the_same_file_name_get_their_own_summaries(tmp_path, capsys):
    for run, ms in (("a", 1000.0), ("b", 2000.0)):
        (tmp_path / run).mkdir()
        (tmp_path / run / "slurm.out").write_text(MEGATRON_LINE.replace("1500.0", f"{ms:.1f}"))
    code, out, err = run_import(capsys, [tmp_path / "a" / "slurm.out", tmp_path / "b" / "slurm.out"],
                                "--window", "last", out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "a-slurm")["timing"]["steps"] == [[10, 1.0]]
    assert summary_of(tmp_path / "out", "b-slurm")["timing"]["steps"] == [[10, 2.0]]
    assert summary_of(tmp_path / "out", "a-slurm")["run"]["name"] == "a-slurm"


def test_two_tensorboard_version_dirs_do_not_overwrite_each_other(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    for run, seconds in (("x", 1.0), ("y", 3.0)):
        writer = SummaryWriter(tmp_path / run / "version_0")
        for step in range(12):
            writer.add_scalar("train_step_timing in s", seconds, step)
        writer.close()
    code, _, err = run_import(capsys, [tmp_path / "x" / "version_0", tmp_path / "y" / "version_0"],
                              "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x-version_0", "y-version_0"]
    assert summary_of(tmp_path / "out", "y-version_0")["timing"]["step_time_s"]["mean"] == 3.0


def test_nothing_is_written_outside_the_output_dir(tmp_path, capsys):
    inside = tmp_path / "logs" / ".." / "logs"
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "..job.out"
    log.write_text(MEGATRON_LINE)
    out = tmp_path / "deep" / "out"
    code, _, err = run_import(capsys, inside / "..job.out", "--window", "last", out=out)
    assert code == 0, err
    assert [p.name for p in out.iterdir()] == ["job"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "logs"]
    # a link inside --output-dir that points elsewhere is not followed
    (out / "elsewhere").mkdir(parents=True)
    (out / "job").rename(tmp_path / "moved")
    (out / "job").symlink_to(tmp_path / "moved")
    code, _, err = run_import(capsys, log, "--window", "last", out=out)
    assert code == 2 and "would be written outside --output-dir" in import_error_line(err, "job")


def test_the_same_input_twice_is_refused(tmp_path, capsys):
    log = tmp_path / "job.out"
    log.write_text(MEGATRON_LINE)
    code, _, err = run_import(capsys, [log, tmp_path / "." / "job.out"], out=tmp_path / "out")
    assert code == 2 and "given twice" in import_error_line(err, "job.out")


# ------------------------------------------------------------------------------- FLOPs per sample
def test_flops_per_sample_as_published_needs_no_model(tmp_path, capsys):
    log = DATA / "megatron_lm_mixtral_issue756.log"
    code, _, err = run_import(capsys, log, "--window", "last", "--flops-per-sample", "3.94e15", "--model-name",
                              "llama3.1-70b", "--gpu-name", "NVIDIA H100 80GB HBM3", "--dtype", "fp8",
                              out=tmp_path, model=())
    assert code == 0, err
    summary = summary_of(tmp_path, "megatron_lm_mixtral_issue756")
    # the log's own TFLOP/s say so too: 3.94e15 is 24 x what they stand for (tests/test_import_crosscheck.py)
    assert [c["verdict"] for c in summary["model"].pop("flops_crosscheck")] == ["disagree"]
    assert summary["model"] == {"name": "llama3.1-70b", "flops_per_sample": 3.94e15, "flops_formula": "user",
                                "spec": None, "mfu_convention": {"formula": "user", "causal_attention": None},
                                "flops_per_step": summary["batch"]["global_batch_size"] * 3.94e15,
                                "flops_count": "config"}
    assert summary["hardware"]["peak_tflops"] == 1979.0 and summary["hardware"]["peak_source"] == "table:H100 SXM"
    # 3.94e15 is Llama 3.1 70B's figure, not this Mixtral run's: 273 % of the H100's fp8 peak, so no MFU
    assert summary["throughput"]["mfu"] is None
    assert summary["throughput"]["mfu_above_peak"] == pytest.approx(128 * 3.94e15 / 5.8299 / 16 / 1979e12)
    assert (f"nemo-throughput import: {log}: warning: MFU computes to 273%, above the GPU's peak" in err
            and "the flops_per_sample given (3.94e+15: per sample, not per batch?)" in err)
    run = load_run(tmp_path / "megatron_lm_mixtral_issue756" / "summary.json")
    assert run.flops_per_sample == 3.94e15


@pytest.mark.parametrize("value", ["0", "-1e15", "nan", "inf"])
def test_flops_per_sample_must_be_a_positive_finite_number(tmp_path, capsys, value):
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", f"--flops-per-sample={value}",
                              out=tmp_path, model=())
    assert code == 2 and "--flops-per-sample" in err and "positive finite number" in err


@pytest.mark.parametrize("value, tokens", [("3.94", "2,048"), ("1.2e4", "2,048")])
def test_flops_per_sample_in_tflops_is_refused_naming_the_unit(tmp_path, capsys, value, tokens):
    """3.94 for a published 3.94e15: the MFU would be written 1e15 times too small, as if fine."""
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", "--flops-per-sample", value,
                              "--model-name", "m", "--peak-tflops", "989", out=tmp_path, model=())
    assert code == 2 and "Traceback" not in err, err
    assert f"flops_per_sample {float(value):g} is less than 6 FLOPs per token of a {tokens}-token sample" in err
    assert "not TFLOPs or GFLOPs" in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("extra, said", [
    # 10**20 GPUs divided every figure per GPU (an MFU of 1e-21), a typo's seq length multiplied tokens/s
    (("--num-gpus", "100000000000000000000"), "--num-gpus 100000000000000000000: give a count from 1 to 1,000,000"),
    (("--seq-length", "99999999999"), "--seq-length must be at most 16,777,216, got 99999999999"),
    # 12 GPUs on nodes of 8 was recorded as 2 nodes without a word: a wrong count, or nodes of another size
    (("--num-gpus", "12"), "--num-gpus 12 is no whole number of nodes of --gpus-per-node 8 (the default): give the "
                           "GPUs each node ran with --gpus-per-node, or correct --num-gpus"),
    (("--num-gpus", "24", "--gpus-per-node", "16"), "--num-gpus 24 is no whole number of nodes of --gpus-per-node 16:"),
])
def test_counts_no_run_has_are_refused_naming_the_option(tmp_path, capsys, extra, said):
    log = tmp_path / "job.out"
    log.write_text(MEGATRON_LINE)
    code, _, err = run_import(capsys, log, "--warmup", "0", "--flops-per-sample", "1e15", *extra, out=tmp_path / "out")
    assert code == 2 and "Traceback" not in err and said in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, nodes", [(("--num-gpus", "12", "--gpus-per-node", "6"), 2), (("--num-gpus", "4"), 1)])
def test_gpus_that_fill_whole_nodes_or_part_of_one_are_imported(tmp_path, capsys, extra, nodes):
    log = tmp_path / "job.out"
    log.write_text(MEGATRON_LINE)
    code, _, err = run_import(capsys, log, "--warmup", "0", *extra, out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "job")["hardware"]["num_nodes"] == nodes


def test_a_model_spec_whose_seq_length_is_not_the_one_given_is_refused(tmp_path, capsys):
    """--seq-length replaced the spec's own 4096 without a word: the FLOPs of another sequence length."""
    spec = json.dumps({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
                       "seq_length": 4096})
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", out=tmp_path,
                              model=("--model-spec", spec))
    assert code == 2 and "--seq-length 2048 and --model-spec's seq_length 4096 disagree: give one of them" in err
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", out=tmp_path,
                              model=("--model-spec", spec.replace("4096", "2048")))
    assert code == 0, err


@pytest.mark.parametrize("extra, said", [
    (("--gpu-name", "NVIDIA H100 80GB HBM3"), "--gpu-name without --dtype (bf16, fp8, ...) names no peak"),
    (("--dtype", "bf16"), "--dtype without --gpu-name names no peak"),
])
def test_half_of_what_the_peak_needs_is_said_not_left_a_null_mfu(tmp_path, capsys, extra, said):
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", *extra, out=tmp_path)
    assert code == 0, err
    assert f"warning: no MFU: {said} to divide by (give both, or --peak-tflops)" in err
    assert summary_of(tmp_path, "megatron_lm_mixtral_issue756")["throughput"]["mfu"] is None


@pytest.mark.parametrize("peak, said", [
    ("7916", "peak_tflops 7916 is 8x the table's 989.5 for H100 SXM at bf16: a node's peak rather than one GPU's, "
             "a sparse figure, or another dtype's? MFU divides by the 7916 given."),
    ("1979", "peak_tflops 1979 is 2x the table's 989.5 for H100 SXM at bf16"),  # the sparse figure
    ("900", None),  # a measured or power-capped peak: near the table's
])
def test_a_peak_far_from_the_table_s_for_the_gpu_is_said(tmp_path, peak, said):
    """A node's peak (8 x 989.5) divided the MFU by 8 without a word."""
    result, out = import_cli(DATA / "megatron_lm_mixtral_issue756.log", "--gpu-name", "NVIDIA H100 80GB HBM3",
                             "--dtype", "bf16", "--peak-tflops", peak, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (said in result.stderr) if said else "the table's" not in result.stderr, result.stderr
    hardware = summary_of(out, "megatron_lm_mixtral_issue756")["hardware"]
    assert (hardware["peak_tflops"], hardware["peak_source"]) == (float(peak), "user")


@pytest.mark.parametrize("factor, said", [(1 / 2048, "per token rather than per sample?"), (1e-9, "in GFLOPs?"),
                                          (1.0, None)])
def test_flops_per_sample_far_from_the_model_s_count_is_said(tmp_path, capsys, factor, said):
    """A count per token (or in GFLOPs) passes the 6-per-token floor with a real model, and made MFU 2048x
    (1e9x) too small without a word; the model's shape is there to hold it against."""
    spec = ModelSpec.from_dict({**preset("mixtral-8x7b").to_dict(), "seq_length": 2048})
    given = model_flops_per_sample(spec, "megatron") * factor
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", "--flops-per-sample", given,
                              out=tmp_path, model=("--model", "mixtral-8x7b"))
    assert code == 0, err
    assert (f"warning: flops_per_sample {given:.4g} is " in err and f": {said} MFU divides by" in err) if said \
        else "warning: flops_per_sample" not in err, err
    assert summary_of(tmp_path, "megatron_lm_mixtral_issue756")["model"]["flops_per_sample"] == pytest.approx(given)


def test_the_model_or_its_flops_must_be_given(tmp_path, capsys):
    code, _, err = run_import(capsys, DATA / "megatron_lm_mixtral_issue756.log", out=tmp_path, model=())
    assert code == 2 and "--flops-per-sample" in err and "--model" in err


# ------------------------------------------------------------------------------- end to end
def test_errors_from_the_installed_command_are_one_line(tmp_path):
    image = tmp_path / "events.out.tfevents.1.host"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64)
    result = nemo_throughput_cli("import", image, "--label", "x", "--model", "gpt3-126m", "--seq-length", "8",
                                 "--num-gpus", "8", "--global-batch-size", "8", "--output-dir", tmp_path / "out",
                                 timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"nemo-throughput import: {image}: not a readable TensorBoard event file")


def test_window_takes_a_negative_start_as_its_own_argument(tmp_path, capsys):
    log = tmp_path / "w.log"
    log.write_text("".join(MEGATRON_LINE.replace("10/", f"{i}/").replace("1500.0", f"{1000.0 + i:.1f}")
                           for i in range(1, 31)))
    code, _, err = run_import(capsys, log, "--window", "-10:", out=tmp_path / "out")
    assert code == 0, err
    timing = summary_of(tmp_path / "out", "w")["timing"]
    assert timing["window"] == "-10:" and timing["step_time_s"]["mean"] == pytest.approx(1.0255)


@pytest.mark.parametrize("window, said", [
    # -0 is 0: every step was measured, the warm-up too, under a window that reads "the last none"
    ("-0:", "--window '-0:' counts no step from the end: give -N: with N at least 1 (the last N steps), or 0: for "
            "every step"),
    ("-5:10", "--window '-5:10' selects no step: A:B needs 0 <= A < B"),  # was argparse's "expected one argument"
])
def test_a_window_from_the_end_that_selects_nothing_is_refused_naming_it(tmp_path, capsys, window, said):
    log = tmp_path / "w.log"
    log.write_text("".join(MEGATRON_LINE.replace("10/", f"{i}/") for i in range(1, 31)))
    code, _, err = run_import(capsys, log, "--window", window, out=tmp_path / "out")
    assert code == 2 and f"nemo-throughput import: {said}" in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- moved from test_report.py
NEMO1_LOG = "".join(  # tqdm progress bar as NeMo 1.x prints it into a Slurm .out: \r between refreshes
    f"Epoch 0: :  {s}%|          | {s + 1}/50 [00:{s:02d}<00:30, reduced_train_loss=10.{s:02d}, global_step={s}.000, "
    f"consumed_samples={128 * (s + 1)}.0, train_step_timing in s={3.0 + (0.5 if s < 10 else 0.01 * (s % 3)):.3f}]\r"
    for s in range(50)) + "\n`Trainer.fit` stopped: `max_steps=50` reached.\n"
NEMO2_LOG = "\n".join(  # NeMo 2's ProgressPrinter
    f"Training epoch 0, iteration {s}/49 | lr: 0.0003 | global_batch_size: 256 | global_step: {s} | "
    f"reduced_train_loss: 9.{s:02d} | train_step_timing in s: {2.0 if s < 35 else 2.5} | "
    f"consumed_samples: {256 * (s + 1)}" for s in range(50)) + "\n"
MEGATRON_LOG = "\n".join(
    f" [2026-11-20 10:00:{s % 60:02d}.000000] iteration {s:8d}/{50:8d} | consumed samples: {128 * s:12d} | "
    f"elapsed time per iteration (ms): {1500.0 + s:.1f} | throughput per GPU (TFLOP/s/GPU): 400.1 | "
    f"learning rate: 3.000000E-04 | global batch size:   128 | lm loss: 8.000000E+00 | loss scale: 1.0 | "
    f"grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    for s in range(1, 51)) + "\n"


def import_cli(log, *extra, tmp_path):
    out = tmp_path / "imported"
    result = nemo_throughput_cli("import", log, "--label", "bare-metal", "--model", "gpt3-126m", "--seq-length",
                                 "2048", "--num-gpus", "16", "--output-dir", out, *extra, timeout=120)
    return result, out


def test_import_nemo1_progress_bar_log(tmp_path):
    log = tmp_path / "slurm-1234.out"
    log.write_text(NEMO1_LOG)
    result, out = import_cli(log, "--global-batch-size", "128", "--gpu-name", "NVIDIA H100 80GB HBM3",
                             "--dtype", "bf16", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "slurm-1234" / "summary.json").read_text())
    timing = summary["timing"]
    assert summary["run"]["source"] == "import:nemo" and summary["run"]["label"] == "bare-metal"
    assert [s[0] for s in timing["steps"]] == list(range(1, 51))  # global_step 0..49 -> steps 1..50
    assert timing["window"] == "11:" and timing["steps_measured"] == 40  # default: after 10 warm-up steps
    expected = statistics.fmean(3.0 + 0.01 * (s % 3) for s in range(10, 50))
    assert timing["step_time_s"]["mean"] == pytest.approx(expected)
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(128 * 2048 / expected)
    assert summary["hardware"]["num_nodes"] == 2 and summary["throughput"]["mfu"] is not None
    assert summary["model"]["name"] == "gpt3-126m"
    assert summary["model"]["flops_per_sample"] == model_flops_per_sample(preset("gpt3-126m"))


def test_import_nemo2_log_with_the_recipe_window(tmp_path, capsys):
    log = tmp_path / "nemo2.log"
    log.write_text(NEMO2_LOG)
    code, _, err = run_import(capsys, log, "--global-batch-size", "256", "--window", "36:46", out=tmp_path / "imported")
    assert code == 0, err
    timing = summary_of(tmp_path / "imported", "nemo2")["timing"]
    assert timing["window"] == "36:46" and timing["steps_measured"] == 10  # iterations 35-44
    assert timing["step_time_s"]["mean"] == 2.5
    # and the report can pick another window from the steps kept in the summary
    run = load_run(tmp_path / "imported" / "nemo2" / "summary.json", Window.parse("1:11"))
    assert run.step_time_s == 2.0


def test_import_megatron_log_reads_the_global_batch_from_it(tmp_path, capsys):
    log = tmp_path / "megatron.log"
    log.write_text(MEGATRON_LOG)
    code, _, err = run_import(capsys, log, "--window", "last", out=tmp_path / "imported")
    assert code == 0, err
    summary = summary_of(tmp_path / "imported", "megatron")
    assert summary["batch"]["global_batch_size"] == 128
    assert summary["timing"]["step_time_s"]["mean"] == pytest.approx(1.550)  # iteration 50: 1550 ms
    code, _, err = run_import(capsys, log, "--global-batch-size", "256", out=tmp_path / "imported")
    assert code == 2 and "--global-batch-size 256 but the log says 128" in err


def test_import_tensorboard_events_written_by_the_real_writer(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "tb" / "version_0")
    for step in range(30):  # as Lightning's TensorBoardLogger logs NeMo's TimingCallback
        writer.add_scalar("train_step_timing in s", 4.0 if step < 10 else 1.25, step)
        writer.add_scalar("reduced_train_loss", 10.0 - step / 10, step)
    writer.close()
    code, _, err = run_import(capsys, tmp_path / "tb", "--global-batch-size", "64", out=tmp_path / "imported")
    assert code == 0, err
    summary = summary_of(tmp_path / "imported", "tb")
    assert summary["run"]["source"] == "import:tensorboard"
    assert steps_of(summary) == list(range(1, 31))
    assert summary["timing"]["step_time_s"]["mean"] == 1.25  # steps 11-30


def test_tensorboard_events_of_a_run_resumed_or_without_step_times_are_refused_saying_what_to_give(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    for segment, steps, seconds in ((0, range(20), 2.0), (1, range(10, 30), 3.0)):  # resumed at step 10
        writer = SummaryWriter(tmp_path / "resumed" / f"version_{segment}")
        for step in steps:
            writer.add_scalar("train_step_timing in s", seconds, step)
        writer.close()
    code, _, err = run_import(capsys, tmp_path / "resumed", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2
    assert ("2 segments, as a job restarted into the same log prints them: 1: steps 1-20, 20 printed, values 1-20; "
            "2: steps 11-30, 20 printed, values 21-40, starting where step 11 is printed again with different values "
            "(value 11: 2 s, value 21: 3 s) (import one with --segment N, from 1, or --segment last; or import each "
            "event file on its own)") in import_error_line(err, "resumed")
    code, _, err = run_import(capsys, tmp_path / "resumed", "--global-batch-size", "8", "--segment", "last",
                              out=tmp_path / "out")
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "resumed")  # its own warm-up: steps 11-20 of the resumed run
    assert summary["timing"]["steps"] == [[s, 3.0] for s in range(11, 31)] and summary["timing"]["window"] == "21:"
    assert summary["environment"]["imported_segment"] == {"number": 2, "of": 2, "steps": [11, 30], "values": [21, 40]}
    writer = SummaryWriter(tmp_path / "loss-only")
    writer.add_scalar("reduced_train_loss", 2.5, 0)
    writer.close()
    code, _, err = run_import(capsys, tmp_path / "loss-only", "--global-batch-size", "8", out=tmp_path / "out")
    assert code == 2 and "no `train_step_timing in s` scalar in its event files" in import_error_line(err, "loss-only")


def test_tensorboard_events_state_the_batch_through_nemo_s_global_batch_size_scalar(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "tb" / "version_0")
    for step in range(30):  # NeMo 2 logs both at every step (its data sampler the batch)
        writer.add_scalar("global_batch_size", 64.0, step)
        writer.add_scalar("train_step_timing in s", 2.0, step)
    writer.close()
    odd = SummaryWriter(tmp_path / "odd")  # batches that are no batch size state none, and break nothing
    for step, batch in enumerate((math.inf, math.nan, -64.0, 0.5, 64.5)):
        odd.add_scalar("global_batch_size", batch, step)
        odd.add_scalar("train_step_timing in s", 2.0, step)
    odd.close()
    code, _, err = run_import(capsys, tmp_path / "odd", "--warmup", "0", out=tmp_path / "imported")
    assert code == 2 and "does not state the global batch size" in import_error_line(err, "odd")
    code, _, err = run_import(capsys, tmp_path / "tb", "--global-batch-size", "128", out=tmp_path / "imported")
    assert code == 2
    assert ("--global-batch-size 128 but the log says 64 (step 11, from the `global_batch_size` scalar)"
            in import_error_line(err, "tb"))
    code, _, err = run_import(capsys, tmp_path / "tb", out=tmp_path / "imported")
    assert code == 0, err
    summary = summary_of(tmp_path / "imported", "tb")
    assert summary["batch"]["global_batch_size"] == 64
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(64 * 2048 / 2.0)


@pytest.mark.parametrize("content, message", [
    ("just some text\n", "no step lines: neither NeMo's `train_step_timing in s` nor Megatron-LM's"),
    ("Epoch 0: train_step_timing in s=3.2 without a step number\n", "no global_step, so no step number"),
])
def test_import_of_a_log_without_step_lines_names_the_file(tmp_path, capsys, content, message):
    log = tmp_path / "job.out"
    log.write_text(content)
    code, _, err = run_import(capsys, log, "--global-batch-size", "8", out=tmp_path / "imported")
    assert code == 2 and message in import_error_line(err, "job.out")


def test_import_needs_the_facts_the_log_lacks(tmp_path, capsys):
    log = tmp_path / "nemo1.out"
    log.write_text(NEMO1_LOG.replace("consumed_samples", "other"))  # no consumed_samples: no batch in the log
    code, _, err = run_import(capsys, log, out=tmp_path / "imported")
    assert code == 2 and "give --global-batch-size" in err
    code = main(["import", str(log), "--label", "x", "--model", "gpt5", "--seq-length", "8", "--num-gpus", "8",
                 "--global-batch-size", "8", "--output-dir", str(tmp_path / "imported")])
    assert code == 2 and "Unknown model preset 'gpt5'" in capsys.readouterr().err


# ------------------------------------------------------------------ AMD Primus (Megatron on ROCm)
def test_real_primus_line_reads_this_interval_not_the_running_average(tmp_path, capsys):
    # AMD-AGI/Primus-SaFE: `elapsed time per iteration (ms): 2701.3/2712.7` on rank 31 of 32, 4096 tokens
    log = DATA / "primus_safe_rank31of32.log"
    code, _, err = run_import(capsys, log, "--seq-length", "4096", "--num-gpus", "32", "--window", "last",
                              out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "primus_safe_rank31of32")
    assert summary["timing"]["steps"] == [[12125, pytest.approx(2.7013)]]  # not the average 2712.7 ms
    assert summary["batch"]["global_batch_size"] == 256
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(4096 * 256 / 2.7013)
    # the log's own 12130.4 tokens/s/GPU is ours per GPU, up to its rounding
    assert summary["throughput"]["tokens_per_s"] / 32 == pytest.approx(12130.4, abs=0.1)
    assert (f"nemo-throughput import: {log}: the log's own tokens/s per GPU agree with --seq-length 4096 and "
            "--num-gpus 32 (1 line(s) checked)") in err.splitlines()


def test_real_primus_tokens_per_gpu_that_disagree_with_the_given_facts_are_refused(tmp_path, capsys):
    log = DATA / "primus_safe_rank63of64.log"  # 64 GPUs, 4096 tokens, 246.7 tokens/s/GPU
    code, _, err = run_import(capsys, log, "--seq-length", "4096", "--num-gpus", "32", "--window", "last",
                              out=tmp_path)
    assert code == 2
    line = import_error_line(err, log.name)
    assert "the log states 246.7 tokens/s per GPU at iteration 424" in line and "--num-gpus 32 is 493.5" in line
    assert not (tmp_path / "primus_safe_rank63of64").exists()
    code, _, err = run_import(capsys, log, "--seq-length", "4096", "--num-gpus", "64", "--window", "last",
                              out=tmp_path)
    assert code == 0, err


@pytest.mark.parametrize("name, window", [("nemo2_qwen3_8b_timestamped.log", "0:"),
                                          ("nemo1_dgxc_llama31_70b_last_step.out", "last"),
                                          ("megatron_lm_mixtral_issue756.log", "0:")])
def test_terminal_control_sequences_inside_real_step_lines_change_nothing(tmp_path, capsys, name, window):
    """Every number coloured, as a console logger or FORCE_COLOR prints it, and tqdm's erase-line
    sequence before each line: the same steps and times as the plain log (before: NeMo's lines
    were not found, or a field was refused)."""
    plain = (DATA / name).read_text()
    coloured = tmp_path / f"coloured_{name}"
    coloured.write_text("\n".join("\x1b[2K" + re.sub(r"\d+(?:\.\d+)?", "\x1b[1;32m\\g<0>\x1b[0m", line)
                                  for line in plain.split("\n")))
    runs = []
    for log in (DATA / name, coloured):
        code, _, err = run_import(capsys, log, "--warmup", "0", "--window", window, out=tmp_path / log.stem)
        assert code == 0, err
        runs.append(summary_of(tmp_path / log.stem, log.stem))
    assert runs[1]["timing"]["steps"] == runs[0]["timing"]["steps"] and runs[0]["timing"]["steps"]
    assert runs[1]["throughput"] == runs[0]["throughput"]


def test_real_primus_log_with_colours_and_both_line_variants(tmp_path, capsys):
    # ROCm/cvs: iteration 2 in the single-value form, iteration 4 as `654.5/735.1` with
    # `tokens/s/GPU inst/harmonic mean:` after Primus' coloured logger prefix
    log = DATA / "primus_rocm_cvs_ansi.log"
    code, _, err = run_import(capsys, log, "--seq-length", "8192", "--num-gpus", "8", "--warmup", "0", out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, "primus_rocm_cvs_ansi")
    assert summary["timing"]["steps"] == [[2, pytest.approx(8.1467)], [4, pytest.approx(0.6545)]]
    assert "(1 line(s) checked)" in err


def test_a_primus_line_without_a_value_of_its_own_is_noted_not_dropped_silently(tmp_path, capsys):
    """A line printing only Primus' running average (`: /2712.7`): the average is never read as the
    interval's time, and the line is said to be left out."""
    line = (DATA / "primus_safe_rank31of32.log").read_text().splitlines()[0]
    blank = line.replace("12125/", "12120/").replace("2701.3/2712.7", "/2712.7")
    log = tmp_path / "primus.log"
    log.write_text(f"{blank}\n{line}\n")
    code, _, err = run_import(capsys, log, "--seq-length", "4096", "--num-gpus", "32", "--warmup", "0",
                              out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "primus")["timing"]["steps"] == [[12125, pytest.approx(2.7013)]]
    assert (f"nemo-throughput import: {log}: warning: 1 step line(s) print no `elapsed time per iteration (ms)` of "
            "their own, only Primus' running average after a `/` (line 1): left out, the average is never read"
            ) in err.splitlines()


def test_a_window_holding_one_printed_value_says_how_many_steps_it_measured(tmp_path, capsys):
    log = DATA / "megatron_lm_mixtral_issue756.log"  # its real lines, renumbered as a --log-interval 10 run's
    source = tmp_path / "interval10.log"
    lines = [line for line in log.read_text().splitlines() if "elapsed time per iteration" in line][:3]
    source.write_text("\n".join(re.sub(r"iteration\s+\d+/", f"iteration {10 * (i + 1):>8}/", line)
                                for i, line in enumerate(lines)) + "\n")  # iterations 10, 20, 30
    code, _, err = run_import(capsys, source, "--warmup", "0", "--window", "15:25", out=tmp_path / "out")
    assert code == 0, err
    assert (f"nemo-throughput import: {source}: --window 15:25 holds one printed value, the mean of the 10 "
            "iterations up to it (the log interval): it measures iterations 11-20, 10 steps, as one sample"
            ) in err.splitlines()


# ------------------------------------------------------------------ cut and odd inputs
def test_a_last_line_cut_while_being_written_is_not_read_as_a_step(tmp_path, capsys):
    text = (DATA / "megatron_lm_mixtral_issue756.log").read_bytes()
    cut = tmp_path / "running.log"
    cut.write_bytes(text[:text.rindex(b"5829.9") + 2])  # iteration 73's `5829.9` written as far as `58`
    code, _, err = run_import(capsys, cut, "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    assert steps_of(summary_of(tmp_path / "out", "running")) == [43, 44, 45, 71, 72]
    assert (f"nemo-throughput import: {cut}: warning: line 6, the last step line, looks cut (no line break, and not "
            "the end of a step line)") in err
    whole = tmp_path / "whole.log"
    whole.write_bytes(text.rstrip(b"\n"))  # complete up to its last `|`, only the line break missing
    code, _, err = run_import(capsys, whole, "--warmup", "0", out=tmp_path / "out")
    assert code == 0 and steps_of(summary_of(tmp_path / "out", "whole"))[-1] == 73 and "line 6" not in err


def test_a_log_whose_only_step_line_is_cut_says_so(tmp_path, capsys):
    text = (DATA / "primus_safe_rank31of32.log").read_bytes()
    cut = tmp_path / "running.log"
    cut.write_bytes(text[:text.index(b"2701.3") + 2])  # `2701.3/2712.7` written as far as `27`
    code, _, err = run_import(capsys, cut, "--seq-length", "4096", "--num-gpus", "32", out=tmp_path / "out")
    assert code == 2
    assert "its only step line, line 1 (the last), looks cut (no line break" in import_error_line(err, "running.log")


def test_a_cut_nemo2_line_is_not_read_as_a_step(tmp_path, capsys):
    text = (DATA / "nemo2_qwen3_8b_timestamped.log").read_bytes()
    cut = tmp_path / "running.log"
    cut.write_bytes(text[:text.rindex(b"2.127") + 3])  # global step 529's `2.127` s written as far as `2.1`
    code, _, err = run_import(capsys, cut, "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    assert steps_of(summary_of(tmp_path / "out", "running")) == [528, 529]
    assert "warning: line 3, the last step line, looks cut (no line break" in err


KILLED = b"slurmstepd: error: *** STEP 4242.0 ON node-017 CANCELLED AT 2025-03-01T10:00:00 DUE TO TIME LIMIT ***\n"


@pytest.mark.parametrize("kill", ["on the next line", "on the same line"])
def test_a_step_line_cut_by_a_killed_job_is_not_read_as_a_step(tmp_path, capsys, kill):
    """Slurm kills the job while a rank prints its step line; slurmstepd's message follows, after a line
    break or right after the cut number. The cut `2.1` would be a step of 2.1 s (NeMo 2) and `58` one of
    58 ms (Megatron), or the whole log refused as `2.1slurmstepd:` is no number."""
    join = b"\n" if kill == "on the next line" else b""
    for name, value, cut_at, steps in (("nemo2_qwen3_8b_timestamped.log", b"2.127", 3, [528, 529]),
                                       ("megatron_lm_mixtral_issue756.log", b"5829.9", 2, [43, 44, 45, 71, 72])):
        text = (DATA / name).read_bytes()
        killed = tmp_path / f"killed-{name}"
        killed.write_bytes(text[:text.rindex(value) + cut_at] + join + KILLED)
        code, _, err = run_import(capsys, killed, "--warmup", "0", out=tmp_path / "out")
        assert code == 0, err
        assert steps_of(summary_of(tmp_path / "out", killed.stem)) == steps, name
        assert "the last step line, looks cut (" in err, err


def test_a_last_step_line_with_other_fields_than_the_one_before_is_read(tmp_path, capsys):
    """Not cut: the last line gains a field at its end (a validation loss), or lacks one within
    (Megatron prints a loss only where it is above zero)."""
    lines = [line for line in (DATA / "megatron_lm_mixtral_issue756.log").read_text().splitlines()
             if "elapsed time per iteration" in line]
    for name, last in (("gains", lines[-1] + " validation loss: 1.5 |"),
                       ("lacks", re.sub(r" lm loss: [^|]*\|", "", lines[-1]))):
        assert last != lines[-1]
        source = tmp_path / f"{name}.log"
        source.write_text("\n".join(lines[:-1] + [last]) + "\n")
        code, _, err = run_import(capsys, source, "--warmup", "0", out=tmp_path / "out")
        assert code == 0, err
        assert steps_of(summary_of(tmp_path / "out", name))[-1] == 73 and "looks cut" not in err, name


@pytest.mark.parametrize("stream", ["process substitution", "named pipe"])
def test_a_log_that_can_be_read_only_once_is_read_once(tmp_path, stream):
    """`<(cat log)` and a FIFO give their bytes once: a second open would wait for ever for a writer."""
    log = DATA / "megatron_lm_mixtral_issue756.log"
    fifo = tmp_path / "training.fifo"
    source = "<(cat {log})" if stream == "process substitution" else str(fifo)
    prepare = "" if stream == "process substitution" else f"mkfifo {fifo} && {{ cat {log} > {fifo} & }} && "
    command = (f"{prepare}{Path(sys.executable).parent / 'nemo-throughput'} import {source.format(log=log)} "
               f"--label bare-metal --model gpt3-126m --seq-length 2048 --num-gpus 16 --warmup 0 "
               f"--output-dir {tmp_path / 'out'}")
    (tmp_path / "out").mkdir()
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("summary.json")]
    assert steps_of(summary) == [43, 44, 45, 71, 72, 73]


def test_a_named_pipe_no_program_writes_to_says_it_waits_and_is_read_once_one_does(tmp_path):
    fifo = tmp_path / "training.fifo"
    os.mkfifo(fifo)
    importing = subprocess.Popen([Path(sys.executable).parent / "nemo-throughput", "import", fifo, "--label", "x",
                                  "--model", "gpt3-126m", "--seq-length", "2048", "--num-gpus", "16", "--warmup", "0",
                                  "--output-dir", tmp_path / "out"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
    try:
        assert select.select([importing.stderr], [], [], 30)[0], "no word in 30 s of waiting for a writer"
        said = importing.stderr.readline()
        assert said.strip() == f"nemo-throughput import: {fifo}: {WAITING}"
        fifo.write_bytes((DATA / "megatron_lm_mixtral_issue756.log").read_bytes())  # a writer comes
        out, err = importing.communicate(timeout=60)
    finally:
        importing.kill()
    assert importing.returncode == 0, err
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("summary.json")]
    assert steps_of(summary) == [43, 44, 45, 71, 72, 73]


def test_a_window_narrower_than_the_log_interval_says_what_it_measures(tmp_path, capsys):
    log = DATA / "primus_rocm_cvs_ansi.log"  # iterations 2 and 4: each time is the mean of 2 iterations
    common = ("--seq-length", "8192", "--num-gpus", "8")
    code, _, err = run_import(capsys, log, *common, "--window", "4:5", out=tmp_path)
    assert code == 0, err
    assert (f"nemo-throughput import: {log}: warning: --window 4:5 spans 1 step(s), fewer than the log interval of "
            "2: each printed time is the mean of the 2 iterations up to it, so this measures iterations 3-4") in err
    code, _, err = run_import(capsys, log, *common, "--window", "-1:", out=tmp_path)
    assert code == 0 and "--window -1: counts printed values, each the mean of 2 iterations" in err
    code, _, err = run_import(capsys, log, *common, "--window", "1:5", out=tmp_path)
    assert code == 0 and "--window" not in err


# ------------------------------------------------------------------ --output-dir
@pytest.mark.parametrize("where, message", [
    ("file", "is a file, not a directory"),
    ("file/under", "is a file, not a directory"),
])
def test_output_dir_is_checked_before_any_work(tmp_path, capsys, where, message):
    (tmp_path / "file").write_text("not a directory\n")
    missing = tmp_path / "no-such.log"  # would fail the import: the output dir is refused first
    code, _, err = run_import(capsys, missing, out=tmp_path / where)
    assert code == 2 and message in err and "no-such.log" not in err


def test_reimporting_the_same_input_replaces_its_summary_and_another_input_never(tmp_path, capsys):
    first, second = tmp_path / "a" / "job.log", tmp_path / "b" / "job.log"  # same name, other runs
    for path, source in ((first, "megatron_lm_mixtral_issue756.log"), (second, "megatron_llm_epfl_issue11.log")):
        path.parent.mkdir()
        path.write_bytes((DATA / source).read_bytes())
    out = tmp_path / "imported"
    assert run_import(capsys, first, "--warmup", "0", out=out)[0] == 0
    assert summary_of(out, "job")["environment"]["imported_from"] == str(first)
    code, _, err = run_import(capsys, first, "--warmup", "1", out=out)  # the same input again: replaced
    assert code == 0, err
    assert steps_of(summary_of(out, "job")) == [43, 44, 45, 71, 72, 73]
    code, _, err = run_import(capsys, second, "--warmup", "0", out=out)
    assert code == 2 and f"is the summary imported from {first}, another input: not replaced" in err
    assert summary_of(out, "job")["environment"]["imported_from"] == str(first)


def test_a_summary_of_a_run_measured_by_the_plugin_is_never_replaced(tmp_path, capsys):
    out = tmp_path / "imported"
    train = run_train_tiny("--output-dir", out / "job", "--steps", 4, "--warmup", 1)  # a real run's summary
    output, _ = train.communicate(timeout=300)
    assert train.returncode == 0, output
    measured = (out / "job" / "summary.json").read_bytes()
    log = tmp_path / "job.log"
    log.write_bytes((DATA / "megatron_lm_mixtral_issue756.log").read_bytes())
    code, _, err = run_import(capsys, log, "--warmup", "0", out=out)
    assert code == 2 and "is a run's summary; write elsewhere" in err
    assert (out / "job" / "summary.json").read_bytes() == measured


def test_a_summary_path_that_is_one_of_the_inputs_is_refused(tmp_path, capsys):
    log = tmp_path / "summary" / "summary.json"  # named like the summary it would be imported to
    log.parent.mkdir()
    log.write_bytes((DATA / "megatron_lm_mixtral_issue756.log").read_bytes())
    code, _, err = run_import(capsys, log, "--warmup", "0", out=tmp_path)
    assert code == 2 and "is one of the files this command reads" in err
    assert log.read_bytes() == (DATA / "megatron_lm_mixtral_issue756.log").read_bytes()


def test_mlperf_results_of_two_systems_never_replace_each_other_across_calls(tmp_path, capsys):
    mlperf = Path(__file__).parent / "data" / "mlperf" / "NVIDIA"
    eos_64, eos_8 = (mlperf / system / "llama2_70b_lora" / "result_0.txt"
                     for system in ("eos_ngc24.04_nemo", "eos_n8_ngc24.04_nemo"))
    out = tmp_path / "imported"
    assert main(["import", "--format", "mlperf", str(eos_64), "--output-dir", str(out)]) == 0
    assert main(["import", "--format", "mlperf", str(eos_64), "--output-dir", str(out)]) == 0  # again: replaced
    assert main(["import", "--format", "mlperf", str(eos_8), "--output-dir", str(out)]) == 2
    assert f"imported from {eos_64}, another input: not replaced" in capsys.readouterr().err
    assert summary_of(out, "result_0")["environment"]["imported_from"] == str(eos_64)


def test_terminal_escapes_in_file_names_never_reach_the_console(tmp_path, capsys):
    """A file name is data: its escape sequences must not recolour (or retitle) the user's terminal,
    whether the import fails on it or succeeds."""
    missing = tmp_path / "no\x1b[31mred\x1b]0;title\x07.log"
    code, out, err = run_import(capsys, missing, out=tmp_path)
    assert code == 2 and "no such file" in err
    assert "\x1b" not in err and "\x07" not in err and "red" in err
    renamed = tmp_path / "in\x1b[31mred.log"
    renamed.write_bytes((DATA / "megatron_lm_mixtral_issue756.log").read_bytes())
    code, out, err = run_import(capsys, renamed, "--warmup", "0", out=tmp_path / "out")
    assert code == 0, err
    assert "summary.json" in out and "\x1b" not in out + err and "\x07" not in out + err


def test_a_summary_too_large_to_read_back_is_refused_and_steps_take_a_line_each(tmp_path, capsys, monkeypatch):
    """A long log's every [step, seconds] on one line each; a summary over what report and compare
    read is refused before anything is written (here at a limit made small)."""
    from nemo_throughput.importers import command

    log = tmp_path / "long.log"
    log.write_text("".join(f" iteration {step:8d}/    2000 | consumed samples: {128 * step:12d} | elapsed time per "
                           "iteration (ms): 1500.0 | global batch size:   128 |\n" for step in range(1, 2001)))
    code, _, err = run_import(capsys, log, out=tmp_path / "out")
    assert code == 0, err
    text = (tmp_path / "out" / "long" / "summary.json").read_text()
    assert "\n      [2000, 1.5]" in text and len(text) < 40 * 2000  # about 17 bytes a step, not 47
    assert load_run(tmp_path / "out" / "long" / "summary.json").steps_counted == 2000 - 10  # --warmup 10

    monkeypatch.setattr(command, "MAX_SUMMARY_BYTES", len(text.encode()) - 1)
    code, _, err = run_import(capsys, log, out=tmp_path / "refused")
    assert code == 2 and not (tmp_path / "refused" / "long").exists()
    assert import_error_line(err, "long.log").endswith(
        "long.log: its summary, with every one of its 2,000 steps, would be 0 MiB, over the 0 MiB a summary is read "
        "from (import part of it with --window)")
