"""tests/gpu: the claims that need a CUDA GPU (issue 11). Every test here is skipped without one.

    python -m pytest tests/gpu            # on a machine with a GPU: one command runs them all

Figures the tests measure (timing errors, synchronization counts, the device's peak) also go to
``$NEMO_THROUGHPUT_GPU_RESULTS/gpu_results.json`` (default: ``$OUT`` when set, else nowhere).
"""

import json
import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
RESULTS: dict = {}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: torch {torch.__version__} sees none")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_results():
    """A dict the tests fill with what they measured; written as JSON at the end of the session."""
    yield RESULTS
    folder = os.environ.get("NEMO_THROUGHPUT_GPU_RESULTS") or os.environ.get("OUT")
    if folder and RESULTS:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "gpu_results.json").write_text(json.dumps(RESULTS, indent=2, default=str) + "\n")
