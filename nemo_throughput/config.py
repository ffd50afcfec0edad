"""Settings of the throughput callback: one dataclass, shared by Python and Hydra users."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from nemo_throughput.flops import FLOPS_FORMULAS, FORMULAS, MEASURED, ModelSpec, require_positive_int
from nemo_throughput.hardware import DTYPES, check_dtype
from nemo_throughput.target import checked_target
from nemo_throughput.throughput import RATES
from nemo_throughput.values import is_int, is_number

# Above these a value is a typo or a unit mix-up (and overflows the arithmetic), not a run.
LARGEST_BATCH_OR_LENGTH = 2**24  # sequences per step, or tokens per sequence
LARGEST_PEAK_TFLOPS = 1e5  # per GPU: ten times the largest dense peak sold (FP4)
LARGEST_FLOPS_PER_SAMPLE = 1e21  # a 10-trillion-parameter model on a million-token sequence is ~6e19
# Below this per token a FLOPs figure is in another unit (TFLOPs, GFLOPs): training a token costs at least one
# multiply-add (2 FLOPs) in the forward pass and two in the backward pass, through a single weight.
FEWEST_FLOPS_PER_TOKEN = 6
# UTF-8 bytes in run_name or model_name: a run's name names its directory where output_dir holds another
# run (a file name is at most 255 bytes; the default name adds ~25 to the model's, a repeat `-NN`)
LONGEST_NAME_BYTES = 200
# prometheus.linger_s: the endpoint serves after the run until a scrape reads the final figures, at most this
DEFAULT_LINGER_S = 30.0  # two of Prometheus' default 15 s scrapes
LONGEST_LINGER_S = 3600.0


@dataclass
class ThroughputConfig:
    """Every key of ``callbacks.throughput`` / ``ThroughputCallback(...)``, with its default.

    Model shape and batch settings override what is read from the model's own config; leave
    them unset for NeMo models and the demo, set them for plain Lightning modules.
    """

    log_every_n_steps: int = 10
    """Steps between cross-rank exchanges, log lines, logger metrics and summary writes."""
    warmup_steps: int = 10
    """First steps of the run left out of the statistics (allocator, NCCL and kernel warm-up). Where
    they are all the run trains, a warning at train start says that nothing will be measured."""
    output_dir: str | None = None
    """Where `summary.json` (and `steps.jsonl`) go. Default: `$NEMO_THROUGHPUT_OUTPUT_DIR`, else
    `<trainer.log_dir>/throughput`. If another run already wrote there, `<output_dir>/<run_name>/`.
    A leading `~` is your home directory, in the setting and the variable alike."""
    run_name: str | None = None
    """`run.name`. Default: `<model>_<nodes>n<gpus>g_<UTC start>`. At most 200 bytes (as is
    `model_name`): it names the run's directory where `output_dir` holds another run."""
    run_label: str | None = None
    """`run.label`, a free label such as `bare-metal` or `kubernetes`. Default:
    `$NEMO_THROUGHPUT_RUN_LABEL`, else the orchestrator."""
    model_name: str | None = None
    """`model.name`. Default: from the parameter count, e.g. `gpt-124m`."""
    model_spec: Mapping[str, Any] | None = None
    """`ModelSpec` fields (`num_layers`, `hidden_size`, ...); each one given overrides the one read
    from the model. Needed for a plain LightningModule."""
    flops_formula: str = "megatron"
    """`megatron` or `dgxc` (the GPT formulas, see the arithmetic page), or `measured`: any model, its
    FLOPs counted on the run's first training step (needs `warmup_steps >= 1`)."""
    flops_per_sample: float | None = None
    """Model FLOPs per sample as published (e.g. a recipe's rounded `3.94e15`), used as is and
    recorded as `model.flops_formula: user`; the model shape is then optional (give `model_name`,
    and `seq_length` for tokens/s). Not together with `flops_formula: measured`. FLOPs, not TFLOPs: fewer
    than 6 per token of `seq_length` (what training a token costs at least) are refused. Where the model's
    shape is known too, a figure more than 2 times from both FLOPs conventions' count for it is used, with a
    warning naming the likely slip (per token, per global batch, GFLOPs, the forward pass only)."""
    rate: str = "auto"
    """The primary rate (`throughput.primary`): `tokens` (tokens/s; needs a sequence length),
    `samples` (samples/s: images, ...), or `auto`: tokens/s when `seq_length` is known, else samples/s."""
    global_batch_size: int | None = None
    """Samples per optimizer step. Default: from the model config; refused unless a positive multiple
    of `micro_batch_size` x the data-parallel size."""
    micro_batch_size: int | None = None
    """Samples per micro-batch, used to derive the global batch if it is not known. Default: from the
    model config."""
    seq_length: int | None = None
    """Tokens per sample. Default: from the model or data config; without it (and without a model
    shape that gives it) the rate is samples/s. Given with `model_spec.seq_length`, the two must be equal."""
    dtype: str | None = None
    """Which peak MFU uses: `fp4`, `fp8`, `bf16`, `fp16`, `tf32` or `fp32`. Default: from the trainer's
    precision (and the model config's fp8/fp4 flags)."""
    peak_tflops: float | None = None
    """Dense peak TFLOPS per GPU. Default: from the GPU table; set it for parts the table lacks. One more
    than 1.5 times from the table's figure for the same GPU and dtype (a node's peak, a sparse one) is warned of."""
    per_step_jsonl: bool = False
    """Also write `steps.jsonl`: every step, every rank's phases."""
    telemetry: bool = True
    """Read memory, clocks, power, temperature, throttling and the energy counter on each rank at log
    steps (off the hot path)."""
    profile_steps: tuple[int, int] | None = None
    """`[first, last]`: profile these global steps (inclusive); they are logged but left out of the
    statistics. A window inside the warm-up (or before a resumed run's first step) or past the run's
    last step is refused at train start."""
    profile_mode: str = "torch"
    """`torch`: compute / communication / exposed communication / idle from `torch.profiler`; `nsys`:
    `cudaProfilerStart/Stop` and NVTX ranges for `nsys --capture-range=cudaProfilerApi`."""
    profile_trace_ranks: tuple[int, ...] | None = None
    """Ranks that also write a chrome trace of the profile window (`traces/rank<N>.json` beside the summary);
    a rank the run does not have is said at train start."""
    probe: bool = False
    """Run the fabric probe (collectives' busbw, matmul TFLOP/s per rank) before training."""
    target: Mapping[str, Any] | None = None
    """Time to target, MLPerf's way: `{metric, value, mode}` with `mode` `min` (a loss: reached at or
    below `value`) or `max` (an accuracy), and optionally `stop: true` (end training when reached).
    `metric` is a key of `trainer.callback_metrics` (what `self.log` logs); the clock runs from set-up."""
    mllog: bool = False
    """Also write MLPerf `:::MLLOG` lines (needs `target` and `pip install 'nemo-throughput[mlperf]'`)."""
    stall_factor: float = 10.0
    """The stall watch: no step for `stall_factor` x the median step (and at least `stall_min_s`) is a
    stall. Each rank then dumps its threads' Python stacks beside the summary, and the summary says
    `stalled` until steps resume. `0` turns the watch off."""
    stall_min_s: float = 300.0
    """The shortest time without a step that is a stall, seconds. Set it above the run's longest
    validation or checkpoint save: no step ends during those either."""
    prometheus: Mapping[str, Any] | None = None
    """Serve live metrics at `http://<addr>:<port>/metrics` from rank 0: `{port, addr, linger_s}` (`addr`
    default `0.0.0.0`; `linger_s`: after the run ends, serve until a scrape has read its final figures, at most
    that long, default 30, at most 3600; 0, or nothing scraped it during the run: stop at once). Default:
    on when `$NEMO_THROUGHPUT_PROMETHEUS_PORT` is set, on that port. Needs
    `pip install 'nemo-throughput[prometheus]'`; a port already taken is a warning, and training goes on."""

    def __post_init__(self) -> None:
        # Every field is checked for its type too: Hydra hands `peak_tflops=abc` over as a string
        # and `run_label=123` as an int, and a wrong value must stop the run, naming the setting.
        for name in ("output_dir", "run_name", "run_label", "model_name", "flops_formula", "dtype", "profile_mode",
                     "rate"):
            _check_text(name, getattr(self, name))
        for name in ("run_name", "model_name"):
            _check_name(name, getattr(self, name))
        if self.output_dir is not None:
            self.output_dir = os.fspath(self.output_dir)
        if not is_int(self.log_every_n_steps) or self.log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be an integer >= 1, got {self.log_every_n_steps!r}")
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        for name in ("global_batch_size", "micro_batch_size", "seq_length"):
            if getattr(self, name) is not None:
                check_batch_or_length(name, getattr(self, name))
        if self.flops_formula not in FLOPS_FORMULAS:
            raise ValueError(f"Unknown flops_formula {self.flops_formula!r}; choose one of {list(FORMULAS)} "
                             f"(GPT formulas) or {MEASURED!r} (any model: counted on its first training step)")
        if self.dtype is not None:
            self.dtype = check_dtype(self.dtype)
        check_flops_settings(self.peak_tflops, self.flops_per_sample, self.seq_length)
        self._check_measured()
        if self.rate not in RATE_CHOICES:
            raise ValueError(f"Unknown rate {self.rate!r}; choose one of {list(RATE_CHOICES)} (auto: tokens/s when "
                             "seq_length is known, else samples/s)")
        for name in ("per_step_jsonl", "telemetry", "probe", "mllog"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r} ({type(value).__name__})")
        check_positive_number("stall_min_s", self.stall_min_s, "of seconds")
        if not (is_number(self.stall_factor) and self.stall_factor == 0):  # 0: no watch (False is no 0)
            check_positive_number("stall_factor", self.stall_factor, "(times the median step; 0: no stall watch)")
        self.profile_steps = _checked_profile_steps(self.profile_steps)
        if self.profile_mode not in PROFILE_MODES:
            raise ValueError(f"Unknown profile_mode {self.profile_mode!r}; choose one of {list(PROFILE_MODES)}")
        self.profile_trace_ranks = _checked_ranks(self.profile_trace_ranks)
        self.model_spec = _checked_model_spec(self.model_spec)
        check_one_seq_length(self.seq_length, self.model_spec, "seq_length", "model_spec.seq_length")
        self.target = checked_target(self.target)
        self.prometheus = checked_prometheus(self.prometheus)
        if self.mllog and self.target is None:
            raise ValueError("mllog: true writes MLPerf's run_start/run_stop around a time to target: set target "
                             "too, e.g. target={metric: val_loss, value: 2.5, mode: min}")

    def _check_measured(self) -> None:
        if self.flops_formula != MEASURED:
            return
        if self.flops_per_sample is not None:
            raise ValueError("flops_per_sample and flops_formula: measured both say what a sample costs; "
                             "give one of them.")
        if self.warmup_steps < 1:
            raise ValueError("flops_formula: measured counts the FLOPs of the first training step, which the "
                             "counting slows down, so that step must be a warm-up step: set warmup_steps >= 1.")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ThroughputConfig:
        """Build from keyword settings, naming the valid keys if one is misspelt."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ValueError(f"Unknown throughput setting(s) {unknown}; valid keys: {valid}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PROFILE_MODES = ("torch", "nsys")
RATE_CHOICES = ("auto", *RATES)
_CHOICES = {"rate": RATE_CHOICES, "flops_formula": FLOPS_FORMULAS, "dtype": DTYPES, "profile_mode": PROFILE_MODES}


def check_positive_number(name: str, value: Any, unit: str, largest: float = math.inf, hint: str = "") -> None:
    """None, or a positive finite int/float up to ``largest`` (a bool or a numeric string is a mistake,
    not a number); ``hint`` says what a value over ``largest`` probably meant."""
    if value is None:
        return
    if not is_number(value):
        raise ValueError(f"{name} must be a number {unit}, got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number {unit}, got {value!r}")
    if value > largest:
        raise ValueError(f"{name} must be at most {largest:g} {unit.removeprefix('of ')}, got {value:g}{hint}")


def check_batch_or_length(name: str, value: Any) -> None:
    """A batch size or a sequence length, as a setting or an import's argument gives it: a positive int,
    at most LARGEST_BATCH_OR_LENGTH (no run has more; a larger one is a typo, and overflows the rates)."""
    require_positive_int(name, value, prefix="")
    if value > LARGEST_BATCH_OR_LENGTH:
        raise ValueError(f"{name} must be at most {LARGEST_BATCH_OR_LENGTH:,}, got {value!r}")


def check_one_seq_length(seq_length: int | None, spec: Mapping[str, Any] | None, name: str, spec_name: str) -> None:
    """A sequence length given twice, as itself and in the model spec, must be one: the given one
    replaces the spec's, which would otherwise be dropped without a word."""
    in_spec = (spec or {}).get("seq_length")
    if seq_length is not None and in_spec is not None and in_spec != seq_length:
        raise ValueError(f"{name} {seq_length} and {spec_name} {in_spec} disagree: give one of them (tokens/s "
                         "and the FLOPs count the same sequences)")


def check_flops_settings(peak_tflops: Any, flops_per_sample: Any, seq_length: int | None = None) -> None:
    """The peak and the FLOPs per sample, as settings and as an import's arguments give them; with the
    sequence length, FLOPs per sample too few for its tokens (a figure in TFLOPs or GFLOPs) are refused:
    its MFU would be written, a trillion times too small, as if fine."""
    check_positive_number("peak_tflops", peak_tflops, "of TFLOPS per GPU", LARGEST_PEAK_TFLOPS,
                          " (FLOPS given for TFLOPS? an H100's dense BF16 peak is 989)")
    check_positive_number("flops_per_sample", flops_per_sample, "of model FLOPs per sample", LARGEST_FLOPS_PER_SAMPLE)
    if flops_per_sample is not None and seq_length and flops_per_sample < FEWEST_FLOPS_PER_TOKEN * seq_length:
        raise ValueError(f"flops_per_sample {flops_per_sample:g} is less than {FEWEST_FLOPS_PER_TOKEN} FLOPs per token "
                         f"of a {seq_length:,}-token sample ({FEWEST_FLOPS_PER_TOKEN * seq_length:,}), the least "
                         "training a token costs: give model FLOPs per sample, not TFLOPs or GFLOPs (a 1B-parameter "
                         "model at 2,048 tokens is about 1.2e13)")


def _checked_profile_steps(value: Any) -> tuple[int, int] | None:
    """[first, last] global steps, 1 <= first <= last; a list from Hydra or Python alike."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"profile_steps must be [first, last] global steps, got {value!r}; "
                         "with Hydra: callbacks.throughput.profile_steps=[20,25]")
    first, last = value
    for step in (first, last):
        require_positive_int("profile_steps", step, prefix="")
    if first > last:
        raise ValueError(f"profile_steps must be [first, last] with first <= last, got [{first}, {last}]")
    return (first, last)


def check_profile_window(profile_steps: tuple[int, int] | None, warmup_steps: int, start_step: int,
                         max_steps: int | None) -> None:
    """A profile window must lie inside the measured part of this run: after the warm-up steps
    (start_step + 1 .. start_step + warmup_steps, after a resumed checkpoint too) and at or before
    the last step; else its breakdown would profile warm-up, or nothing at all, without a word."""
    if profile_steps is None:
        return
    first, last = profile_steps
    measured_from = start_step + warmup_steps + 1
    if first < measured_from:
        raise ValueError(f"profile_steps [{first}, {last}] starts inside the warm-up or before this run: it starts at "
                         f"step {start_step + 1} with {warmup_steps} warm-up steps, so profile from step "
                         f"{measured_from} on (callbacks.throughput.profile_steps=[{measured_from},"
                         f"{measured_from + last - first}] with Hydra)")
    if max_steps is not None and measured_from > max_steps:
        raise ValueError(f"profile_steps [{first}, {last}]: this run measures no step to profile (steps "
                         f"{start_step + 1}-{max_steps} are all warm-up, warmup_steps {warmup_steps}); train more "
                         "steps, lower warmup_steps, or drop profile_steps")
    if max_steps is not None and last > max_steps:
        raise ValueError(f"profile_steps [{first}, {last}] ends after the run's last step {max_steps}: choose a "
                         f"window inside steps {measured_from}-{max_steps}")


def check_at_train_start(config: ThroughputConfig, start_step: int, max_steps: int | None,
                         world_size: int, ramp: dict[str, int] | None = None) -> list[str]:
    """The settings against the run's length and size, once known: a profile window outside it is
    refused (:func:`check_profile_window`); returned, what to say of settings it cannot honour: every
    step warm-up (the summary's figures would all be null), trace ranks it does not have (no trace);
    and of a batch-size ramp (run_facts.RunFacts.batch_ramp) still under way, that its steps are warm-up."""
    check_profile_window(config.profile_steps, config.warmup_steps, start_step, max_steps)
    said = []
    ramp_steps = ramp["steps"] if ramp else 0
    if ramp_steps > start_step:
        said.append(f"nemo-throughput: the global batch ramps up from {ramp['start']} over steps 1-{ramp_steps} "
                    f"(rampup_batch_size {[ramp['start'], ramp['increment'], ramp['samples']]}): they are warm-up, "
                    "left out of tokens/s, TFLOPS and MFU, which are the full batch's.")
    if max_steps is not None and max(start_step + config.warmup_steps, ramp_steps) >= max_steps:
        why = f"warmup_steps {config.warmup_steps}" + (", and the batch-size ramp" if ramp_steps > start_step else "")
        said.append(f"nemo-throughput: steps {start_step + 1}-{max_steps} are all warm-up ({why}): this run measures "
                    "no step, and every figure of its summary will be null. Lower warmup_steps or train more steps.")
    absent = [rank for rank in config.profile_trace_ranks or () if rank >= world_size]
    if config.profile_steps is not None and absent:
        said.append(f"nemo-throughput: profile_trace_ranks names rank(s) {absent} of a run of {world_size}: they "
                    "write no trace")
    return said


def _checked_ranks(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"profile_trace_ranks must be a list of ranks, got {value!r}; "
                         "with Hydra: callbacks.throughput.profile_trace_ranks=[0]")
    for rank in value:
        if not is_int(rank) or rank < 0:
            raise ValueError(f"profile_trace_ranks must hold ranks (integers >= 0), got {rank!r}")
    return tuple(value)


def _checked_model_spec(value: Any) -> dict[str, Any] | None:
    """The model_spec setting as a plain dict of ModelSpec fields, each of the right type."""
    if value is None:
        return None
    if isinstance(value, ModelSpec):
        return value.to_dict()
    if not isinstance(value, Mapping):
        raise ValueError(f"model_spec must be a mapping of ModelSpec fields, got {value!r} ({type(value).__name__}); "
                         "with Hydra: callbacks.throughput.model_spec={num_layers:2,...} or "
                         "+callbacks.throughput.model_spec.num_layers=2")
    ModelSpec.check_fields(value)
    return dict(value)


def checked_prometheus(value: Any) -> dict[str, Any] | None:
    """The ``prometheus`` setting as a plain dict {port, addr, linger_s}; None when not set."""
    if value is None:
        return None
    example = "with Hydra: callbacks.throughput.prometheus={port:9464}"
    if not isinstance(value, Mapping):
        raise ValueError(f"prometheus must be a mapping {{port, addr, linger_s}}, got {value!r}; {example}")
    unknown = sorted(set(value) - {"port", "addr", "linger_s"})
    if unknown or "port" not in value:
        raise ValueError(f"prometheus needs port (and may have addr, linger_s); got unknown {unknown}; {example}")
    port, addr, linger_s = value["port"], value.get("addr", "0.0.0.0"), value.get("linger_s", DEFAULT_LINGER_S)
    if not is_int(port) or not 0 <= port <= 65535:
        raise ValueError(f"prometheus.port must be a TCP port (0-65535; 0: any free one), got {port!r}")
    if not isinstance(addr, str) or not addr:
        raise ValueError(f"prometheus.addr must be the address to listen on (e.g. 0.0.0.0), got {addr!r}")
    if not is_number(linger_s) or not 0 <= linger_s <= LONGEST_LINGER_S:
        raise ValueError(f"prometheus.linger_s must be seconds from 0 to {LONGEST_LINGER_S:g}, got {linger_s!r}")
    return {"port": port, "addr": addr, "linger_s": float(linger_s)}


def _check_name(name: str, value: str | None) -> None:
    """A name that can name a directory: refused at once, not on the second run into an output_dir."""
    if value is None:
        return
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > LONGEST_NAME_BYTES or "\0" in value:
        what = f"is {size} bytes long" if size > LONGEST_NAME_BYTES else "holds a NUL character"
        raise ValueError(f"{name} {what}; it must be at most {LONGEST_NAME_BYTES} bytes with no NUL, since it "
                         "names the run's directory where output_dir already holds another run")


def _check_text(name: str, value: Any) -> None:
    if value is None or isinstance(value, str) or (name == "output_dir" and isinstance(value, os.PathLike)):
        return
    if name in _CHOICES:
        hint = f"; choose one of {list(_CHOICES[name])}"
    elif isinstance(value, (int, float)):
        hint = f"; to give a number as text, quote it on the command line: {name}=\"'{value}'\""
    else:
        hint = ""
    raise ValueError(f"{name} must be a string or null, got {value!r} ({type(value).__name__}){hint}")
