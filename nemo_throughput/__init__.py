"""nemo-throughput: step timing, tokens/s and MFU for NeMo / Megatron GPT pretraining.

Layers, dependencies pointing one way: core (torch only: timing, flops, hardware, aggregation,
throughput, summary, environment, config) <- adapters (Lightning callback, NeMo config readers,
Hydra glue) <- entry points (cli, demo, conf/ groups).
"""

import logging

from nemo_throughput.config import ThroughputConfig
from nemo_throughput.flops import FORMULAS, ModelSpec, model_flops_per_sample
from nemo_throughput.hardware import peak_tflops
from nemo_throughput.summary import SCHEMA, read_summary
from nemo_throughput.throughput import Workload, mfu

__version__ = "0.1.0"

__all__ = [
    "FORMULAS",
    "SCHEMA",
    "ModelSpec",
    "ThroughputCallback",
    "ThroughputConfig",
    "Workload",
    "mfu",
    "nemo_callback",
    "model_flops_per_sample",
    "peak_tflops",
    "read_summary",
]



def __getattr__(name: str):
    # Imported on first use so that the torch-only core works without Lightning installed.
    if name == "ThroughputCallback":
        from nemo_throughput.adapters.lightning import ThroughputCallback

        return ThroughputCallback
    if name == "nemo_callback":
        from nemo_throughput.adapters.nemo import nemo_callback

        return nemo_callback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _StderrUntilTheAppConfiguresLogging(logging.StreamHandler):
    """Prints our records while the root logger has no handlers, and nothing once it has.

    Our records always propagate, so an application that configures logging (before or after
    importing us) gets each of them once, through its own handlers and format; we never touch
    the root logger.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


# Like Lightning: show our INFO lines (one per log interval) when the app configured no logging.
_log = logging.getLogger(__name__)
_log.addHandler(_StderrUntilTheAppConfiguresLogging())
if not logging.getLogger().handlers:
    _log.setLevel(logging.INFO)
