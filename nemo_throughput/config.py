"""Settings of the throughput callback: one dataclass, shared by Python and Hydra users."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from nemo_throughput.flops import FORMULAS, ModelSpec
from nemo_throughput.hardware import check_dtype


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
        if _not_int(self.log_every_n_steps) or self.log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be an integer >= 1, got {self.log_every_n_steps!r}")
        if _not_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        for name in ("global_batch_size", "micro_batch_size", "seq_length"):
            value = getattr(self, name)
            if value is not None and (_not_int(value) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.flops_formula not in FORMULAS:
            raise ValueError(f"Unknown flops_formula {self.flops_formula!r}; choose one of {list(FORMULAS)}")
        if self.dtype is not None:
            self.dtype = check_dtype(self.dtype)
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"peak_tflops must be a positive number of TFLOPS per GPU, got {self.peak_tflops!r}")
        if isinstance(self.model_spec, ModelSpec):
            self.model_spec = self.model_spec.to_dict()
        if self.model_spec is not None:
            ModelSpec.check_keys(self.model_spec)
            self.model_spec = dict(self.model_spec)

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


def _not_int(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)
