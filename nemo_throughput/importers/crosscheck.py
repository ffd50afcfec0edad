"""The facts given to `import` checked against the model TFLOP/s per GPU a log states.

An import's MFU and model TFLOP/s come from --model/--model-spec, --seq-length, the batch and
--num-gpus: a wrong one (an 8B preset for a 70B run, 8 GPUs for 64) makes them wrong without a
word. Megatron-LM, Megatron-Bridge, AMD Primus and NeMo 2's FLOPs callback print their own figure,
counted from the run's real configuration::

    TFLOP/s per GPU = FLOPs per sample x global batch / seconds per step / world size / 1e12

so every such figure states the FLOPs per sample its framework counted, given our GPU count and
batch: TFLOP/s x 1e12 x seconds x --num-gpus / batch. That is compared with ours under the counts
the framework printed (importers.crosscheck_megatron, importers.crosscheck_nemo). Tolerance: the
printed digits of both numbers, the spread of step times where the figure may be another step's
mean, and the vocabulary padding one count may have and the other not (at most 128 x TP rows, TP
within a node). Details our spec cannot describe (multi-latent or sliding-window attention,
multi-token prediction, packed sequences) have no tolerance: they are named as causes instead.

A disagreement is a warning, never a refusal: the log's own count can be the wrong one (a
Megatron-Bridge run counts its model's ``seq_length``, which need not be the data's).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from nemo_throughput.config import LARGEST_BATCH_OR_LENGTH
from nemo_throughput.flops import FORMULAS, ModelSpec, flops_terms

SAFETY = 1.5  # on the rounding bound, as for the tokens/s check (logs.ROUNDED)
VOCAB_MULTIPLE = 128  # Megatron pads the vocabulary to 128 x TP; Bridge to a power of two up to 128, x TP
SEQ_GRANULE = 1024  # sequence lengths named as a cause are multiples of it (or powers of two below it)
MAX_GPUS = 1_000_000  # a GPU count named as a cause is one import accepts (importers.mlperf.systems.MAX_COUNT)
MAX_LISTED = 10
STRAY_LINES = ("the lines' median agrees with the facts given, so only those lines stand apart: a figure "
               "averaging steps the log prints otherwise (a stall, a save, start-up), or a line edited or cut")
FLOAT32_SPACING = 2.0 ** -23  # an event file's scalar is a float32
AGREEING = ("agree", "agree_with_earlier_count", "agree_with_framework_count")


def float32_unit(value: float) -> float:
    """What an event file's float32 scalar is rounded to."""
    return abs(value) * FLOAT32_SPACING if math.isfinite(value) else 0.0


@dataclass(frozen=True)
class StatedRate:
    """One line's own TFLOP/s per GPU, with the time and batch it was computed from."""

    line: int  # or the value's place in event files
    tflops: float  # as printed: may be NaN, infinite, zero or negative
    seconds: float  # the time per step it divides by, as printed
    tflops_unit: float  # what the figure is printed to
    time_unit: float  # what that time is printed to, in seconds
    batch: int
    spread: float = 0.0  # relative spread of the step times the figure may be the mean of, where not its own

    @property
    def usable(self) -> bool:
        return all(math.isfinite(v) and v > 0 for v in (self.tflops, self.seconds))

    def flops_per_sample(self, num_gpus: int) -> float:
        """The FLOPs per sample the line's figure stands for, on ``num_gpus`` GPUs."""
        return self.tflops * 1e12 * self.seconds * num_gpus / self.batch

    @property
    def rounding(self) -> float:
        """Relative error its printed digits allow (half a unit of each of the two numbers)."""
        return self.tflops_unit / 2 / self.tflops + self.time_unit / 2 / self.seconds


@dataclass(frozen=True)
class Count:
    """A FLOPs count to compare with: its FLOPs per sample, and what may move it (padding)."""

    name: str  # megatron, full-attention, 4h-mlp, nemo-formula, nemo-formula-full-attention, given
    what: str  # in words, for notes
    flops_per_sample: float
    terms: tuple[float, float] | None = None  # (per token, per token pair): to solve for a sequence length
    padding: float = 0.0  # relative share the vocabulary padding may add or take
    verdict: str = "agree"  # what every line agreeing with it means (agree: the facts and our current count)
    remark: str = ""  # what that agreement says of the run, for notes

    def flops_at(self, seq_length: int) -> float:
        per_token, per_pair = self.terms
        return per_token * seq_length + per_pair * seq_length ** 2


@dataclass(frozen=True)
class Facts:
    """What `import` was given, or read, that the log's figure depends on."""

    model: str  # how the model was given, for notes: "--model llama3-8b"
    seq_length: int
    batch: int
    batch_stated: bool  # read from the log (then not a cause)
    num_gpus: int
    num_nodes: int
    peak_tflops: float | None = None
    formula: str = "megatron"  # the summary's own --flops-formula
    framework_counts: str = ""  # the framework's counts a disagreement may come from, named with the model

    @property
    def gpus_per_node(self) -> int:
        return math.ceil(self.num_gpus / self.num_nodes)


@dataclass
class Result:
    """The check of one field of a log."""

    field: str
    verdict: str  # agree, agree_with_earlier_count, agree_with_framework_count, mixed, disagree, unusable, skipped
    lines: int = 0
    count: Count | None = None  # the count the lines agree with
    log_tflops: float | None = None  # medians over the usable lines
    log_flops_per_sample: float | None = None  # what the log's figure stands for, on our GPU count and batch
    ours_tflops: float | None = None  # under the current count
    ratio: float | None = None  # the log's / ours
    allowance: float | None = None
    spread: bool = False  # whether the allowance holds a step-time spread (not recorded: the note says it)
    disagreeing: list[int] = field(default_factory=list)
    unusable: list[int] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    reason: str = ""  # why a field is skipped
    missing: int = 0  # lines of its kind that do not state it
    averaging: int = 0  # lines left out: their figure may average step times too far apart to check
    note: str = ""

    def record(self) -> dict[str, Any]:
        """model.flops_crosscheck's entry (summary schema)."""
        return {"field": self.field, "verdict": self.verdict, "lines": self.lines,
                "count": self.count.name if self.count else None, "log_tflops_per_gpu": self.log_tflops,
                "log_flops_per_sample": self.log_flops_per_sample,
                "ours_tflops_per_gpu": self.ours_tflops, "ratio": self.ratio, "allowance": self.allowance,
                "disagreeing_lines": self.disagreeing[:MAX_LISTED], "unusable_lines": self.unusable[:MAX_LISTED],
                "lines_without": self.missing, "causes": self.causes, "note": self.note}


# ------------------------------------------------------------------ the counts compared with
GIVEN = Count("given", "--flops-per-sample as given (its convention not known)", math.nan)


def given_count(flops_per_sample: float) -> list[Count]:
    """The one count there is when FLOPs per sample are given as is."""
    return [Count(GIVEN.name, GIVEN.what, flops_per_sample)]


def count(name: str, what: str, spec: ModelSpec, formula: str, padding: float, **meaning: str) -> Count:
    """``spec``'s count under ``formula``; ``meaning``: the Count's verdict and remark."""
    terms = flops_terms(spec, formula)
    s = spec.seq_length
    return Count(name, what, terms[0] * s + terms[1] * s * s, terms, padding, **meaning)


def padding_share(spec: ModelSpec, gpus_per_node: int) -> float:
    """The share of a sample's FLOPs that vocabulary padding can make: the logits GEMM (3 x 2 x h x V per
    token) of up to 128 x TP - 1 more rows, TP at most a node's GPUs."""
    rows = VOCAB_MULTIPLE * max(gpus_per_node, 1) - 1
    per_token, per_pair = flops_terms(spec, "megatron")
    return 6 * spec.hidden_size * rows / (per_token + per_pair * spec.seq_length)


# ------------------------------------------------------------------ the check
def check(field_name: str, rates: list[StatedRate], counts: list[Count], facts: Facts) -> Result:
    """The lines' figures against the counts: the one most lines agree with (the current count on a tie)."""
    usable = [r for r in rates if r.usable]
    result = Result(field_name, "unusable", len(rates), unusable=[r.line for r in rates if not r.usable])
    if not usable:
        return result
    agreeing = [[r for r in usable if _agrees(r, c, facts.num_gpus)] for c in counts]  # by place: names repeat
    place = max(range(len(counts)), key=lambda k: len(agreeing[k]))  # max keeps the first of equals
    if not agreeing[place]:
        place = 0
    best, agreed = counts[place], agreeing[place]
    _compare(result, usable, best, facts.num_gpus)
    agreeing_ones = {id(r) for r in agreed}  # by identity: a dataclass' == in a list scan is quadratic
    result.disagreeing = [r.line for r in usable if id(r) not in agreeing_ones]
    if agreed:
        result.count = best
    if len(agreed) == len(usable):
        result.verdict = best.verdict
        return result
    result.verdict = "mixed" if agreed else "disagree"
    if agreed and _within(result.log_flops_per_sample, best.flops_per_sample, result.allowance):
        result.causes = [STRAY_LINES]  # other facts fitting the median would be fitting what already fits
    else:
        result.causes = causes(result.log_flops_per_sample, result.allowance, result.log_tflops, counts, facts)
    return result


def _compare(result: Result, usable: list[StatedRate], count: Count, num_gpus: int) -> None:
    """The medians of the log's figures, of ours under ``count`` (each line's own time and batch) and of
    their ratio, and the largest allowance."""
    result.log_tflops = statistics.median(r.tflops for r in usable)
    result.log_flops_per_sample = statistics.median(r.flops_per_sample(num_gpus) for r in usable)
    result.ours_tflops = statistics.median(count.flops_per_sample * r.batch / r.seconds / num_gpus / 1e12
                                           for r in usable)
    result.ratio = result.log_flops_per_sample / count.flops_per_sample  # the median's, over a constant
    result.allowance = max(_allowance(r, count) for r in usable)
    result.spread = any(r.spread for r in usable)


def _allowance(rate: StatedRate, count: Count) -> float:
    return SAFETY * rate.rounding + rate.spread + count.padding


def _agrees(rate: StatedRate, count: Count, num_gpus: int) -> bool:
    return _within(rate.flops_per_sample(num_gpus), count.flops_per_sample, _allowance(rate, count))


def _within(value: float, reference: float, allowance: float) -> bool:
    return abs(value / reference - 1) <= allowance


# ------------------------------------------------------------------ what would explain a disagreement
def causes(implied: float, allowance: float, log_tflops: float, counts: list[Count], facts: Facts) -> list[str]:
    """What fits the log's figure (FLOPs per sample ``implied`` on our GPU count and batch), most
    telling first; the model, and what our spec cannot describe, always last."""
    found = _above_peak(log_tflops, facts)
    for cause in (_gpu_cause, _batch_cause, _seq_length_cause):
        found += [text] if (text := cause(implied, allowance, counts, facts)) else []
    if counts[0].name == GIVEN.name:
        return [*found, "--flops-per-sample is not this run's, or is of another convention (`dgxc` counts attention "
                        "in full)"]
    return [*found, f"{facts.model} is not the run's model (another size, vocabulary, number of experts or top-k), or "
                    "the run has what a model spec does not describe (multi-latent or sliding-window attention, "
                    "multi-token prediction, packed sequences: their attention is counted per sequence)"
                    + (f", or {facts.framework_counts}" if facts.framework_counts else "")]


def _above_peak(log_tflops: float, facts: Facts) -> list[str]:
    if facts.peak_tflops is None or log_tflops <= facts.peak_tflops:
        return []
    return [f"the log's figure is above the GPU's peak of {facts.peak_tflops:,.1f} TFLOP/s: its own count is wrong"]


def _gpu_cause(implied: float, allowance: float, counts: list[Count], facts: Facts) -> str | None:
    """The log's figure per GPU is the same FLOPs over another GPU count: ours x (given / real). Only a
    count a power of two from the one given is named (a node's 8, twice as many): some count near any
    figure is a whole number."""
    for count in counts:
        gpus = _power_of_two_from(facts.num_gpus, facts.num_gpus * count.flops_per_sample / implied)
        if gpus is not None and gpus <= MAX_GPUS and _within(implied * gpus / facts.num_gpus,
                                                             count.flops_per_sample, allowance):
            per_node = (f", or the log's figure is per node of {facts.num_gpus // facts.num_nodes} GPUs, not per GPU"
                        if gpus == facts.num_nodes < facts.num_gpus else "")
            return f"--num-gpus {gpus:,} fits it (under {count.what}){per_node}"
    return None


def _batch_cause(implied: float, allowance: float, counts: list[Count], facts: Facts) -> str | None:
    """A batch given (the log states none) that is not the run's: the figure is ours x (real / given)."""
    if facts.batch_stated:
        return None
    for count in counts:
        batch = _power_of_two_from(facts.batch, facts.batch * implied / count.flops_per_sample)
        if batch is not None and batch <= LARGEST_BATCH_OR_LENGTH and _within(implied * facts.batch / batch,
                                                                              count.flops_per_sample, allowance):
            return f"--global-batch-size {batch:,} fits it (under {count.what})"
    return None


def _power_of_two_from(given: int, value: float) -> int | None:
    """The whole number nearest ``value`` that is ``given`` times or divided by a power of two (not 1)."""
    if not value > 0:
        return None
    nearest = given * 2.0 ** round(math.log2(value / given))
    return int(nearest) if nearest != given and nearest >= 1 and nearest == int(nearest) else None


def _seq_length_cause(implied: float, allowance: float, counts: list[Count], facts: Facts) -> str | None:
    """The sequence length at which a count gives the log's FLOPs per sample, where it is one runs train
    with (a power of two, or a multiple of 1,024): some length meets any figure."""
    for count in counts:
        if count.terms is None:
            continue
        per_token, per_pair = count.terms
        exact = (-per_token + math.sqrt(per_token ** 2 + 4 * per_pair * implied)) / (2 * per_pair)
        length = _usual_length(exact)
        if (length is not None and length != facts.seq_length
                and _within(implied, count.flops_at(length), allowance)):
            return (f"--seq-length {length:,} fits it (under {count.what}): the log may count another length than "
                    "its data's (Megatron-Bridge counts its model's seq_length)")
    return None


def _usual_length(exact: float) -> int | None:
    """The nearest multiple of 1,024 (a power of two below it), within LARGEST_BATCH_OR_LENGTH."""
    if not 1 <= exact <= LARGEST_BATCH_OR_LENGTH:
        return None
    if exact >= SEQ_GRANULE:
        return round(exact / SEQ_GRANULE) * SEQ_GRANULE
    return 2 ** round(math.log2(exact))


# ------------------------------------------------------------------ what import says
def note(result: Result, facts: Facts, counts: list[Count]) -> str:
    """The note (or warning) of one field's check, naming both figures."""
    lines = _lines_text(result)
    if result.verdict == "skipped":
        return f"the log's own model TFLOP/s per GPU, {result.field} ({lines}), not cross-checked: {result.reason}"
    if result.verdict == "unusable":
        return (f"warning: the log's own model TFLOP/s per GPU, {result.field}, is no number a run could measure "
                f"(NaN, infinite, zero or negative) on all its {lines}: the facts given are not cross-checked")
    spread = ", the spread of the step times it may average" if result.spread else ""
    given = (f"{facts.model}, --seq-length {facts.seq_length:,}, global batch {facts.batch:,} and --num-gpus "
             f"{facts.num_gpus:,}")
    figures = (f"{result.log_tflops:,.1f} in the log ({result.log_flops_per_sample:.4g} FLOPs per sample), "
               f"{result.ours_tflops:,.1f} ours (ratio {result.ratio:.4g}, allowed ±{result.allowance:.2%} for its "
               f"printed digits{spread} and vocabulary padding)")
    if result.verdict in AGREEING:
        remark = f"; {result.count.remark}" if result.count.remark else ""
        return (f"the log's own model TFLOP/s per GPU, {result.field} ({lines}), agree with ours from {given} under "
                f"{result.count.what}{remark}: {figures}; the figures are cross-checked{_formula_clause(facts)}")
    which = (f"on {len(result.disagreeing)} of {result.lines - len(result.unusable)} usable lines (line "
             f"{_listed(result.disagreeing)})" if result.verdict == "mixed" else f"({lines})")
    count = result.count or counts[0]
    return (f"warning: the log's own model TFLOP/s per GPU, {result.field}, disagree with ours from {given} under "
            f"{count.what} {which}: {figures}. Likely causes: {'; '.join(result.causes)}. MFU and model "
            "TFLOP/s are computed from the facts given: check them (the log's own count may be the wrong one)")


def _lines_text(result: Result) -> str:
    """``6 line(s), 2 more without it, 1 of them left out as NaN ... (line 7)``."""
    text = f"{result.lines} line(s)" + (f", {result.missing} more without it" if result.missing else "")
    if result.averaging:
        text += (f", {result.averaging} more left out: their figure may average step times too far apart to "
                 "check (the first steps' start-up, a stall)")
    if result.unusable:
        text += (f", {len(result.unusable)} of them left out as NaN, infinite, zero or negative (line "
                 f"{_listed(result.unusable)})")
    return text


def _formula_clause(facts: Facts) -> str:
    if facts.formula not in FORMULAS or facts.formula == "megatron":  # `user`: the figure given is what was checked
        return ""
    return (f" (the summary's own MFU and TFLOP/s use --flops-formula {facts.formula}, a count of another "
            "convention, by design)")


def _listed(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:MAX_LISTED])) + (" ..." if len(numbers) > MAX_LISTED else "")


@dataclass(frozen=True)
class Source:
    """A field's figures in a log, why they are not checked (None: they are), and how many lines of
    their kind state none."""

    rates: list[StatedRate]
    skipped: str | None = None
    missing: int = 0
    averaging: int = 0  # lines left out: their figure may average step times too far apart to check


def check_log(sources: dict[str, Source], counts: list[Count], facts: Facts) -> list[Result]:
    """Every field a log states checked, each with its note; fields without a line are left out."""
    results = []
    for field_name, source in sources.items():
        if not source.rates:
            continue
        if source.skipped is not None:
            result = Result(field_name, "skipped", len(source.rates), reason=source.skipped)
        else:
            result = check(field_name, source.rates, counts, facts)
        result.missing, result.averaging = source.missing, source.averaging
        result.note = note(result, facts, counts)
        results.append(result)
    return results
