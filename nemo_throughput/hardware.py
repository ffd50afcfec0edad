"""Peak dense FLOP/s per accelerator and dtype, matched on the names drivers really report.

Figures are dense (no 2:4 sparsity) tensor-core peaks per GPU, each row naming its source (the
vendor's data sheet, unless the vendor publishes none). H100/H200 SXM BF16 is 989.5 and FP8 1979
TFLOPS; where published tables divide by other figures (989, GB200's 2,450), docs/arithmetic.md
says so under "Published tables". An unknown or ambiguous part gives ``None`` and a warning: MFU
is then reported as null rather than computed against a guessed peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nemo_throughput.text import package_logger

if TYPE_CHECKING:
    import torch

log = package_logger(__name__)

DTYPES = ("fp4", "fp8", "bf16", "fp16", "tf32", "fp32")
LOW_PRECISION = ("fp4", "fp8")  # GEMM formats whose runs keep some matmuls in bf16


@dataclass(frozen=True)
class Accelerator:
    name: str  # canonical part name recorded in summaries
    pattern: str  # regex searched in the upper-cased driver name
    peak_tflops: dict[str, float]  # dtype -> dense TFLOPS; a missing dtype is unsupported or unpublished
    source: str  # where the figures come from (a vendor's data sheet, unless it says otherwise)


def _peaks(bf16: float | None, fp8: float | None, tf32: float | None, fp32: float | None,
           fp4: float | None = None) -> dict[str, float]:
    """Dense peaks; fp16 runs at bf16's rate on every part here. None: no such math, or no figure."""
    peaks = {"fp4": fp4, "fp8": fp8, "bf16": bf16, "fp16": bf16, "tf32": tf32, "fp32": fp32}
    return {dtype: peak for dtype, peak in peaks.items() if peak is not None}


_HOPPER_SXM = _peaks(bf16=989.5, fp8=1979.0, tf32=494.7, fp32=66.9)
_HOPPER_NVL = _peaks(bf16=835.5, fp8=1670.5, tf32=417.5, fp32=60.0)
_HOPPER_PCIE = _peaks(bf16=756.5, fp8=1513.0, tf32=378.0, fp32=51.2)
_MI300 = _peaks(bf16=1307.4, fp8=2614.9, tf32=653.7, fp32=163.4)
_HALVED = "sparse figures halved, as its footnote says dense is"
_H100 = f"NVIDIA H100 data sheet (nvidia.com/en-us/data-center/h100), {_HALVED}"
_BLACKWELL_ULTRA = ("NVIDIA Blackwell Ultra data sheet and the GB300 NVL72 / HGX B300 pages (nvidia.com/en-us/"
                    "data-center/gb300-nvl72, /hgx): FP4 as printed dense; FP8, BF16, TF32 " + _HALVED)

# A row without peaks ({}) is a part whose vendor publishes no dense figure: MFU null unless peak_tflops
# is given. Order matters where one pattern could match another's names: GB300 before B300 (a B300 pattern with
# word boundaries does not match "GB300", but a substring table would), NVL and PCIe before the plain
# part, Max-Q before Workstation Edition (its name holds both). Word boundaries keep "L4" from matching
# "L40S", "H20" from matching "H200", "RTX PRO 6000" from matching the cut-down "RTX PRO 6000D".
ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("GB300 Max-Q", r"\bGB300\b.*\bMAX-Q\b", {}, "no figures published for the power-capped part"),
    Accelerator("GB300", r"\bGB300\b", _peaks(fp4=15000.0, fp8=5000.0, bf16=2500.0, tf32=1250.0, fp32=80.0),
                _BLACKWELL_ULTRA + " (GB300 column)"),
    Accelerator("B300", r"\bB300\b", _peaks(fp4=13500.0, fp8=4500.0, bf16=2250.0, tf32=1100.0, fp32=75.0),
                "NVIDIA HGX B300 / DGX B300 pages (nvidia.com/en-us/data-center/hgx, /dgx-b300), per GPU of 8: "
                "FP4 108 PF dense as printed; FP8, BF16, TF32 " + _HALVED),
    Accelerator("GB200", r"\bGB200\b", _peaks(fp4=10000.0, fp8=5000.0, bf16=2500.0, tf32=1250.0, fp32=80.0),
                "NVIDIA GB200 NVL72 page (nvidia.com/en-us/data-center/gb200-nvl72), per GPU of 72, " + _HALVED),
    Accelerator("B200", r"\bB200\b", _peaks(fp4=9000.0, fp8=4500.0, bf16=2250.0, tf32=1100.0, fp32=75.0),
                "NVIDIA HGX B200 page (nvidia.com/en-us/data-center/hgx), per GPU of 8, " + _HALVED),
    Accelerator("H200 NVL", r"\bH200\b.*\bNVL\b", _HOPPER_NVL,
                f"NVIDIA H200 data sheet (nvidia.com/en-us/data-center/h200), NVL column, {_HALVED}"),
    Accelerator("H200 SXM", r"\bH200\b", _HOPPER_SXM,
                f"NVIDIA H200 data sheet (nvidia.com/en-us/data-center/h200), SXM column, {_HALVED}"),
    Accelerator("GH200", r"\bGH200\b", _HOPPER_SXM,
                "NVIDIA GH200 data sheet (nvidia.com/en-us/data-center/grace-hopper-superchip): H100 SXM's figures"),
    Accelerator("H100 NVL", r"\bH100\b.*\bNVL\b", _HOPPER_NVL, _H100 + " (NVL column)"),
    Accelerator("H100 PCIe", r"\bH100\b.*\b(PCIE|HBM2E)\b", _HOPPER_PCIE, _H100 + " (PCIe column)"),
    Accelerator("H100 SXM", r"\bH100\b.*\b(HBM3|SXM\d?)\b", _HOPPER_SXM, _H100 + " (SXM column)"),
    Accelerator("H800 NVL", r"\bH800\b.*\bNVL\b", {}, "no figures published (the part is in the driver's device list)"),
    Accelerator("H800 PCIe", r"\bH800\b.*\bPCIE\b", _HOPPER_PCIE,
                "no NVIDIA data sheet: H100 PCIe's silicon and SM count (114), its figures"),
    Accelerator("H800", r"\bH800\b", _HOPPER_SXM,
                "no NVIDIA data sheet: H100 SXM's compute (FlashMLA's maintainers: 989 TFLOPS dense BF16 MMA)"),
    Accelerator("H20", r"\bH20\b", _peaks(bf16=148.0, fp8=296.0, tf32=74.0, fp32=None),
                "no NVIDIA data sheet: 148 TFLOPS dense BF16 as torchtitan's table has it (its PR #2307); FP8 "
                "and TF32 at Hopper's 2x and 0.5x of BF16; FP32 unpublished"),
    Accelerator("A100", r"\bA100\b", _peaks(bf16=312.0, fp8=None, tf32=156.0, fp32=19.5),
                f"NVIDIA A100 data sheet (nvidia.com/en-us/data-center/a100), {_HALVED}"),
    Accelerator("RTX PRO 6000 Blackwell Max-Q", r"\bRTX PRO 6000\b.*\bMAX-Q\b",
                _peaks(fp4=1756.0, fp8=878.0, bf16=439.0, tf32=219.0, fp32=110.0),
                "NVIDIA RTX PRO 6000 Blackwell Max-Q data sheet: 3,511 AI TOPS (FP4, sparse) halved and its ratios; "
                "FP32 110 TFLOPS"),
    Accelerator("RTX PRO 6000 Blackwell Workstation", r"\bRTX PRO 6000\b.*\bWORKSTATION\b",
                _peaks(fp4=2015.0, fp8=1008.0, bf16=504.0, tf32=252.0, fp32=126.0),
                "NVIDIA RTX Blackwell PRO architecture whitepaper v1.1, table 4 (188 SMs at 2,617 MHz, dense); "
                "FP32 126 TFLOPS as its data sheet"),
    Accelerator("RTX PRO 6000 Blackwell Server", r"\bRTX PRO 6000\b.*\bSERVER\b",
                _peaks(bf16=None, fp8=None, tf32=234.0, fp32=120.0),
                "NVIDIA RTX PRO 6000 Blackwell Server Edition page: TF32 234 and FP32 120 TFLOPS dense; its FP4, FP8 "
                "and FP16 figures are rounded sparse ones that disagree with its clock, so they are left out"),
    Accelerator("L40S", r"\bL40S\b", _peaks(bf16=362.05, fp8=733.0, tf32=183.0, fp32=91.6),
                f"NVIDIA L40S data sheet (nvidia.com/en-us/data-center/l40s), {_HALVED}"),
    Accelerator("L40", r"\bL40\b", _peaks(bf16=181.05, fp8=362.0, tf32=90.5, fp32=90.5),
                f"NVIDIA L40 data sheet (nvidia.com/en-us/data-center/l40), {_HALVED}"),
    Accelerator("L4", r"\bL4\b", _peaks(bf16=121.0, fp8=242.5, tf32=60.0, fp32=30.3),
                f"NVIDIA L4 data sheet (nvidia.com/en-us/data-center/l4), {_HALVED}"),
    Accelerator("A10G", r"\bA10G\b", _peaks(bf16=125.0, fp8=None, tf32=62.5, fp32=31.2),
                "no NVIDIA data sheet (AWS's A10 variant): A10's figures"),
    Accelerator("A10", r"\bA10\b", _peaks(bf16=125.0, fp8=None, tf32=62.5, fp32=31.2),
                f"NVIDIA A10 data sheet (nvidia.com/en-us/data-center/products/a10-gpu), {_HALVED}"),
    Accelerator("MI355X", r"\bMI355X\b", _peaks(fp4=10066.0, fp8=5033.0, bf16=2516.6, tf32=None, fp32=157.3),
                "AMD Instinct MI355X page and data sheet (amd.com/en/products/accelerators/instinct/mi350/mi355x): "
                "dense figures; TF32 only emulated in software, so none"),
    Accelerator("MI350X", r"\bMI350X\b", _peaks(fp4=9227.0, fp8=4614.0, bf16=2306.9, tf32=None, fp32=144.2),
                "AMD Instinct MI350X page (amd.com/en/products/accelerators/instinct/mi350/mi350x): dense figures; "
                "TF32 only emulated in software, so none"),
    Accelerator("MI325X", r"\bMI325X?\b", _MI300,
                "AMD Instinct MI325X page (amd.com/en/products/accelerators/instinct/mi300/mi325x): dense figures, "
                "MI300X's"),
    Accelerator("MI300X", r"\bMI300X\b", _MI300,
                "AMD Instinct MI300X data sheet (amd.com/en/products/accelerators/instinct/mi300/mi300x): dense "
                "figures"),
)

# A given peak this far from the table's, for the same part and dtype, is likely another figure: a node's (x8),
# a sparse one (x2), another dtype's. MFU divides by it all the same, so it is said; closer ones (a power-capped
# part, a measured matmul peak) are not.
PEAK_UNLIKE_THE_TABLE = 1.5

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
        _say_a_peak_unlike_the_table(given, gpu_name, dtype)
        return given, "user"
    if not gpu_name or not dtype:
        return None, None
    peak, accelerator = _table_peak(gpu_name, dtype)
    return (peak, f"table:{accelerator.name}") if peak is not None else (None, None)


def _say_a_peak_unlike_the_table(given: float, gpu_name: str | None, dtype: str | None) -> None:
    """A warning where the table knows the part's peak at ``dtype`` and ``given`` is far from it."""
    accelerator = identify(gpu_name) if gpu_name and dtype else None
    table = accelerator.peak_tflops.get(dtype.lower()) if accelerator else None
    if table is None or 1 / PEAK_UNLIKE_THE_TABLE <= given / table <= PEAK_UNLIKE_THE_TABLE:
        return
    log.warning("nemo-throughput: peak_tflops %g is %.3gx the table's %g for %s at %s: a node's peak rather than one "
                "GPU's, a sparse figure, or another dtype's? MFU divides by the %g given.", given, given / table,
                table, accelerator.name, dtype.lower(), given)


def _table_peak(gpu_name: str, dtype: str) -> tuple[float | None, Accelerator | None]:
    """The table's peak (TFLOPS) and the part it belongs to, identified once; a missing figure is warned of."""
    dtype = check_dtype(dtype)
    accelerator = identify(gpu_name)
    if accelerator is None:
        log.warning("No peak FLOPs known for device %r; MFU will be null: %s.", gpu_name, _OVERRIDE_HINT)
        return None, None
    peak = accelerator.peak_tflops.get(dtype)
    if not accelerator.peak_tflops:
        log.warning("No dense peak FLOPs are published for %s (%r); MFU will be null: %s.", accelerator.name,
                    gpu_name, _OVERRIDE_HINT)
    elif peak is None:
        log.warning("%s has no %s tensor-core peak (no such math, or no dense figure published); MFU will be "
                    "null: %s.", accelerator.name, dtype, _OVERRIDE_HINT)
    return peak, accelerator


def check_dtype(dtype: str) -> str:
    normalized = dtype.lower()
    if normalized not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r} for peak FLOPs; choose one of {list(DTYPES)}.")
    return normalized


def dtype_for_precision(precision: str | int | None, *, low_precision: str | None = None) -> str | None:
    """The matmul dtype implied by a Lightning/NeMo ``precision`` setting (None if not a float type);
    ``low_precision`` ("fp8", "fp4"): the framework trains its GEMMs in that format, whatever the precision.

    FP32 runs count as TF32 when PyTorch is allowed to use TF32 tensor cores for matmuls.
    """
    if low_precision is not None:
        return check_dtype(low_precision)
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
