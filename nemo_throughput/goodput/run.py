"""Rank 0's view of the run's goodput: this segment's ledger, the run it continues, goodput.json.

The run's ``goodput.json`` goes into its first segment's directory, and only ever inside this
segment's own output root (the directory it asked for): a copy of a run resumed elsewhere, or a run
moved, writes its own and never the original's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_throughput.goodput.ledger import IDENTITY_BYTES, RUN_FILE, Ledger, Segment, read_ledger, stitch
from nemo_throughput.goodput.segments import Binding, Resumed, bind, is_id, scheduler_key
from nemo_throughput.summary import write_json_atomic
from nemo_throughput.text import package_logger

log = package_logger(__name__)


class RunGoodput:
    """Rank 0's view of the run's goodput: this segment's ledger (the hot path's), the run it belongs
    to, and the earlier segments it continues (read once: they are over)."""

    def __init__(self, requested_dir: str | os.PathLike, output_dir: str | os.PathLike) -> None:
        self.ledger = Ledger(output_dir)
        self._root, self._output_dir = os.path.abspath(requested_dir), Path(output_dir)
        self._run_id: str | None = None
        self._segment_run_id: str | None = None
        self._resumed: Resumed | None = None  # what the checkpoint resumed from says
        self._binding = Binding()
        self._file = self._output_dir / RUN_FILE
        self.goodput_pct = math.nan  # the run's goodput % as of the latest section (NaN: none yet)

    def checkpoint_loaded(self, state: Any) -> None:
        """The resumed checkpoint's state (as checkpoint_state gave it when it was saved), before start."""
        self._resumed = Resumed.from_state(state)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint saved now keeps: the run and segment that saved it, so that a resume from it
        continues this run (empty before training)."""
        if self._run_id is None:
            return {}
        return {"goodput": {"run_id": self._run_id, "segment_run_id": self._segment_run_id,
                            "step": self.ledger.last_step}}

    def start(self, steps_done: int, segment_run_id: str, env: Mapping[str, str] = os.environ) -> Segment | None:
        """Training starts at ``steps_done``: the segment this one continues (None: it starts a run)."""
        key, restarts = scheduler_key(env)
        resumed, self._resumed = self._resumed, None  # a later fit resumes from its own checkpoint, or none
        try:
            binding = bind(self._root, self._output_dir, key, restarts, steps_done, resumed)
        except Exception as error:  # whatever another's file did, it must never fail the training
            log.warning("nemo-throughput: goodput: the search for earlier segments failed (%s: %s); this segment "
                        "starts a new run", type(error).__name__, error)
            binding = Binding(notes=[f"the search for earlier segments failed ({type(error).__name__}): this "
                                     "segment starts a new run"])
        previous = binding.previous
        self._binding, self._segment_run_id = binding, segment_run_id
        self._run_id = previous.run_id if previous is not None else segment_run_id
        self._file = self._run_file()
        parent = previous.identity.get("segment_run_id") if previous is not None else None
        self.ledger.start_training(steps_done, _fitting({
            "run_id": self._run_id, "segment_run_id": segment_run_id, "segment": self.segment,
            "scheduler_key": key, "restart_count": restarts, "joined_by": binding.joined_by,
            "parent": parent if is_id(parent) else None, "root": self._root}))
        if previous is not None:
            log.info("nemo-throughput: this run continues run %s (segment %d, resumed at step %d, joined by its %s; "
                     "the segment it follows reached step %d)", previous.run_id, self.segment, steps_done,
                     binding.joined_by, previous.last_step)
        for note in binding.notes:
            log.info("nemo-throughput: goodput: %s", note)
        return previous

    def _run_file(self) -> Path:
        """goodput.json: in the run's first segment's directory, where that lies inside this segment's own
        output root; else in this segment's own directory (said once)."""
        first = self._binding.earlier[0].directory if self._binding.earlier else self._output_dir
        if _within(first, self._root):
            return first / RUN_FILE
        note = (f"the run's first segment ({first}) lies outside this segment's output directory {self._root}: the "
                f"run's {RUN_FILE} is written into {self._output_dir}")
        self._binding.notes.append(note)
        return self._output_dir / RUN_FILE

    @property
    def segment(self) -> int:
        return len(self._binding.earlier) + 1

    def section(self) -> dict[str, Any] | None:
        """The run's goodput so far (stitch), also written to its goodput.json; None before training."""
        own = read_ledger(self.ledger.path) if self._run_id is not None else None
        if own is None:
            return None
        goodput = stitch([*self._binding.earlier, own], self._binding.notes)
        try:
            write_json_atomic(self._file, goodput, durable=False)
        except (OSError, ValueError) as error:  # the summary still holds it
            log.warning("nemo-throughput: could not write %s: %s", self._file, error)
        if goodput["goodput_pct"] is not None:
            self.goodput_pct = goodput["goodput_pct"]
        return {"file": os.path.relpath(self._file, self._output_dir), "segment": self.segment,
                **{key: value for key, value in goodput.items() if key != "schema"}}


def _within(path: Path, root: str) -> bool:
    """Whether ``path`` lies in ``root``'s tree, links resolved (a link under the root leads out of it)."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, real_root]) == real_root


def _fitting(identity: dict[str, Any]) -> dict[str, Any]:
    """The identity within the ledger's room: the root (informational: segments are searched for where
    this one runs) and then the scheduler key are left out where a long path or name would not fit."""
    for optional, left_out in (("root", ""), ("scheduler_key", None)):
        if len(json.dumps(identity).encode()) <= IDENTITY_BYTES:
            break
        identity[optional] = left_out
    return identity
