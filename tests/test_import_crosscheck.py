"""`nemo-throughput import` checks the facts it is given against the model TFLOP/s per GPU a Megatron-LM,
Megatron-Bridge or Primus log states (importers.crosscheck): the real logs of tests/data/import first
(ORIGIN.md), then hostile lines made from the real Mixtral one.

The log's figure stands for FLOPs per sample = TFLOP/s x 1e12 x seconds x GPUs / batch; every expected
figure below is computed from the line's own numbers and flops.py, never copied from the output."""

import json
import statistics
from pathlib import Path

import pytest

from conftest import summary_of
from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.presets import preset

DATA = Path(__file__).parent / "data" / "import"
MIXTRAL_LOG = DATA / "megatron_lm_mixtral_issue756.log"
MIXTRAL_LINE = MIXTRAL_LOG.read_text().splitlines()[0]
# (step seconds, TFLOP/s) of the Mixtral log's six lines, as printed
MIXTRAL_FIGURES = [(5.4449, 239.8), (5.5338, 236.0), (5.7186, 228.4), (5.3616, 243.6), (5.4707, 238.7), (5.8299, 224.0)]
H100 = ("--gpu-name", "NVIDIA H100 80GB HBM3", "--dtype", "bf16")
LLAMA32_1B = {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 8,
              "kv_channels": 64, "ffn_hidden_size": 8192, "vocab_size": 128256, "gated_linear_unit": True}
# Qwen3-30B-A3B as Megatron-Bridge's recipe maps its Hugging Face config (tests/test_bridge_flops.py)
QWEN3_30B_A3B = {"num_layers": 48, "hidden_size": 2048, "ffn_hidden_size": 6144, "moe_ffn_hidden_size": 768,
                 "num_attention_heads": 32, "num_query_groups": 4, "kv_channels": 128, "vocab_size": 151936,
                 "num_moe_experts": 128, "moe_router_topk": 8, "gated_linear_unit": True}


def crosscheck(capsys, tmp_path, log, *options, seq_length, num_gpus):
    """Import ``log`` with the real entry point: (model.flops_crosscheck, stderr)."""
    out = tmp_path / "out"
    code = main(["import", str(log), "--label", "bare-metal", "--warmup", "0", "--seq-length", str(seq_length),
                 "--num-gpus", str(num_gpus), "--output-dir", str(out), *options])
    err = capsys.readouterr().err
    assert code == 0, err
    return summary_of(out, Path(log).stem)["model"]["flops_crosscheck"], err


def flops(spec_fields, seq_length, formula="megatron"):
    return model_flops_per_sample(ModelSpec.from_dict({**spec_fields, "seq_length": seq_length}), formula)


def mixtral(seq_length, formula="megatron"):
    return flops(preset("mixtral-8x7b").to_dict(), seq_length, formula)


def implied(tflops, seconds, gpus, batch):
    return tflops * 1e12 * seconds * gpus / batch


# ------------------------------------------------------------------ the real logs
def test_bridge_log_counted_at_the_providers_sequence_length_is_named(tmp_path, capsys):
    """Megatron-Bridge 0.2, Llama 3.2 1B, 8 H100, GBS 512, data of 1,024 tokens: its `Step Time` figure,
    59,892.5, is Bridge's count at model.seq_length 131,072 (tests/test_bridge_flops.py). The check names the
    disagreement, the figure above the H100's peak, and the sequence length that fits."""
    checks, err = crosscheck(capsys, tmp_path, DATA / "megatron_bridge_llama32_1b_8gpu.log", "--model-spec",
                             json.dumps(LLAMA32_1B), *H100, seq_length=1024, num_gpus=8)
    assert [c["field"] for c in checks] == ["`GPU utilization: ... TFLOP/s/GPU` of Megatron-Bridge's `Step Time :` "
                                            "lines"]  # its iteration lines print none (log_throughput false)
    check = checks[0]
    ours = flops(LLAMA32_1B, 1024) * 512 / 4.65 / 8 / 1e12  # with the Step Time line's own 4.65 s
    assert check["verdict"] == "disagree" and check["disagreeing_lines"] == [5]
    assert check["log_tflops_per_gpu"] == 59892.5 and check["ours_tflops_per_gpu"] == pytest.approx(ours)
    assert check["ratio"] == pytest.approx(59892.5 / ours)
    assert check["log_flops_per_sample"] == pytest.approx(implied(59892.5, 4.65, 8, 512))
    assert check["log_flops_per_sample"] == pytest.approx(flops(LLAMA32_1B, 131072), rel=check["allowance"])
    assert check["causes"][0].startswith("the log's figure is above the GPU's peak of 989.5 TFLOP/s")
    assert check["causes"][1].startswith("--seq-length 131,072 fits it (under Megatron's current count")
    assert "warning: the log's own model TFLOP/s per GPU" in err and "59,892.5 in the log" in err
    assert f"{ours:,.1f} ours" in err


def test_mixtral_log_agrees_with_megatron_lms_2024_count(tmp_path, capsys):
    """Megatron-LM issue 756 (April 2024; Mixtral 8x7B, 16 H100, GBS 128). ORIGIN.md gives no sequence
    length: at 2,048 its six figures are the full-attention count Megatron-LM printed then (not today's
    causal one, 2 % lower), each within its printed digits."""
    checks, err = crosscheck(capsys, tmp_path, MIXTRAL_LOG, "--model", "mixtral-8x7b", seq_length=2048, num_gpus=16)
    (check,) = checks
    assert check["verdict"] == "agree_with_earlier_count" and check["count"] == "full-attention"
    assert check["lines"] == 6 and check["lines_without"] == 0 and check["disagreeing_lines"] == []
    ratios = [implied(tf, s, 16, 128) / mixtral(2048, "dgxc") for s, tf in MIXTRAL_FIGURES]
    assert check["ratio"] == pytest.approx(statistics.median(ratios))
    assert max(abs(r - 1) for r in ratios) <= check["allowance"] < 0.001
    assert abs(implied(239.8, 5.4449, 16, 128) / mixtral(2048) - 1) > 0.02  # today's count: 2 % off
    assert "the figures are cross-checked" in err and "Megatron-LM's 2024 count" in err


def test_mixtral_log_at_twice_its_sequence_length_names_both_readings(tmp_path, capsys):
    """At 4,096 the log's figure is half ours: 32 GPUs, or 2,048 tokens under the 2024 count, fit it alike
    (today's count at 2s is exactly twice the full count at s): both are named, neither chosen."""
    checks, err = crosscheck(capsys, tmp_path, MIXTRAL_LOG, "--model", "mixtral-8x7b", seq_length=4096, num_gpus=16)
    (check,) = checks
    assert check["verdict"] == "disagree" and check["ratio"] == pytest.approx(0.5, rel=1e-3)
    assert [c.split(" fits")[0] for c in check["causes"][:2]] == ["--num-gpus 32", "--seq-length 2,048"]
    assert check["causes"][-1].startswith("the model given (mixtral-8x7b) is not the run's model")
    assert "warning:" in err and "MFU and model TFLOP/s are computed from the facts given" in err


@pytest.mark.parametrize("options, cause", [
    (("--model", "mixtral-8x7b", "--num-gpus", "8"), "--num-gpus 16 fits it"),
    (("--model", "llama3-8b", "--num-gpus", "16"), "the model given (llama3-8b) is not the run's model"),
], ids=["half-the-gpus", "an-8b-preset"])
def test_wrong_facts_for_the_mixtral_log_are_warned(tmp_path, capsys, options, cause):
    out = tmp_path / "out"
    code = main(["import", str(MIXTRAL_LOG), "--label", "x", "--warmup", "0", "--seq-length", "2048",
                 "--output-dir", str(out), *options])
    assert code == 0
    (check,) = summary_of(out, MIXTRAL_LOG.stem)["model"]["flops_crosscheck"]
    assert check["verdict"] == "disagree" and any(c.startswith(cause) for c in check["causes"])
    assert "warning: the log's own model TFLOP/s per GPU" in capsys.readouterr().err


@pytest.mark.parametrize("log, options, seq_length, num_gpus, line", [
    # NVIDIA/cloudai's Bridge launcher log (GB200, MoE; ORIGIN names no model): Qwen3-30B-A3B on 8 GPUs fits it
    ("megatron_bridge_cloudai_launcher.log", ("--model-spec", json.dumps(QWEN3_30B_A3B)), 4096, 8, (9.09, 663.5, 512)),
    # Primus-SaFE rank 63 of 64 (model not named): Llama 3 8B at 4,096 fits it
    ("primus_safe_rank63of64.log", ("--model", "llama3-8b"), 4096, 64, (16.6013, 11.9, 64)),
], ids=["cloudai-bridge", "primus-rank63"])
def test_logs_of_unnamed_models_agree_with_a_model_that_fits(tmp_path, capsys, log, options, seq_length, num_gpus,
                                                               line):
    """Shown, not claimed: these logs do not name their model; one that fits is within their digits."""
    checks, err = crosscheck(capsys, tmp_path, DATA / log, *options, seq_length=seq_length, num_gpus=num_gpus)
    (check,) = checks
    assert check["verdict"] == "agree" and check["count"] == "megatron"
    assert check["log_flops_per_sample"] == pytest.approx(implied(line[1], line[0], num_gpus, line[2]))
    assert "the figures are cross-checked" in err


@pytest.mark.parametrize("log, seq_length, num_gpus, line", [
    ("megatron_deepseek_v2_lite_no_trailing_fields.log", 4096, 8, (61.6743, 68.2, 1024)),  # MLA: no spec of ours
    ("megatron_flagscale_torchrun_default7.log", 4096, 8, (1.5104, 54.1, 32)),
    ("megatron_openseek_torchrun_default0.log", 4096, 8, (271.607, 40.4, 1024)),
    ("primus_safe_rank31of32.log", 4096, 32, (2.7013, 210.5, 256)),  # 210.5/217.3: this interval's, not the mean
], ids=["deepseek-v2-lite", "flagscale", "openseek", "primus-rank31"])
def test_logs_of_unknown_models_say_what_their_figure_stands_for(tmp_path, capsys, log, seq_length, num_gpus, line):
    """Their model is not known: given an 8B preset the check disagrees, and the warning says which FLOPs per
    sample the log's figure stands for (the number to compare a model with); their median for DeepSeek-V2-Lite's
    three lines, 61,674.3 ms being the middle one."""
    checks, err = crosscheck(capsys, tmp_path, DATA / log, "--model", "llama3-8b", seq_length=seq_length,
                             num_gpus=num_gpus)
    (check,) = checks
    assert check["verdict"] == "disagree"
    assert check["log_flops_per_sample"] == pytest.approx(implied(line[1], line[0], num_gpus, line[2]))
    assert check["causes"][-1].startswith("the model given (llama3-8b) is not the run's model")
    assert f"{check['log_flops_per_sample']:.4g} FLOPs per sample" in err


def test_primus_single_values_and_cur_avg_pairs_both_count(tmp_path, capsys):
    """ROCm/cvs' Primus fixture: iteration 2 prints `103.7`, iteration 4 `1290.3/1162.8` (this interval / mean);
    given the FLOPs per sample iteration 4's pair stands for, both lines agree: the mean 1162.8 would be 10 % off."""
    figure = implied(1290.3, 0.6545, 8, 16)
    checks, _ = crosscheck(capsys, tmp_path, DATA / "primus_rocm_cvs_ansi.log", "--flops-per-sample", str(figure),
                           seq_length=8192, num_gpus=8)
    (check,) = checks
    assert check["verdict"] == "agree" and check["count"] == "given" and check["lines"] == 2
    assert check["log_tflops_per_gpu"] == pytest.approx((103.7 + 1290.3) / 2)


def test_logs_without_a_figure_record_none(tmp_path, capsys):
    checks, err = crosscheck(capsys, tmp_path, DATA / "megatron_llm_epfl_issue11.log", "--model", "gpt3-126m",
                             seq_length=2048, num_gpus=16)
    assert checks is None and "TFLOP/s per GPU" not in err
    nemo, _ = crosscheck(capsys, tmp_path, DATA / "nemo2_qwen3_8b_timestamped.log", "--model", "llama3-8b",
                         seq_length=4096, num_gpus=8)
    assert nemo is None


# ------------------------------------------------------------------ hostile lines, from the real Mixtral line
def mixtral_log(tmp_path, figures):
    """The Mixtral line at iterations 1.. with these `throughput per GPU` texts (None: the field left out)."""
    lines = []
    for iteration, figure in enumerate(figures, start=1):
        line = MIXTRAL_LINE.replace("      43/", f"{iteration:8d}/").replace(
            "consumed samples:         5504", f"consumed samples: {iteration * 128:12d}")
        field = " throughput per GPU (TFLOP/s/GPU): 239.8 |"
        lines.append(line.replace(field, "") if figure is None else line.replace("239.8", figure))
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def mixtral_checks(capsys, tmp_path, figures, *options, num_gpus=16):
    checks, err = crosscheck(capsys, tmp_path, mixtral_log(tmp_path, figures), "--model", "mixtral-8x7b", *options,
                             seq_length=2048, num_gpus=num_gpus)
    return checks[0], err


@pytest.mark.parametrize("figure", ["nan", "inf", "-inf", "0.0", "-239.8", "n/a", ""])
def test_figures_no_run_measures_are_not_checked(tmp_path, capsys, figure):
    check, err = mixtral_checks(capsys, tmp_path, [figure] * 3)
    assert check["verdict"] == "unusable" and check["unusable_lines"] == [1, 2, 3] and check["ratio"] is None
    assert "is no number a run could measure" in err and "not cross-checked" in err


def test_an_unusable_figure_among_good_ones_is_left_out_and_named(tmp_path, capsys):
    check, err = mixtral_checks(capsys, tmp_path, ["239.8", "nan", "239.8"])
    assert check["verdict"] == "agree_with_earlier_count" and check["unusable_lines"] == [2]
    assert "1 of them left out as NaN, infinite, zero or negative (line 2)" in err


def test_an_absurd_figure_is_compared_and_said_to_exceed_the_peak(tmp_path, capsys):
    check, err = mixtral_checks(capsys, tmp_path, ["1e30"] * 2, *H100)
    ratio = implied(1e30, 5.4449, 16, 128) / mixtral(2048)  # every line made from line 43, its 5444.9 ms
    assert check["verdict"] == "disagree" and check["ratio"] == pytest.approx(ratio)
    assert check["causes"][0].startswith("the log's figure is above the GPU's peak")
    assert not any(c.startswith(("--seq-length", "--num-gpus")) for c in check["causes"])  # none is plausible


def test_a_figure_on_some_lines_only(tmp_path, capsys):
    check, err = mixtral_checks(capsys, tmp_path, ["239.8", None, "239.8", None])
    assert check["lines"] == 2 and check["lines_without"] == 2 and check["verdict"] == "agree_with_earlier_count"
    assert "2 line(s), 2 more without it" in err


def test_one_line_off_is_mixed_and_named(tmp_path, capsys):
    check, err = mixtral_checks(capsys, tmp_path, ["239.8", "239.8", "479.6", "239.8"])
    assert check["verdict"] == "mixed" and check["count"] == "full-attention" and check["disagreeing_lines"] == [3]
    assert "on 1 of 4 usable lines (line 3)" in err
    check, _ = mixtral_checks(capsys, tmp_path, ["239.8", "239.8", "479.6"], "--flops-per-sample",
                              str(implied(239.8, 5.4449, 16, 128)))
    assert check["verdict"] == "mixed" and check["count"] == "given" and check["disagreeing_lines"] == [3]


def test_a_figure_per_node_is_named(tmp_path, capsys):
    """A fork printing TFLOP/s per node of 8 GPUs: 8 x the per-GPU figure on 2 nodes."""
    check, _ = mixtral_checks(capsys, tmp_path, [f"{239.8 * 8:.1f}"] * 2)
    assert check["verdict"] == "disagree"
    assert "--num-gpus 2 fits it (under Megatron-LM's 2024 count (full s x s attention)), or the log's figure is " \
           "per node of 8 GPUs, not per GPU" in check["causes"]


def test_primus_pairs_read_this_intervals_figure(tmp_path, capsys):
    """`239.8/100.0`: this interval's figure, never the running mean; `/239.8` states none of its own; Primus'
    newer `compute per GPU (TFLOP/s/GPU): 239.8 (avg 100.0)` likewise."""
    log = mixtral_log(tmp_path, ["239.8/100.0", "/239.8", "239.8"])
    log.write_text(log.read_text().replace("throughput per GPU (TFLOP/s/GPU): 239.8 |",
                                           "compute per GPU (TFLOP/s/GPU): 239.8 (avg 100.0) |"))
    checks, _ = crosscheck(capsys, tmp_path, log, "--model", "mixtral-8x7b", seq_length=2048, num_gpus=16)
    (check,) = checks
    assert check["verdict"] == "agree_with_earlier_count" and check["unusable_lines"] == [2]
    assert check["log_tflops_per_gpu"] == 239.8


def test_a_wrong_batch_given_where_the_log_states_none(tmp_path, capsys):
    log = mixtral_log(tmp_path, ["239.8"] * 2)
    log.write_text("\n".join(line.split(" consumed samples:")[0] + " |" + line.split("consumed samples:")[1]
                             .split("|", 1)[1].replace(" global batch size:   128 |", "")
                             for line in log.read_text().splitlines()) + "\n")
    checks, _ = crosscheck(capsys, tmp_path, log, "--model", "mixtral-8x7b", "--global-batch-size", "64",
                           seq_length=2048, num_gpus=16)
    (check,) = checks
    assert check["verdict"] == "disagree"
    assert any(c.startswith("--global-batch-size 128 fits it") for c in check["causes"])


def test_bridge_step_time_lines_are_skipped_when_the_batch_changes(tmp_path, capsys):
    step_time = "Step Time : 5.44s GPU utilization: 239.8MODEL_TFLOP/s/GPU"
    log = mixtral_log(tmp_path, [None] * 3)
    lines = log.read_text().splitlines()
    lines[0] = lines[0].replace("global batch size:   128", "global batch size:    64")
    log.write_text("\n".join(f"{step_time}\n{line}" for line in lines) + "\n")
    checks, err = crosscheck(capsys, tmp_path, log, "--model", "mixtral-8x7b", "--window", "2:", seq_length=2048,
                             num_gpus=16)
    (check,) = checks
    assert check["verdict"] == "skipped" and check["lines"] == 3
    assert "not cross-checked: the batch changes within the log" in err
