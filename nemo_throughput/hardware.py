"""Peak dense FLOP/s per accelerator and dtype, matched on the names drivers really report.

Figures are dense (no 2:4 sparsity) tensor-core peaks from the vendors' data sheets, per GPU.
H100/H200 SXM BF16 is 989.5 and FP8 1979 TFLOPS, the convention of the public benchmark
tables this project reproduces. An unknown or ambiguous part gives ``None`` and a warning: MFU
is then reported as null rather than computed against a guessed peak.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32")


@dataclass(frozen=True)
class Accelerator:
    name: str  # canonical part name recorded in summaries
    pattern: str  # regex searched in the upper-cased driver name
    peak_tflops: dict[str, float]  # dtype -> dense TFLOPS; a missing dtype is unsupported


def _peaks(bf16: float, fp8: float | None, tf32: float, fp32: float) -> dict[str, float]:
    peaks = {"bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32}
    if fp8 is not None:
        peaks["fp8"] = fp8
    return peaks


_HOPPER_SXM = _peaks(bf16=989.5, fp8=1979.0, tf32=494.7, fp32=66.9)
_HOPPER_NVL = _peaks(bf16=835.5, fp8=1670.5, tf32=417.5, fp32=60.0)
_MI300 = _peaks(bf16=1307.4, fp8=2614.9, tf32=653.7, fp32=163.4)

# Order matters only where one pattern could match another's names; word boundaries keep
# "L4" from matching "L40S" and "B200" from matching "GB200".
ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("GB200", r"\bGB200\b", _peaks(bf16=2500.0, fp8=5000.0, tf32=1250.0, fp32=80.0)),
    Accelerator("B200", r"\bB200\b", _peaks(bf16=2250.0, fp8=4500.0, tf32=1100.0, fp32=75.0)),
    Accelerator("H200 NVL", r"\bH200\b.*\bNVL\b", _HOPPER_NVL),
    Accelerator("H200 SXM", r"\bH200\b", _HOPPER_SXM),
    Accelerator("GH200", r"\bGH200\b", _HOPPER_SXM),
    Accelerator("H100 NVL", r"\bH100\b.*\bNVL\b", _HOPPER_NVL),
    Accelerator("H100 PCIe", r"\bH100\b.*\b(PCIE|HBM2E)\b", _peaks(bf16=756.5, fp8=1513.0, tf32=378.0, fp32=51.2)),
    Accelerator("H100 SXM", r"\bH100\b.*\b(HBM3|SXM\d?)\b", _HOPPER_SXM),
    Accelerator("A100", r"\bA100\b", _peaks(bf16=312.0, fp8=None, tf32=156.0, fp32=19.5)),
    Accelerator("L40S", r"\bL40S\b", _peaks(bf16=362.05, fp8=733.0, tf32=183.0, fp32=91.6)),
    Accelerator("L40", r"\bL40\b", _peaks(bf16=181.05, fp8=362.0, tf32=90.5, fp32=90.5)),
    Accelerator("L4", r"\bL4\b", _peaks(bf16=121.0, fp8=242.5, tf32=60.0, fp32=30.3)),
    Accelerator("A10G", r"\bA10G\b", _peaks(bf16=125.0, fp8=None, tf32=62.5, fp32=31.2)),
    Accelerator("A10", r"\bA10\b", _peaks(bf16=125.0, fp8=None, tf32=62.5, fp32=31.2)),
    Accelerator("MI325X", r"\bMI325X\b", _MI300),
    Accelerator("MI300X", r"\bMI300X\b", _MI300),
)

_OVERRIDE_HINT = "set peak_tflops (callbacks.throughput.peak_tflops=..., import --peak-tflops) to get MFU"


def identify(gpu_name: str) -> Accelerator | None:
    """The table entry for a driver-reported device name, or None if unknown/ambiguous."""
    upper = gpu_name.upper()
    for accelerator in ACCELERATORS:
        if re.search(accelerator.pattern, upper):
            return accelerator
    return None


def peak_tflops(gpu_name: str, dtype: str) -> float | None:
    """Dense peak TFLOPS of one ``gpu_name`` device for ``dtype``; None (with a warning) if unknown.

    ``gpu_name`` is what ``torch.cuda.get_device_name()`` reports, e.g. "NVIDIA H100 80GB HBM3".
    """
    return _table_peak(gpu_name, dtype)[0]


def resolve_peak(given: float | None, gpu_name: str | None, dtype: str | None) -> tuple[float | None, str | None]:
    """The per-GPU dense peak MFU is divided by, in TFLOPS, and where it comes from: ``given`` as is
    (source "user"), else the table's for ``gpu_name`` and ``dtype`` (source "table:<part>"), else
    (None, None): no dtype to look up, or the table has no figure (then with a warning)."""
    if given is not None:
        return given, "user"
    if not gpu_name or not dtype:
        return None, None
    peak, accelerator = _table_peak(gpu_name, dtype)
    return (peak, f"table:{accelerator.name}") if peak is not None else (None, None)


def _table_peak(gpu_name: str, dtype: str) -> tuple[float | None, Accelerator | None]:
    """The table's peak (TFLOPS) and the part it belongs to, identified once; a missing figure is warned of."""
    dtype = check_dtype(dtype)
    accelerator = identify(gpu_name)
    if accelerator is None:
        log.warning("No peak FLOPs known for device %r; MFU will be null: %s.", gpu_name, _OVERRIDE_HINT)
        return None, None
    peak = accelerator.peak_tflops.get(dtype)
    if peak is None:
        log.warning("%s has no %s tensor-core peak; MFU will be null: %s.", accelerator.name, dtype, _OVERRIDE_HINT)
    return peak, accelerator


def check_dtype(dtype: str) -> str:
    normalized = dtype.lower()
    if normalized not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r} for peak FLOPs; choose one of {list(DTYPES)}.")
    return normalized


def dtype_for_precision(precision: str | int | None, *, fp8: bool = False) -> str | None:
    """The matmul dtype implied by a Lightning/NeMo ``precision`` setting (None if not a float type).

    FP32 runs count as TF32 when PyTorch is allowed to use TF32 tensor cores for matmuls.
    """
    if fp8:
        return "fp8"
    text = str(precision).lower()
    if text.startswith("transformer-engine"):  # Lightning's FP8 precision plugin
        return "fp8"
    if "bf16" in text:
        return "bf16"
    if text.startswith("16") or "float16" in text:
        return "fp16"
    if text.startswith("32") or text in ("none", ""):
        import torch  # here, not at the top: the CLI reads this table without loading torch

        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return None


def device_name(device: torch.device) -> str:
    """The driver's name for ``device`` ("NVIDIA H100 80GB HBM3"), or "cpu"."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return device.type
