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
