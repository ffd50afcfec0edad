"""`nemo-throughput import` on more real logs (tests/data/import, origins in its ORIGIN.md): shapes the
first set lacks. Each figure checked here follows from the log's own lines: a time it prints, a
batch it states, a rate it states beside them."""

import re
from pathlib import Path

import pytest

from conftest import import_error_line, summary_of
from nemo_throughput.cli import main

DATA = Path(__file__).parent / "data" / "import"


def run_import(capsys, log, *facts, out):
    """The real `import` entry point, with the facts the log's source states: (exit code, stderr)."""
    code = main(["import", str(log), "--label", "bare-metal", "--output-dir", str(out), "--warmup", "0",
                 *map(str, facts)])
    return code, capsys.readouterr().err


def stated(log: Path, field: str) -> list[float]:
    """Every value the log prints for `field:` (`samples per second`, say), in order."""
    return [float(v) for v in re.findall(re.escape(field) + r":\s*([\d.]+)", log.read_text())]


def times(summary) -> list[float]:
    return [seconds for _, seconds in summary["timing"]["steps"]]


# ------------------------------------------------------------------------------- Megatron-DeepSpeed
def test_real_megatron_deepspeed_line_in_seconds(tmp_path, capsys):
    # BigScience's Megatron-DeepSpeed prints `elapsed time per iteration (s): 7.2310`, not (ms)
    log = DATA / "megatron_jubench_seconds_default3.log"  # 96 nodes x 4 A100, GPT-3 175B, GBS 96
    code, err = run_import(capsys, log, "--model", "gpt3-175b", "--seq-length", 2048, "--num-gpus", 384,
                           out=tmp_path)
    assert code == 0, err
    assert "read rank 3 (the only rank that prints step lines)" in err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[10, 7.2310], [20, 5.3551], [30, 5.6192], [40, 5.3291], [50, 5.3247]]
    assert summary["batch"]["global_batch_size"] == 96
    # read as seconds: the log's own samples per second are 96 / each time, to its rounding
    for seconds, samples_per_s in zip(times(summary), stated(log, "samples per second"), strict=True):
        assert 96 / seconds == pytest.approx(samples_per_s, abs=5e-4)


def test_real_megatron_deepspeed_srun_label_of_rank_511(tmp_path, capsys):
    log = DATA / "megatron_deepspeed_srun_label_511.log"  # `511:  iteration ... (s): 11.18 | ...`
    code, err = run_import(capsys, log, "--model", "gpt3-126m", "--seq-length", 2048, "--num-gpus", 512,
                           out=tmp_path)
    assert code == 0, err
    assert "read rank 511 (the only rank that prints step lines)" in err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[13910, 11.18]]
    assert summary["batch"]["global_batch_size"] == 1024
    # 11.18 is rounded to 10 ms: 1024 / 11.18 is the stated 91.621 samples/s up to that rounding
    assert 1024 / 11.185 <= stated(log, "samples per second")[0] <= 1024 / 11.175


def test_real_megatron_deepspeed_tgs_checks_the_facts_given(tmp_path, capsys):
    # Microsoft's Megatron-DeepSpeed: `tokens per gpu per second (tgs)` = seq x batch / time / world size
    log = DATA / "megatron_deepspeed_gpt3_175b_tgs.log"  # 64 GPUs, sequence 2048, GBS 1536
    code, err = run_import(capsys, log, "--model", "gpt3-175b", "--seq-length", 2048, "--num-gpus", 64,
                           out=tmp_path)
    assert code == 0, err
    assert "the log's own tokens/s per GPU agree with --seq-length 2048 and --num-gpus 64 (6 line(s) checked)" in err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"][0] == [5, pytest.approx(344.6561)]
    mean = sum(times(summary)) / 6
    assert summary["throughput"]["tokens_per_s_per_gpu"] == pytest.approx(2048 * 1536 / mean / 64)

    code, err = run_import(capsys, log, "--model", "gpt3-175b", "--seq-length", 2048, "--num-gpus", 32,
                           out=tmp_path / "wrong")
    assert code == 2
    line = import_error_line(err, log.name)
    assert "line 1: the log states 142.6 tokens/s per GPU at iteration 5" in line and "--num-gpus 32 is 285.2" in line


def test_real_megatron_deepspeed_key_value_line_of_argonne_s_fork(tmp_path, capsys):
    # Argonne's Megatron-DeepSpeed (AuroraGPT) prints `iteration=  1/ 317892 | ... elapsed_time_per_iteration_ms=
    # 108893.2 | ... global_batch_size=  768 | ... tokens_per_gpu_per_second_tgs=1203.674 |`: it was no step line
    log = DATA / "megatron_deepspeed_alcf_key_value.log"  # 2 nodes x 12 tiles, sequence 4096, GBS 768
    code, err = run_import(capsys, log, "--model", "llama2-7b", "--seq-length", 4096, "--num-gpus", 24,
                           "--gpus-per-node", 12, out=tmp_path)
    assert code == 0, err
    assert "the log's own tokens/s per GPU agree with --seq-length 4096 and --num-gpus 24 (1 line(s) checked)" in err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[1, pytest.approx(108.8932)]]
    assert summary["batch"]["global_batch_size"] == 768  # as global_batch_size= states it
    samples_per_s = float(re.search(r"samples_per_second=([\d.]+)", log.read_text()).group(1))
    assert 768 / times(summary)[0] == pytest.approx(samples_per_s, abs=5e-4)  # read in ms: the log's own rate

    code, err = run_import(capsys, log, "--model", "llama2-7b", "--seq-length", 4096, "--num-gpus", 12,
                           "--gpus-per-node", 12, out=tmp_path / "wrong")
    line = import_error_line(err, log.name)
    assert code == 2 and "line 2: the log states 1,203.7 tokens/s per GPU at iteration 1" in line and "is 2,407.3" in line


def test_real_megatron_deepspeed_runs_sharing_one_file_are_segments(tmp_path, capsys):
    # BLOOM-176B reshaping experiments: each run resumes from iteration 94767 and prints 94768 again
    log = DATA / "megatron_deepspeed_bloom_reshaping_runs.log"
    facts = ("--model", "gpt3-175b", "--seq-length", 2048, "--num-gpus", 192)
    code, err = run_import(capsys, log, *facts, out=tmp_path)
    assert code == 2
    line = import_error_line(err, log.name)
    assert "3 segments" in line and "(line 1: 215.82 s, line 4: 234.72 s)" in line

    code, err = run_import(capsys, log, *facts, "--segment", 1, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[94768, 215.82], [94769, 215.99]]  # "after restart" between them
    assert summary["batch"]["global_batch_size"] == 2048
    for seconds, samples_per_s in zip(times(summary), stated(log, "samples per second")[:2], strict=True):
        assert 2048 / seconds == pytest.approx(samples_per_s, abs=5e-3)


# ------------------------------------------------------------------------------- NeMo
LLAMA3_8B_ON_8 = ("--model", "llama3-8b", "--seq-length", 8192, "--num-gpus", 8)


def test_real_nemo1_bar_updates_as_separate_log_lines(tmp_path, capsys):
    # SageMaker HyperPod via CloudWatch: each redraw its own line, a `[job] [time] [INFO]` prefix on the first
    log = DATA / "nemo1_sagemaker_hyperpod_cloudwatch_lines.log"
    code, err = run_import(capsys, log, *LLAMA3_8B_ON_8, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    # global_step=1.000 .. 6.000 are steps 2-7, each counted once though drawn twice
    assert summary["timing"]["steps"] == [[2, 10.7], [3, 10.7], [4, 10.9], [5, 10.7], [6, 10.8], [7, 10.7]]
    assert summary["batch"]["global_batch_size"] == 256  # consumed_samples=512.0 at global_step=1.000


@pytest.mark.parametrize("name, step, seconds, batch", [
    ("nemo1_sagemaker_unsized_bar.log", 2, 3.37, 64),  # `1it [00:04,  4.36s/it, ...`: no n/total counter
    ("nemo1_sagemaker_syslog_cr_escaped.log", 7, 10.10, 64),  # `#015Epoch 1: : 3it [...`: \r escaped by syslog
])
def test_real_nemo1_bar_lines(tmp_path, capsys, name, step, seconds, batch):
    code, err = run_import(capsys, DATA / name, *LLAMA3_8B_ON_8, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, name.removesuffix(".log"))
    assert summary["timing"]["steps"] == [[step, seconds]]
    assert summary["batch"]["global_batch_size"] == batch


def test_syslog_escaped_redraws_on_one_line_are_each_read(tmp_path, capsys):
    # rsyslog writes a bar's carriage returns as #015: a whole run's redraws then share one line
    real = (DATA / "nemo1_sagemaker_syslog_cr_escaped.log").read_text().splitlines()[0]
    bar = real[real.index("Epoch"):real.index("]{") + 1]  # global_step=6.000, consumed_samples=448.0, 10.10 s
    nxt = bar.replace("3it", "4it").replace("6.000", "7.000").replace("448.0", "512.0").replace("10.10", "9.900")
    log = tmp_path / "syslog.log"
    log.write_text(f"[2026-03-01 21:16:40,581] [INFO] #015{bar}#015{nxt}\n")
    code, err = run_import(capsys, log, *LLAMA3_8B_ON_8, out=tmp_path / "out")
    assert code == 0, err
    assert summary_of(tmp_path / "out", "syslog")["timing"]["steps"] == [[7, 10.1], [8, 9.9]]


@pytest.mark.parametrize("name, steps, batch", [
    ("nemo2_b200_gpustat_between.log", [[46, 6.08], [47, 6.061], [48, 6.082], [49, 6.071], [50, 6.06]], 128),
    ("nemo2_cloudai_consumed_first.log", [[1, 61.94], [2, 53.67], [3, 52.45], [4, 52.54], [5, 53.16]], 512),
    ("nemo2_sagemaker_rft_exponent_time.log", [[120, 1232.0]], 256),  # `train_step_timing in s: 1.232e+03`
])
def test_real_nemo2_printer_lines(tmp_path, capsys, name, steps, batch):
    code, err = run_import(capsys, DATA / name, *LLAMA3_8B_ON_8, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, name.removesuffix(".log"))
    assert summary["timing"]["steps"] == steps
    assert summary["batch"]["global_batch_size"] == batch
    mean = sum(times(summary)) / len(steps)
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(8192 * batch / mean)


def test_real_nemo2_line_without_a_batch_needs_one_given(tmp_path, capsys):
    log = DATA / "nemo2_sagemaker_no_batch_field.log"  # token_count, samples/sec, no global_batch_size
    code, err = run_import(capsys, log, *LLAMA3_8B_ON_8, out=tmp_path)
    assert code == 2
    assert "does not state the global batch size (give --global-batch-size)" in import_error_line(err, log.name)
    code, err = run_import(capsys, log, *LLAMA3_8B_ON_8, "--global-batch-size", 256, out=tmp_path)
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[10, 59.7]]
    # the line's own token_count: 10 steps of 256 x 8192 tokens, so the batch given is the run's
    assert re.search(r"token_count: (\d+)", log.read_text())[1] == str(10 * 256 * 8192)


def test_real_nemo2_lines_without_step_time_are_refused_naming_why(tmp_path, capsys):
    log = DATA / "nemo2_sft_without_step_timing.log"  # an SFT run without NeMo's TimingCallback
    code, err = run_import(capsys, log, "--model", "llama3-8b", "--seq-length", 4096, "--num-gpus", 16,
                           out=tmp_path)
    assert code == 2
    line = import_error_line(err, log.name)
    assert "NeMo 2 progress lines (line 1) but no step time" in line and "TimingCallback" in line
    assert "give the training log" not in line  # it is the training log


def test_syslog_escapes_are_read_only_as_escapes_not_in_other_numbers():
    """`#015` is a carriage return as rsyslog writes it; `#0152`, an issue's or a job's number, is text."""
    from nemo_throughput.importers.lines import _unescape_syslog

    assert _unescape_syslog("see issue #0152 #033[0m#015next") == ["see issue #0152 \x1b[0m", "next"]
