"""`nemo-throughput import` of Megatron-Bridge logs: real Bridge output first (tests/data/import, origins in
its ORIGIN.md), then logs laid out here the way Bridge and its launchers write them.

Bridge's ``training_log`` prints Megatron-LM's iteration line with the same format strings, so
``--format megatron`` (and format detection) reads it; Bridge's own rank-0 ``Step Time :`` line marks
the log as Bridge's and is never taken for a step."""

import json
from pathlib import Path

import pytest

from conftest import import_error_line, summary_of
from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample

DATA = Path(__file__).parent / "data" / "import"

# Llama 3.2 1B as the real log's dumped ConfigContainer gives it (model: Llama31ModelProvider, 16 layers, hidden
# 2048, 32 heads, 8 groups, kv_channels 64, ffn 8192, vocab 128256, gated_linear_unit) at the run's sequence 1024
LLAMA32_1B = {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 8,
              "kv_channels": 64, "ffn_hidden_size": 8192, "vocab_size": 128256, "gated_linear_unit": True,
              "seq_length": 1024}
REAL_STEP_TIME = "Step Time : 9.09s GPU utilization: 663.5MODEL_TFLOP/s/GPU"  # NVIDIA/cloudai's Bridge log
REAL_ITERATION = (" [2025-12-22 15:18:33] iteration       50/      50 | consumed samples:        25600 | "
                  "elapsed time per iteration (ms): 9089.0 | learning rate: 3.000000E-05 | global batch size:   512 | "
                  "lm loss: 8.114214E+00 | load_balancing_loss: 1.000000E+00 | loss scale: 1.0 | grad norm: 0.042 | "
                  "number of skipped iterations:   0 | number of nan iterations:   0 |")


def import_bridge(capsys, log, out, *extra, seq_length=1024, num_gpus=8):
    """The real `nemo-throughput import` entry point, in this process: (exit code, stdout, stderr)."""
    code = main(["import", str(log), "--label", "bare-metal", "--seq-length", str(seq_length), "--num-gpus",
                 str(num_gpus), "--output-dir", str(out), *map(str, extra)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("fmt", [(), ("--format", "megatron")], ids=["detected", "format-megatron"])
def test_real_bridge_log_of_eight_gpus(tmp_path, capsys, fmt):
    """A Megatron-Bridge 0.2 run (Llama 3.2 1B, 8 H100, GBS 512, log interval 10): its one iteration line is
    the mean of iterations 1-10; the Step Time line before it is not a step."""
    log = DATA / "megatron_bridge_llama32_1b_8gpu.log"
    code, out, err = import_bridge(capsys, log, tmp_path, *fmt, "--model-spec", json.dumps(LLAMA32_1B),
                                   "--warmup", "0", "--gpu-name", "NVIDIA H100 80GB HBM3", "--dtype", "bf16")
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[10, 4.6478]]
    assert summary["batch"]["global_batch_size"] == 512
    assert summary["throughput"]["tokens_per_s"] == pytest.approx(512 * 1024 / 4.6478)
    flops = model_flops_per_sample(ModelSpec.from_dict(LLAMA32_1B), "megatron")
    assert summary["model"]["flops_per_sample"] == flops
    assert summary["throughput"]["model_tflops_per_gpu"] == pytest.approx(512 * flops / 4.6478 / 8 / 1e12)
    assert summary["environment"]["log_styles"] == ["Megatron-Bridge `Step Time :` lines",
                                                    "Megatron-LM / Megatron-Bridge iteration lines"]
    assert summary["run"]["source"] == "import:megatron"
    assert "Megatron-Bridge log" in err and "not read" in err


def test_real_bridge_launcher_log_with_a_job_prefix(tmp_path, capsys):
    """NVIDIA/cloudai's Megatron-Bridge launcher log: both lines behind a `<job>/0 ` prefix, the iteration
    line without a throughput field (log_throughput off) and with an MoE load-balancing loss."""
    log = DATA / "megatron_bridge_cloudai_launcher.log"
    code, out, err = import_bridge(capsys, log, tmp_path, "--flops-per-sample", "1e15", "--warmup", "0",
                                   seq_length=4096)
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    assert summary["timing"]["steps"] == [[50, 9.089]]
    assert summary["batch"]["global_batch_size"] == 512
    assert summary["model"]["flops_formula"] == "user"
    assert "Megatron-Bridge `Step Time :` lines" in summary["environment"]["log_styles"]


# The 4-layer vanilla GPT of tests/gpu/bridge_pretrain.py, as Bridge ran it (its ConfigContainer, read by our callback)
BRIDGE_PROOF_GPT = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "ffn_hidden_size": 2048,
                    "seq_length": 1024, "vocab_size": 32000}


def test_real_bridge_062_log_with_our_callback_in_it(tmp_path, capsys):
    """The GPU proof's Megatron-Bridge 0.6.2 `pretrain` on one H100, with our callback in the same run: its
    six iteration lines are the steps (our callback's own `[throughput]` lines and Python's warnings are
    not), Bridge's TFLOP/s agree with ours, and the log's mean over iterations 6-30 is within 0.2 % of
    what our CUDA events measured in the run (0.13041 s, its summary)."""
    log = DATA / "megatron_bridge_062_h100_vanilla_gpt.log"
    code, out, err = import_bridge(capsys, log, tmp_path, "--model-spec", json.dumps(BRIDGE_PROOF_GPT),
                                   "--warmup", "0", "--gpu-name", "NVIDIA H100 80GB HBM3", "--dtype", "bf16",
                                   num_gpus=1)
    assert code == 0, err
    summary = summary_of(tmp_path, log.stem)
    steps = summary["timing"]["steps"]
    assert [step for step, _ in steps] == [5, 10, 15, 20, 25, 30]
    assert [seconds for _, seconds in steps] == pytest.approx([1.2881, 0.1333, 0.1337, 0.1299, 0.1255, 0.1291])
    assert summary["batch"]["global_batch_size"] == 8
    (crosscheck,) = summary["model"]["flops_crosscheck"]
    assert crosscheck["verdict"] == "agree" and crosscheck["lines"] == 6
    after_warmup = [seconds for step, seconds in summary["timing"]["steps"] if step > 5]
    assert sum(after_warmup) / len(after_warmup) == pytest.approx(0.13041018, rel=2e-3)


def test_srun_labelled_bridge_log_reads_the_last_rank(tmp_path, capsys):
    """Bridge prints Step Time on rank 0 and the iteration line on the last rank: under `srun -l` the rank
    with step lines is the last one, and rank 0's Step Time lines do not make it a step rank."""
    log = tmp_path / "bridge-srun.out"
    lines = []
    for iteration, ms in ((1, 125370.0), (2, 6130.0), (3, 2260.0), (4, 2240.0)):
        lines.append(f"0: Step Time : {ms / 1e3:.2f}s GPU utilization: 1156.2MODEL_TFLOP/s/GPU")
        lines.append("7: " + REAL_ITERATION.replace("      50/      50", f"{iteration:8d}/      20")
                     .replace("9089.0", f"{ms:.1f}"))
    log.write_text("\n".join(lines) + "\n")
    code, out, err = import_bridge(capsys, log, tmp_path / "out", "--flops-per-sample", "1e15", "--warmup", "2",
                                   num_gpus=64)
    assert code == 0, err
    summary = summary_of(tmp_path / "out", "bridge-srun")
    assert summary["timing"]["steps"] == [[1, 125.37], [2, 6.13], [3, 2.26], [4, 2.24]]
    assert summary["timing"]["steps_measured"] == 2
    assert summary["environment"]["imported_rank"] == "7"
    assert "rank 7 (the only rank that prints step lines)" in err


def test_a_log_of_only_step_time_lines_says_what_is_missing(tmp_path, capsys):
    """`grep 'Step Time'` output is not enough: those lines have no iteration number."""
    log = tmp_path / "step-times.txt"
    log.write_text("\n".join([REAL_STEP_TIME] * 3) + "\n")
    code, out, err = import_bridge(capsys, log, tmp_path / "out", "--flops-per-sample", "1e15")
    assert code != 0
    line = import_error_line(err, "step-times.txt")
    assert "only Megatron-Bridge `Step Time : ...` lines" in line and "elapsed time per iteration (ms)" in line


def test_megatron_lm_logs_are_not_marked_as_bridge(tmp_path, capsys):
    code, out, err = import_bridge(capsys, DATA / "megatron_llm_epfl_issue11.log", tmp_path, "--model", "gpt3-126m",
                                   "--warmup", "0", seq_length=2048, num_gpus=16)
    assert code == 0, err
    summary = summary_of(tmp_path, "megatron_llm_epfl_issue11")
    assert summary["environment"]["log_styles"] == ["Megatron-LM / Megatron-Bridge iteration lines"]
    assert "Megatron-Bridge log" not in err
