"""What a submission states of the system a result ran on, and the one check of every count any
source states (a systems file, a log's ``:::SYSJSON`` or ``:::MLLOG`` lines, a submission_platform).

A result published in a submission (``<submitter>/results/<system>/<benchmark>/result_*.txt``) takes
its node and accelerator counts from ``<submitter>/systems/<system>.json``, where result_summarizer
reads them: real logs state other counts (v5.0 logs of 2- and 4-node systems say ``number_of_nodes "1"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_throughput.errors import ReportError
from nemo_throughput.text import printable
from nemo_throughput.values import is_int, stated_name, whole_number

MAX_COUNT = 1_000_000  # nodes, or accelerators per node: more than any system has (a typo or a broken file)
IS_ZERO = "is 0"


@dataclass
class SystemFile:
    """What ``<submitter>/systems/<system>.json`` states: the counts result_summarizer scores with."""

    path: Path
    name: str | None
    num_nodes: int
    accelerators_per_node: int
    accelerator: str | None
    submitter: str | None

    @property
    def num_accelerators(self) -> int:
        return self.num_nodes * self.accelerators_per_node

    @property
    def shown(self) -> str:
        return f"systems/{printable(self.path.name)}"


def system_file_path(result: Path) -> Path | None:
    """``<submitter>/systems/<system>.json`` of a result (its resolved path) at
    ``<submitter>/results/<system>/<benchmark>/`` (result_summarizer's rule); None outside that layout."""
    system_dir = result.parent.parent
    if system_dir.parent.name != "results":
        return None
    return system_dir.parent.parent / "systems" / f"{system_dir.name}.json"


def read_system_file(path: Path) -> SystemFile:
    """The system description; one that cannot give both counts is refused (result_summarizer skips it)."""
    try:
        desc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ReportError(f"{printable(path)}: not a readable JSON system description ({type(error).__name__}: "
                          f"{printable(error)}) (fix it: result_summarizer skips such a system too)") from error
    if not isinstance(desc, dict):
        raise ReportError(f"{printable(path)}: not a JSON object (give the submission's system description)")
    system = SystemFile(path, stated_name(desc.get("system_name")), _count(desc, "number_of_nodes", path),
                        _count(desc, "accelerators_per_node", path), stated_name(desc.get("accelerator_model_name")),
                        stated_name(desc.get("submitter")))
    if system.num_accelerators > MAX_COUNT:
        raise ReportError(f"{printable(path)}: number_of_nodes {system.num_nodes} x accelerators_per_node "
                          f"{system.accelerators_per_node} is more than {MAX_COUNT:,} accelerators: not a plausible "
                          "count (fix the file)")
    return system


def _count(desc: dict[str, Any], key: str, path: Path) -> int:
    count, problem = plausible_count(desc.get(key))
    if problem == IS_ZERO:
        raise ReportError(f"{printable(path)}: {key} is 0: no accelerator count to compare runs by (a CPU-only "
                          "system is not imported; import the other systems' result folders)")
    if count is None:
        raise ReportError(f"{printable(path)}: {key} {printable(repr(desc.get(key)))} {problem} (fix the file)")
    return count


def plausible_count(value: Any) -> tuple[int | None, str | None]:
    """(count, None) for a whole number from 1 to MAX_COUNT, stated as a JSON number (1 or 1.0: MosaicML's
    v2.0 systems file says ``"number_of_nodes": 1.0``, which result_summarizer's int() takes) or as a
    string of ASCII digits (the counts are strings in some submissions, integers in others); else
    (None, what is wrong with it): words, "²" or other Unicode digits, "8.0", 8.5, true, 0, -1, 10**30."""
    text = value.strip() if isinstance(value, str) else ""
    if len(text) > len(str(MAX_COUNT)) and whole_number(text) is not None:  # not even converted
        return None, f"is more than {MAX_COUNT:,}: not a plausible count"
    count = value if is_int(value) else _whole_float(value) if isinstance(value, float) else whole_number(text)
    if count is None:
        return None, "is not a whole number"
    if count <= 0:
        return None, IS_ZERO if count == 0 else "is negative: not a count"
    if count > MAX_COUNT:
        return None, f"is more than {MAX_COUNT:,}: not a plausible count"
    return count, None


def _whole_float(value: float) -> int | None:
    return int(value) if value.is_integer() else None  # inf and nan are not whole


def platform_nodes(platform: str | None) -> int | None:
    """Nodes from a submission_platform such as ``8xNVIDIA DGX H100`` (the MLPerf naming rule)."""
    if platform is None:
        return None
    count, sep, _ = platform.partition("x")
    return plausible_count(count)[0] if sep else None


def system_file_of(path: Path) -> tuple[SystemFile | None, list[str]]:
    """The submission's description of the result's system; None outside a submission's layout."""
    described = system_file_path(path)
    if described is None or not described.parent.is_dir():  # results/ without its submission around it
        return None, []
    if not described.is_file():
        return None, [f"no systems/{printable(described.name)} in the submission: the counts are the log's, "
                      "which real logs can get wrong (result_summarizer skips such a system)"]
    return read_system_file(described), []
