"""Peak lookup on the names drivers really report, including the ones other tables get wrong."""

import logging

import pytest
import torch

from nemo_throughput.hardware import ACCELERATORS, dtype_for_precision, identify, peak_tflops, resolve_peak


@pytest.mark.parametrize("driver_name, part, bf16, fp8", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5, 1979.0),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 1513.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5, 1670.5),
    ("NVIDIA H200", "H200 SXM", 989.5, 1979.0),  # tables keyed on "h200 sxm1" miss this
    ("NVIDIA H200 NVL", "H200 NVL", 835.5, 1670.5),
    ("NVIDIA GH200 480GB", "GH200", 989.5, 1979.0),
    ("NVIDIA B200", "B200", 2250.0, 4500.0),
    ("NVIDIA GB200", "GB200", 2500.0, 5000.0),  # not B200
    ("NVIDIA L40S", "L40S", 362.05, 733.0),  # not L4
    ("NVIDIA L40", "L40", 181.05, 362.0),
    ("NVIDIA L4", "L4", 121.0, 242.5),
    ("AMD Instinct MI300X", "MI300X", 1307.4, 2614.9),
    ("AMD Instinct MI300X VF", "MI300X", 1307.4, 2614.9),
])
def test_driver_names_map_to_dense_peaks(driver_name, part, bf16, fp8):
    assert identify(driver_name).name == part
    assert peak_tflops(driver_name, "bf16") == bf16
    assert peak_tflops(driver_name, "BF16") == bf16
    assert peak_tflops(driver_name, "fp8") == fp8


@pytest.mark.parametrize("driver_name, part, bf16", [
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100-SXM4-40GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
    ("NVIDIA A10G", "A10G", 125.0),
    ("NVIDIA A10", "A10", 125.0),
])
def test_ampere_parts_and_their_missing_fp8(driver_name, part, bf16, caplog):
    assert identify(driver_name).name == part
    assert peak_tflops(driver_name, "bf16") == bf16
    with caplog.at_level(logging.WARNING):
        assert peak_tflops(driver_name, "fp8") is None
    assert f"{part} has no fp8" in caplog.text and "peak_tflops" in caplog.text


@pytest.mark.parametrize("driver_name", [
    "NVIDIA GeForce RTX 4090",
    "Tesla V100-SXM2-16GB",  # must not be treated as an A100
    "NVIDIA H100",  # ambiguous: SXM, PCIe and NVL differ by 30 %
    "cpu",
])
def test_unknown_or_ambiguous_parts_give_none_and_name_the_override(driver_name, caplog):
    with caplog.at_level(logging.WARNING):
        assert peak_tflops(driver_name, "bf16") is None
    assert driver_name in caplog.text and "peak_tflops" in caplog.text


def test_a_given_peak_comes_first_then_the_table_named_by_its_part(caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_peak(700.0, "NVIDIA GeForce RTX 4090", "bf16") == (700.0, "user")  # no table look-up
        assert resolve_peak(None, "NVIDIA H100 80GB HBM3", "fp8") == (1979.0, "table:H100 SXM")
        assert resolve_peak(None, "NVIDIA H100 80GB HBM3", None) == (None, None)  # no dtype: nothing to look up
        assert resolve_peak(None, None, "bf16") == (None, None)  # an imported log naming no GPU
    assert caplog.text == ""


@pytest.mark.parametrize("driver_name, dtype, warning", [
    ("NVIDIA GeForce RTX 4090", "bf16", "No peak FLOPs known for device 'NVIDIA GeForce RTX 4090'"),
    ("NVIDIA A100-SXM4-80GB", "fp8", "A100 has no fp8 tensor-core peak"),
])
def test_no_table_figure_gives_no_peak_and_one_warning(driver_name, dtype, warning, caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_peak(None, driver_name, dtype) == (None, None)
    assert [record.getMessage().count(warning) for record in caplog.records] == [1]
    assert "peak_tflops" in caplog.text


def test_unknown_dtype_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"Unknown dtype 'int4'.*'fp8', 'bf16', 'fp16', 'tf32', 'fp32'"):
        peak_tflops("NVIDIA H100 80GB HBM3", "int4")


def test_table_holds_dense_not_sparse_figures():
    # Dense tensor-core peaks double from BF16 to FP8 and halve from BF16 to TF32; a sparse figure
    # copied by mistake for one dtype breaks the ratio. FP4 doubles FP8, or triples it on Blackwell Ultra.
    for accelerator in ACCELERATORS:
        peaks = accelerator.peak_tflops
        if "fp8" in peaks and "bf16" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.02), accelerator.name
        if "tf32" in peaks and "bf16" in peaks:
            assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.03), accelerator.name
        if "fp4" in peaks:
            ratio = 3 if accelerator.name in ("GB300", "B300") else 2
            assert peaks["fp4"] == pytest.approx(ratio * peaks["fp8"], rel=0.02), accelerator.name
        assert peaks.get("fp16") == peaks.get("bf16")


def test_every_row_says_where_its_figures_come_from():
    for accelerator in ACCELERATORS:
        assert len(accelerator.source) > 20, accelerator.name
        # A figure drawn from a sparse one must say it was halved, or name a dense source.
        assert ("dense" in accelerator.source or "halved" in accelerator.source or "H100" in accelerator.source
                or "A10's" in accelerator.source or not accelerator.peak_tflops), accelerator.name


@pytest.mark.parametrize("driver_name, part, peaks", [
    # names as drivers report them in public logs: "NVIDIA B300 SXM6 AC" (NVIDIA/cosmos-framework PR #114,
    # allenai/OLMo-core PR #817), "NVIDIA GB300" (nvidia-smi -L output in public issues), "NVIDIA H20-3e" and
    # "NVIDIA H800" (collect_env output in public issues), "AMD Instinct MI355X" / "MI350X" (PyTorch trace
    # device_properties, amd-smi market_name), "AMD Instinct MI325 OAM" (a public GPU-name mapping),
    # "NVIDIA RTX PRO 6000 Blackwell ... Edition" (nvidia-smi --query output)
    ("NVIDIA B300 SXM6 AC", "B300", {"fp4": 13500.0, "fp8": 4500.0, "bf16": 2250.0}),
    ("NVIDIA GB300", "GB300", {"fp4": 15000.0, "fp8": 5000.0, "bf16": 2500.0}),  # not B300
    ("NVIDIA B200", "B200", {"fp4": 9000.0, "fp8": 4500.0}),
    ("NVIDIA GB200", "GB200", {"fp4": 10000.0, "fp8": 5000.0}),
    ("NVIDIA H20", "H20", {"bf16": 148.0, "fp8": 296.0, "fp32": None}),  # not H200; FP32 unpublished
    ("NVIDIA H20-3e", "H20", {"bf16": 148.0}),
    ("NVIDIA H200", "H200 SXM", {"bf16": 989.5}),  # not H20
    ("NVIDIA H800", "H800", {"bf16": 989.5, "fp8": 1979.0, "fp4": None}),  # Hopper: no FP4
    ("NVIDIA H800 80GB HBM3", "H800", {"bf16": 989.5}),
    ("NVIDIA H800 PCIe", "H800 PCIe", {"bf16": 756.5}),
    ("AMD Instinct MI355X", "MI355X", {"fp4": 10066.0, "fp8": 5033.0, "bf16": 2516.6, "tf32": None}),
    ("AMD Instinct MI350X", "MI350X", {"fp4": 9227.0, "bf16": 2306.9}),
    ("AMD Instinct MI325 OAM", "MI325X", {"bf16": 1307.4, "fp4": None}),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell Workstation",
     {"fp4": 2015.0, "bf16": 504.0}),
    ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX PRO 6000 Blackwell Max-Q",
     {"bf16": 439.0}),  # its name also says Workstation Edition
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell Server",
     {"tf32": 234.0, "bf16": None}),  # only rounded sparse BF16/FP8/FP4 figures are published
])
def test_new_parts_and_fp4_on_the_names_drivers_report(driver_name, part, peaks, caplog):
    assert identify(driver_name).name == part
    for dtype, peak in peaks.items():
        with caplog.at_level(logging.WARNING):
            assert peak_tflops(driver_name, dtype) == peak, dtype
    if None in peaks.values():
        assert "no such math, or no dense figure published" in caplog.text and "peak_tflops" in caplog.text


@pytest.mark.parametrize("driver_name", [
    "NVIDIA GB300 Max-Q",  # power-capped: no figures published
    "NVIDIA H800 NVL",
    "NVIDIA RTX PRO 6000D Blackwell Server Edition",  # the cut-down part, about a third of the full one
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA RTX PRO 6000 Blackwell",  # which edition? their peaks differ by 15 %
])
def test_parts_without_a_published_dense_peak_give_none(driver_name, caplog):
    with caplog.at_level(logging.WARNING):
        assert peak_tflops(driver_name, "bf16") is None
    assert "peak_tflops" in caplog.text


@pytest.mark.parametrize("precision, low_precision, dtype", [
    ("bf16-mixed", None, "bf16"),
    ("bf16-true", None, "bf16"),
    ("bf16", None, "bf16"),
    ("16-mixed", None, "fp16"),
    (16, None, "fp16"),
    ("transformer-engine", None, "fp8"),
    ("transformer-engine-float16", None, "fp8"),
    ("bf16-mixed", "fp8", "fp8"),  # NeMo: precision bf16-mixed with model.fp8=True
    ("bf16-mixed", "fp4", "fp4"),  # megatron-core fp4="e2m1" (NVFP4)
    ("64-true", None, None),
])
def test_dtype_follows_the_trainer_precision(precision, low_precision, dtype):
    assert dtype_for_precision(precision, low_precision=low_precision) == dtype


def test_fp32_counts_as_tf32_when_matmuls_may_use_it():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert dtype_for_precision("32-true") == "fp32"
        torch.set_float32_matmul_precision("high")
        assert dtype_for_precision("32-true") == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)
