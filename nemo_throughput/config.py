"""Settings of the throughput callback: one dataclass, shared by Python and Hydra users."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from nemo_throughput.flops import FORMULAS, ModelSpec, require_positive_int
from nemo_throughput.hardware import DTYPES, check_dtype


@dataclass
class ThroughputConfig:
    """Every key of ``callbacks.throughput`` / ``ThroughputCallback(...)``, with its default.

    Model shape and batch settings override what is read from the model's own config; leave
    them unset for NeMo models and the demo, set them for plain Lightning modules.
    """

    log_every_n_steps: int = 10  # steps between cross-rank exchanges, log lines and summary writes
    warmup_steps: int = 10  # first steps left out of the statistics (allocator, NCCL and kernel warm-up)
    output_dir: str | None = None  # default: <trainer.log_dir>/throughput
    run_name: str | None = None  # default: <model name>_<nodes>n<gpus>g_<UTC start time>
    run_label: str | None = None  # free label such as "bare-metal"; default: the orchestrator
    model_name: str | None = None  # default: derived from the parameter count, e.g. "gpt-126m"
    model_spec: Mapping[str, Any] | None = None  # ModelSpec fields; override those read from the model
    flops_formula: str = "megatron"  # "megatron" or "dgxc"
    flops_per_sample: float | None = None  # given instead of computed (recorded as flops_formula "user")
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    seq_length: int | None = None
    dtype: str | None = None  # peak-FLOPs dtype; default from the trainer's precision
    peak_tflops: float | None = None  # per-GPU dense peak; default from the GPU table
    per_step_jsonl: bool = False  # also write steps.jsonl with every step of every rank

    def __post_init__(self) -> None:
        # Every field is checked for its type too: Hydra hands `peak_tflops=abc` over as a string
        # and `run_label=123` as an int, and a wrong value must stop the run, naming the setting.
        for name in ("output_dir", "run_name", "run_label", "model_name", "flops_formula", "dtype"):
            _check_text(name, getattr(self, name))
        if self.output_dir is not None:
            self.output_dir = os.fspath(self.output_dir)
        if _not_int(self.log_every_n_steps) or self.log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be an integer >= 1, got {self.log_every_n_steps!r}")
        if _not_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        for name in ("global_batch_size", "micro_batch_size", "seq_length"):
            value = getattr(self, name)
            if value is not None:
                require_positive_int(name, value, prefix="")
        if self.flops_formula not in FORMULAS:
            raise ValueError(f"Unknown flops_formula {self.flops_formula!r}; choose one of {list(FORMULAS)}")
        if self.dtype is not None:
            self.dtype = check_dtype(self.dtype)
        check_positive_number("peak_tflops", self.peak_tflops, "of TFLOPS per GPU")
        check_positive_number("flops_per_sample", self.flops_per_sample, "of model FLOPs per sample")
        if not isinstance(self.per_step_jsonl, bool):
            raise ValueError(f"per_step_jsonl must be true or false, got {self.per_step_jsonl!r} "
                             f"({type(self.per_step_jsonl).__name__})")
        self.model_spec = _checked_model_spec(self.model_spec)

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


_CHOICES = {"flops_formula": FORMULAS, "dtype": DTYPES}


def _not_int(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def check_positive_number(name: str, value: Any, unit: str) -> None:
    """None, or a positive finite int/float (a bool or a numeric string is a mistake, not a number)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number {unit}, got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number {unit}, got {value!r}")


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
