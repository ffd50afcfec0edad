"""`nemo-throughput import` checks the facts it is given against the model TFLOP/s per GPU NeMo 2's FLOPs
callback prints (`TFLOPS_per_GPU:` on the progress lines) and that NeMo and Megatron-LM write to TensorBoard
(importers.crosscheck_nemo, crosscheck_megatron): the real B200 log first, then hostile lines made from it.

The figure stands for FLOPs per sample = TFLOP/s x 1e12 x seconds x GPUs / batch; every expected figure below
comes from the line's own numbers and flops.py, or from NeMo's formula written out here, never from the output."""

import json
import math
import statistics
from pathlib import Path

import pytest

from conftest import summary_of
from nemo_throughput.cli import main
from nemo_throughput.flops import ModelSpec, model_flops_per_sample
from nemo_throughput.importers.crosscheck import STRAY_LINES
from nemo_throughput.presets import preset

DATA = Path(__file__).parent / "data" / "import"
B200_LOG = DATA / "nemo2_b200_gpustat_between.log"
B200_LINES = [line for line in B200_LOG.read_text().splitlines() if line.startswith("Training epoch")]
# (step seconds, TFLOP/s) of the log's five lines, as printed (`1.249e+03`)
B200_FIGURES = [(6.08, 1249.0), (6.061, 1252.0), (6.082, 1248.0), (6.071, 1250.0), (6.06, 1253.0)]
FIELD = "`TFLOPS_per_GPU:` of NeMo 2's progress lines (its FLOPs callback's)"
B200 = ("--gpu-name", "NVIDIA B200", "--dtype", "bf16")


def crosscheck(capsys, tmp_path, log, *options, seq_length=8192, num_gpus=8):
    """Import ``log`` with the real entry point: (model.flops_crosscheck, stderr)."""
    out = tmp_path / "out"
    code = main(["import", str(log), "--label", "x", "--warmup", "0", "--seq-length", str(seq_length),
                 "--num-gpus", str(num_gpus), "--output-dir", str(out), *options])
    err = capsys.readouterr().err
    assert code == 0, err
    return summary_of(out, Path(log).stem)["model"]["flops_crosscheck"], err


def llama3_8b(formula, seq_length=8192):
    return model_flops_per_sample(ModelSpec.from_dict({**preset("llama3-8b").to_dict(), "seq_length": seq_length}),
                                  formula)


def implied(tflops, seconds, gpus=8, batch=128):
    return tflops * 1e12 * seconds * gpus / batch


# ------------------------------------------------------------------ the real log
def test_b200_llama3_8b_log_agrees_with_nemos_count_before_2_5(tmp_path, capsys):
    """NeMo 2 performance script, Llama 3 8B, 8 B200, GBS 128, 8,192 tokens (ORIGIN.md): each of its five
    figures is NeMo's full-attention count over its own line's time, within the 4 printed digits of both."""
    checks, err = crosscheck(capsys, tmp_path, B200_LOG, "--model", "llama3-8b")
    (check,) = checks
    assert check["field"] == FIELD and check["lines"] == 5 and check["lines_without"] == 0
    assert check["verdict"] == "agree_with_earlier_count" and check["count"] == "full-attention"
    ratios = [implied(tf, s) / llama3_8b("dgxc") for s, tf in B200_FIGURES]
    assert check["ratio"] == pytest.approx(statistics.median(ratios))
    assert max(abs(r - 1) for r in ratios) <= check["allowance"] < 0.002
    assert abs(implied(1249.0, 6.08) / llama3_8b("megatron") - 1) > 0.1  # NeMo 2.5's halved count: 12 % off
    assert "the figures are cross-checked" in err and "the run's NeMo is earlier than 2.5" in err


H100_LOG = DATA / "nemo2_h100_gpt3_126m_flops_callback.log"
GPT3_126M = {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "ffn_hidden_size": 3072,
             "seq_length": 2048, "vocab_size": 50257}


def test_h100_log_whose_callback_averages_ten_steps_agrees_and_leaves_out_the_start_up_s_figure(tmp_path, capsys):
    """NeMo 2.5's own run on an H100 (GPT-3 126M, log_every_n_steps 10): the callback's figure, first printed
    at iteration 10, averages the ten steps before it, start-up's 4.7 s step among them (46.36, where the
    steps after print 0.82 s: 67); later figures average steps 0.81-1.0 s. The right facts agree; the
    start-up interval's lines are left out, said so, not warned on as a disagreement. A wrong GPU count
    is still found."""
    facts = ("--model-spec", json.dumps(GPT3_126M), "--gpu-name", "NVIDIA H100 80GB HBM3", "--dtype", "bf16")
    (check,), err = crosscheck(capsys, tmp_path, H100_LOG, *facts, seq_length=2048, num_gpus=1)
    assert check["verdict"] == "agree" and check["lines"] == 41 and check["disagreeing_lines"] == []
    assert "9 more left out: their figure may average step times too far apart to check" in check["note"]
    assert "warning" not in err
    (wrong,), err = crosscheck(capsys, tmp_path / "two", H100_LOG, *facts, seq_length=2048, num_gpus=2)
    assert wrong["verdict"] in ("disagree", "mixed") and "warning: the log's own model TFLOP/s" in err


@pytest.mark.parametrize("options, cause", [
    (("--model", "llama3-8b", "--num-gpus", "16"), "--num-gpus 8 fits it"),
    (("--model", "llama3-70b"), "the model given (llama3-70b) is not the run's model"),
], ids=["twice-the-gpus", "a-70b-preset"])
def test_wrong_facts_for_the_b200_log_are_warned(tmp_path, capsys, options, cause):
    checks, err = crosscheck(capsys, tmp_path, B200_LOG, *options)
    (check,) = checks
    assert check["verdict"] == "disagree" and any(c.startswith(cause) for c in check["causes"])
    assert "a NeMo formula this check does not reproduce" in check["causes"][-1]
    assert "warning: the log's own model TFLOP/s per GPU" in err


def test_nemo1_bars_and_nemo2_lines_without_the_callback_record_none(tmp_path, capsys):
    for log in ("nemo1_dgxc_llama31_70b_last_step.out", "nemo2_qwen3_8b_timestamped.log"):
        checks, err = crosscheck(capsys, tmp_path, DATA / log, "--model", "llama3-8b", seq_length=4096)
        assert checks is None and "TFLOP/s per GPU" not in err


# ------------------------------------------------------------------ hostile lines, from the real ones
def b200_log(tmp_path, figures, times=None, steps=None, name="TFLOPS_per_GPU", batch=None):
    """The B200 lines (cycled) with these figure texts (None: the field left out), times and step numbers."""
    lines = []
    for index, figure in enumerate(figures):
        line = B200_LINES[index % len(B200_LINES)]
        fields = dict(part.split(": ", 1) for part in line.split(" | ")[1:])
        step = steps[index] if steps else 45 + index
        fields.update({"global_step": str(step), "train_step_timing in s": times[index] if times else
                       fields["train_step_timing in s"], "consumed_samples": str((step + 1) * 128)})
        if batch:
            fields["global_batch_size"] = batch[index]
        fields.pop("TFLOPS_per_GPU")
        if figure is not None:
            fields = {**{k: v for k, v in fields.items() if k != "consumed_samples"}, name: figure,
                      "consumed_samples": fields["consumed_samples"]}
        lines.append(f"Training epoch 0, iteration {step}/99 | " + " | ".join(f"{k}: {v}" for k, v in fields.items()))
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def b200_checks(capsys, tmp_path, figures, *options, model=("--model", "llama3-8b"), **lines):
    checks, err = crosscheck(capsys, tmp_path, b200_log(tmp_path, figures, **lines), *model, *options)
    return checks[0], err


@pytest.mark.parametrize("figure", ["nan", "inf", "-inf", "0", "-1.249e+03", "n/a"])
def test_figures_no_run_measures_are_not_checked(tmp_path, capsys, figure):
    check, err = b200_checks(capsys, tmp_path, [figure] * 3)
    assert check["verdict"] == "unusable" and check["lines"] == 3 and check["ratio"] is None
    assert "is no number a run could measure" in err


def test_a_bad_figure_among_good_ones_and_the_callbacks_first_step_without_one(tmp_path, capsys):
    """The callback's first step may print none (no step time yet); a NaN among good figures is named."""
    check, err = b200_checks(capsys, tmp_path, [None, "1.252e+03", "nan", "1.25e+03", "1253"])
    assert check["verdict"] == "agree_with_earlier_count" and check["lines"] == 4 and check["lines_without"] == 1
    assert check["unusable_lines"] == [3]
    assert "4 line(s), 1 more without it, 1 of them left out as NaN" in err


def test_an_absurd_figure_is_said_to_exceed_the_peak(tmp_path, capsys):
    check, _ = b200_checks(capsys, tmp_path, ["1.249e+30"] * 3, *B200)
    assert check["verdict"] == "disagree" and check["causes"][0].startswith("the log's figure is above the GPU's peak")


def test_one_line_off_is_mixed_and_named(tmp_path, capsys):
    check, err = b200_checks(capsys, tmp_path, ["1.249e+03", "1.252e+03", "2.496e+03", "1.25e+03"])
    assert check["verdict"] == "mixed" and check["disagreeing_lines"] == [3]
    assert "on 1 of 4 usable lines (line 3)" in err
    # the median fits the facts given: no other GPU count or length is offered for one stray line
    assert check["causes"] == [STRAY_LINES] and "--num-gpus 16" not in err


def test_nemo_2_5s_halved_count_agrees(tmp_path, capsys):
    """A figure at NeMo 2.5's count (causal attention halved): `agree`, our current count."""
    figures = [f"{llama3_8b('megatron') * 128 / 8 / 1e12 / float(s):.4}" for s, _ in B200_FIGURES]
    check, err = b200_checks(capsys, tmp_path, figures)
    assert check["verdict"] == "agree" and check["count"] == "megatron"
    assert "NeMo's count from 2.5" in err


def test_the_name_before_nemo_2_3_rules_out_the_halved_count(tmp_path, capsys):
    """`tflops_per_sec_per_gpu` is NeMo 2.0 to 2.2's name: before the halving, so a figure at the halved count is
    not agreement but a disagreement (whose causes name what fits)."""
    check, _ = b200_checks(capsys, tmp_path, [tf for _, tf in B200_FIGURES], name="tflops_per_sec_per_gpu")
    assert check["verdict"] == "agree_with_earlier_count" and check["field"].startswith("`tflops_per_sec_per_gpu:`")
    figures = [f"{llama3_8b('megatron') * 128 / 8 / 1e12 / s:.4}" for s, _ in B200_FIGURES]
    check, _ = b200_checks(capsys, tmp_path, figures, name="tflops_per_sec_per_gpu")
    assert check["verdict"] == "disagree"


def test_a_figure_computed_every_few_steps_allows_their_spread(tmp_path, capsys):
    """log_every_n_steps 3: the figure changes every third line, the mean of three steps' times; against each
    line's own time it is off by their spread, which is allowed (no false alarm), and said."""
    times = [6.0, 6.1, 6.2, 6.0, 6.1, 6.2]
    means = [statistics.mean(times[:3])] * 3 + [statistics.mean(times[3:])] * 3
    figures = [f"{llama3_8b('dgxc') * 128 / 8 / 1e12 / m:.4}" for m in means]
    check, err = b200_checks(capsys, tmp_path, figures, times=[str(t) for t in times])
    assert check["verdict"] == "agree_with_earlier_count"
    assert check["allowance"] >= max(times) / min(times) - 1
    assert "the spread of the step times it may average" in err


def test_a_wrong_gpu_count_is_still_found_through_the_spread(tmp_path, capsys):
    times = [6.0, 6.1, 6.2, 6.0, 6.1, 6.2]
    figures = [f"{llama3_8b('dgxc') * 128 / 8 / 1e12 / 6.1:.4}"] * 6
    check, _ = b200_checks(capsys, tmp_path, figures, "--num-gpus", "16", times=[str(t) for t in times])
    assert check["verdict"] == "disagree" and any(c.startswith("--num-gpus 8 fits it") for c in check["causes"])


def test_the_batch_changing_within_the_log_is_not_checked(tmp_path, capsys):
    check, err = b200_checks(capsys, tmp_path, ["1.249e+03"] * 3, "--window", "47:", batch=["64", "128", "128"])
    assert check["verdict"] == "skipped" and "NeMo's callback counts its configured global batch" in err


# ------------------------------------------------------------------ a family NeMo's formula counts otherwise
# Qwen3-30B-A3B as NeMo's recipe configures it: 32 heads of 128 (4,096 wide) on a 2,048-wide model
QWEN3_30B_A3B = {"num_layers": 48, "hidden_size": 2048, "ffn_hidden_size": 6144, "moe_ffn_hidden_size": 768,
                 "num_attention_heads": 32, "num_query_groups": 4, "kv_channels": 128, "vocab_size": 151936,
                 "num_moe_experts": 128, "moe_router_topk": 8, "gated_linear_unit": True}


def nemo_qwen3_flops_per_sample(spec, s):
    """NeMo's `qwen3` formula per sample, written out: heads taken h/n wide, causal attention halved, every
    layer 3 expert GEMMs of moe_ffn_hidden_size x top-k, the logits."""
    h, n, g, layers = spec["hidden_size"], spec["num_attention_heads"], spec["num_query_groups"], spec["num_layers"]
    attention = 6 * layers * s * h * h * ((g / n * 2 + 1) + s / h * 2 * 0.5 + 1)
    mlp = 6 * layers * s * h * 3 * spec["moe_ffn_hidden_size"] * spec["moe_router_topk"]
    return attention + mlp + 6 * s * h * spec["vocab_size"]


def test_a_model_nemos_family_formula_counts_otherwise_is_named_not_warned(tmp_path, capsys):
    """NeMo's `qwen3` formula takes the heads h/n wide: for Qwen3-30B-A3B (4,096-wide heads on h 2,048) it counts
    fewer FLOPs than the model's shape. A figure of that count agrees with NeMo's formula, named as such."""
    s, seconds = 4096, [2.5, 2.51, 2.49]
    ours = model_flops_per_sample(ModelSpec.from_dict({**QWEN3_30B_A3B, "seq_length": s}), "megatron")
    nemo = nemo_qwen3_flops_per_sample(QWEN3_30B_A3B, s)
    assert nemo / ours < 0.95  # it does count otherwise
    figures = [f"{nemo * 128 / 8 / 1e12 / t:.4}" for t in seconds]
    check, err = b200_checks(capsys, tmp_path, figures, "--seq-length", str(s), times=[str(t) for t in seconds],
                             model=("--model-spec", json.dumps(QWEN3_30B_A3B)))
    assert check["verdict"] == "agree_with_framework_count" and check["count"] == "nemo-formula"
    assert check["log_flops_per_sample"] == pytest.approx(nemo, rel=check["allowance"])
    assert "NeMo's `qwen3` formula counts this model otherwise than ours" in err and "warning" not in err


# ------------------------------------------------------------------ event files
def write_events(directory, rows, time_tag, batch_tag, rate_tag, step_offset=0):
    """rows: (step, seconds, batch, TFLOP/s or None), written with the real SummaryWriter."""
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(directory))
    for step, seconds, batch, tflops in rows:
        writer.add_scalar(time_tag, seconds, step + step_offset)
        writer.add_scalar(batch_tag, batch, step + step_offset)
        if tflops is not None:
            writer.add_scalar(rate_tag, tflops, step + step_offset)
    writer.close()
    return directory


def test_nemo_event_files_tflops_per_gpu_scalar_is_checked(tmp_path, capsys):
    seconds = [6.08, 6.061, 6.082, 6.071]
    rows = [(44 + i, t, 128, llama3_8b("dgxc") * 128 / 8 / 1e12 / t) for i, t in enumerate(seconds)]
    events = write_events(tmp_path / "tb", [(43, 6.1, 128, None), *rows], "train_step_timing in s",
                          "global_batch_size", "TFLOPS_per_GPU")
    checks, err = crosscheck(capsys, tmp_path, events, "--model", "llama3-8b")
    (check,) = checks
    assert check["field"] == "NeMo's `TFLOPS_per_GPU` scalar (its FLOPs callback's)"
    assert check["verdict"] == "agree_with_earlier_count" and check["lines"] == 4 and check["lines_without"] == 1
    assert check["allowance"] < 0.001  # float32 figures: only the vocabulary padding is allowed
    checks, _ = crosscheck(capsys, tmp_path, events, "--model", "llama3-8b", "--num-gpus", "16")
    assert checks[0]["verdict"] == "disagree"


def test_megatron_event_files_throughput_scalar_is_checked(tmp_path, capsys):
    """Megatron-LM's `throughput`, at the iteration of the `iteration-time` it divides by (both float32)."""
    mixtral = model_flops_per_sample(ModelSpec.from_dict({**preset("mixtral-8x7b").to_dict(), "seq_length": 2048}))
    rows = [(i * 10, t, 128, mixtral * 128 / 16 / 1e12 / t) for i, t in enumerate([5.44, 5.53, 5.71], start=1)]
    events = write_events(tmp_path / "tb", rows, "iteration-time", "batch-size", "throughput")
    checks, err = crosscheck(capsys, tmp_path, events, "--model", "mixtral-8x7b", seq_length=2048, num_gpus=16)
    (check,) = checks
    assert check["field"] == "Megatron-LM's `throughput` scalar"
    assert check["verdict"] == "agree" and check["count"] == "megatron" and check["lines"] == 3
    checks, _ = crosscheck(capsys, tmp_path, events, "--model", "mixtral-8x7b", seq_length=2048, num_gpus=8)
    assert checks[0]["verdict"] == "disagree" and any(c.startswith("--num-gpus 16 fits") for c in checks[0]["causes"])


@pytest.mark.parametrize("numbers", ["repeated", "going down"])
def test_step_numbers_no_run_prints_end_a_figure_s_window_at_its_own_line(numbers):
    """Step numbers that repeat or go down (a hostile or mangled log) end the walk back through a figure's
    interval at once: each figure is held against its own line, and 200,000 such lines are read in one
    pass (the walk once went back to the log's start for every figure: quadratic)."""
    from nemo_throughput.importers.crosscheck_nemo import _windows
    from nemo_throughput.importers.steps import Step

    count = 200_000
    steps = [Step(7 if numbers == "repeated" else count - i, 0.5 + i % 3 / 10, 32, i, None, float(i % 2))
             for i in range(count)]
    assert _windows(steps) == [(step.seconds, 0.0) for step in steps]


def test_a_repeated_figure_is_held_against_the_steps_of_the_interval_before_it():
    """The step times each line's figure may be the mean of: the callback's interval of steps up to the
    step where the figure was first printed (the interval: to the next figure's first step; the last
    figure's, the one before's). Held against that definition, applied line by line, on runs of every
    length (a figure the callback logs every few thousand steps is printed on every line between); a
    single figure is held against the lines around it."""
    import random

    from nemo_throughput.importers.crosscheck_nemo import _windows
    from nemo_throughput.importers.steps import Step

    rng = random.Random(7)
    figures = [f for figure in (1.0, 2.0, None, 3.0, 4.0) for f in [figure] * rng.randint(1, 6)]
    steps = [Step(i + 1, rng.choice([rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0), float("nan"), 0.0]), None,
                  i + 1, None, f) for i, f in enumerate(figures)]
    usable = [s.seconds for s in steps if s.seconds == s.seconds and s.seconds > 0]
    firsts = [i for i in range(len(steps)) if i == 0 or steps[i - 1].tflops_per_gpu != steps[i].tflops_per_gpu]

    def by_definition(index):
        run = max(k for k, first in enumerate(firsts) if first <= index)
        nearest = run + 1 if run + 1 < len(firsts) else run
        interval = steps[firsts[nearest]].step - steps[firsts[nearest - 1]].step
        start = steps[firsts[run]].step
        times = [s.seconds for s in steps if start - interval <= s.step <= start
                 and s.seconds == s.seconds and s.seconds > 0]
        return (sum(times) / len(times), max(times) / min(times) - 1) if times else (math.nan, 0.0)

    assert usable and len(firsts) > 2
    for index, (mean, spread) in enumerate(_windows(steps)):
        expected_mean, expected_spread = by_definition(index)
        assert spread == pytest.approx(expected_spread)
        assert mean == pytest.approx(expected_mean, nan_ok=True)
    one = [Step(i + 1, t, None, i + 1, None, 5.0) for i, t in enumerate([1.0, 2.0, 1.5])]
    assert _windows(one) == [(1.0, 1.0), (2.0, 1.0), (1.5, 1.0)]
