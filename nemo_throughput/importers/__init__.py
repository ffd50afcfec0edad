"""Readers of the logs of runs made without the plugin (NeMo, Megatron-LM, TensorBoard), into summaries."""

from __future__ import annotations

import os

from nemo_throughput.text import printable

DEFAULT_GPUS_PER_NODE = 8  # import's --gpus-per-node, where a log does not name its nodes


def notice(source: str | os.PathLike, message: str) -> str:
    """Every note and warning of `nemo-throughput import`, in one format: `nemo-throughput import:
    <input>: <message>` (warnings' messages start with `warning: `)."""
    return f"nemo-throughput import: {printable(source)}: {message}"
