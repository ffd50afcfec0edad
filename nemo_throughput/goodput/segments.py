"""Which run a segment continues: the earlier segments' ledgers found, and the one run they are joined to.

A segment continues the run of the checkpoint it resumed from: the callback keeps the run's id and the
saving segment's in each checkpoint (Lightning's callback state), so a resume joins the run that saved
what it loaded, whatever else lies beside it. Without that state (Megatron-Bridge, a checkpoint of an
earlier version) a segment continues the one run whose ledgers could be its past (the same scheduler
job, or a segment that trained as far), and none where two runs could be: a warning says which, and a
new run starts rather than a wrong one go on.

Earlier segments are looked for under this segment's own output root only, never where the first
segment says it ran: a moved run keeps its past, and a copy never reaches back into its original's.
Nothing found there (a FIFO, a link, a directory where a ledger belongs, an unreadable directory,
a directory of a million entries) can stall or fail the search.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_throughput.goodput.ledger import LEDGER_FILE, Segment, read_ledger
from nemo_throughput.text import package_logger
from nemo_throughput.values import whole_number

log = package_logger(__name__)

MAX_ENTRIES = 100_000  # directory entries read under a root: a huge directory is searched in part, noted
_MAX_ID = 256  # characters of a run id taken from a checkpoint or a ledger


@dataclass(frozen=True)
class Resumed:
    """What the resumed checkpoint says of goodput: the run and the segment that saved it, at which step."""

    run_id: str
    segment_run_id: str
    step: int | None

    @classmethod
    def from_state(cls, state: Any) -> Resumed | None:
        """From a checkpoint's callback state (RunGoodput.checkpoint_state); None where it holds none,
        or nothing a run wrote (the state is a file others can edit too)."""
        goodput = state.get("goodput") if isinstance(state, Mapping) else None
        if not isinstance(goodput, Mapping):
            return None
        run_id, segment_run_id, step = (goodput.get(key) for key in ("run_id", "segment_run_id", "step"))
        if not (is_id(run_id) and is_id(segment_run_id)):
            return None
        counted = isinstance(step, int) and not isinstance(step, bool) and step >= 0
        return cls(run_id, segment_run_id, step if counted else None)


def is_id(value: Any) -> bool:
    """A run id as a run writes one: printable text of bounded length."""
    return isinstance(value, str) and 0 < len(value) <= _MAX_ID and value.isprintable()


def scheduler_key(env: Mapping[str, str] = os.environ) -> tuple[str | None, int]:
    """(the scheduler's identity of this job, how many times it restarted it): the same across a
    Slurm requeue (SLURM_RESTART_COUNT) and a Kubernetes pod restart; (None, 0) elsewhere."""
    if env.get("SLURM_JOB_ID"):
        array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        job = f"{array}_{task}" if array and task else env["SLURM_JOB_ID"]
        restarts = env.get("SLURM_RESTART_COUNT", "0")
        return f"slurm:{env.get('SLURM_CLUSTER_NAME', '')}:{job}", whole_number(restarts) or 0
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("JOB_NAME"):
        return f"kubernetes:{env.get('POD_NAMESPACE', '')}/{env['JOB_NAME']}", 0
    return None, 0


def ledgers_in(root: str | os.PathLike) -> tuple[list[Path], list[str]]:
    """The ledger paths under ``root``: its own and those of the directories directly under it (where
    output directories are claimed), never through a link to a directory elsewhere; and notes of what
    could not be searched. Reads one directory, at most MAX_ENTRIES entries of it, and never raises."""
    root = Path(root)
    children, notes = [], []
    try:
        with os.scandir(root) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    notes.append(f"only the first {MAX_ENTRIES} entries of {root} were searched for earlier segments")
                    break
                if _is_directory(entry):
                    children.append(entry.name)
    except OSError as error:
        notes.append(f"{root} could not be searched for earlier segments ({error.strerror or error})")
    return [root / LEDGER_FILE, *(root / name / LEDGER_FILE for name in sorted(children))], notes


def _is_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def segments_under(root: str | os.PathLike, own_dir: str | os.PathLike) -> tuple[list[Segment], list[str]]:
    """The segments whose ledgers lie under ``root`` (ledgers_in), this segment's own left out, each once:
    a copy of a run beside it holds the same segments again (the same run, segment id and start), kept
    where first found (the root's own ledger, then by directory name) and noted. A ledger whose ids
    are not a run's (too long, not text) is no segment."""
    paths, notes = ledgers_in(root)
    own = os.path.realpath(own_dir)
    kept: dict[tuple[str, str, float], Segment] = {}
    for segment in filter(None, map(read_ledger, paths)):
        if os.path.realpath(segment.directory) == own or not is_id(segment.run_id):
            continue
        key = (segment.run_id, str(segment.identity.get("segment_run_id")), segment.started_epoch_s)
        if key in kept:
            notes.append(f"the ledger in {segment.directory} is a copy of the one in {kept[key].directory} (the "
                         f"same segment of run {segment.run_id}): counted once")
            continue
        kept[key] = segment
    return list(kept.values()), notes


def run_segments(root: str | os.PathLike, run_id: str) -> list[Segment]:
    """A run's segments under ``root`` (segments_under), in the run's order (run_history)."""
    return run_history([s for s in segments_under(root, os.devnull)[0] if s.run_id == run_id])[0]


def run_history(segments: list[Segment], previous: Segment | None = None) -> tuple[list[Segment], list[str]]:
    """One run's segments in order, and notes: ordered by the number each recorded (which segment of its
    run it is: a host whose clock runs behind cannot reorder them), then by the step each started at,
    then by its host's clock. With ``previous`` (the segment continued), only its branch (_branch).
    Noted where several claim one number (a checkpoint resumed more than once)."""
    ordered = sorted(segments, key=_segment_order)
    notes: list[str] = []
    if previous is not None:
        ordered, notes = _branch(ordered, previous)
    for number, group in itertools.groupby(ordered, key=lambda s: _segment_order(s)[0]):
        claims = list(group)
        if len(claims) > 1:
            where = ", ".join(f"{s.directory} (from step {s.first_step})" for s in claims)
            notes.append(f"{len(claims)} segments say they are segment {number} of run {claims[0].run_id} (a "
                         f"checkpoint resumed more than once): {where}; taken in the order of their first steps, "
                         "then their clocks, the steps of each one not continued counted as lost")
    return ordered, notes


def _branch(ordered: list[Segment], previous: Segment) -> tuple[list[Segment], list[str]]:
    """The segments of the branch that ``previous`` ends: the chain of segments it continued (each
    ledger names the one before it: "parent"), and the attempts beside that chain that saved no
    checkpoint (a retry that died: its time is the run's, its steps lost). A segment that saved
    checkpoints the chain did not resume from, and those that continued it, are another branch of
    the run (a checkpoint resumed twice, a copy resumed beside the original): left out, and noted.
    Ledgers of earlier versions name no parent: kept, as before."""
    by_id = {_segment_id(s): s for s in ordered}
    chain, at = set(), previous
    while at is not None and _segment_id(at) not in chain:
        chain.add(_segment_id(at))
        at = by_id.get(str(at.identity.get("parent")))
    kept, off = [], set()
    for segment in ordered:  # a segment's parent comes before it (its number is lower)
        if _segment_id(segment) not in chain and "parent" in segment.identity and (
                segment.checkpoints or str(segment.identity["parent"]) in off):
            off.add(_segment_id(segment))
        else:
            kept.append(segment)
    notes = [f"the segment in {s.directory} (steps {s.first_step} to {s.last_step}) is another branch of run "
             f"{s.run_id}: it, or the segment it continued, saved checkpoints that this branch did not resume "
             "from; left out" for s in ordered if _segment_id(s) in off]
    return kept, notes


def _segment_id(segment: Segment) -> str:
    return str(segment.identity.get("segment_run_id"))


def _segment_order(segment: Segment) -> tuple[int, int, float]:
    number = segment.identity.get("segment")
    number = number if isinstance(number, int) and not isinstance(number, bool) else 0
    return number, segment.first_step, segment.started_epoch_s


@dataclass
class Binding:
    """Which run a segment continues: the segment it follows (None: it starts a run), the run's
    segments before it in order, what joined them, and what was ambiguous or not found."""

    previous: Segment | None = None
    earlier: list[Segment] = field(default_factory=list)
    joined_by: str | None = None  # "checkpoint", "scheduler" or "directory"
    notes: list[str] = field(default_factory=list)


def bind(root: str | os.PathLike, own_dir: str | os.PathLike, key: str | None, restarts: int, first_step: int,
         resumed: Resumed | None = None) -> Binding:
    """The run this segment continues, from the ledgers under ``root``: the checkpoint's run where the
    checkpoint says (``resumed``), else the one run of the same scheduler job (``key``), else the one
    run that trained past ``first_step`` with no scheduler. Only a segment that resumed from a
    checkpoint (``first_step`` > 0) or was restarted by its scheduler continues one."""
    if first_step <= 0 and restarts <= 0:
        return Binding()
    segments, notes = segments_under(root, own_dir)
    if resumed is not None:
        binding = _by_checkpoint(segments, resumed, root)
    else:
        binding = _by_ledgers(segments, key, first_step, root)
    binding.notes[:0] = notes
    return binding


def previous_segment(root: str | os.PathLike, own_dir: str | os.PathLike, key: str | None, restarts: int,
                     first_step: int, resumed: Resumed | None = None) -> Segment | None:
    """The segment this one continues (bind); None: it starts a run."""
    return bind(root, own_dir, key, restarts, first_step, resumed).previous


def _by_checkpoint(segments: list[Segment], resumed: Resumed, root: str | os.PathLike) -> Binding:
    of_run = [s for s in segments if s.run_id == resumed.run_id]
    if not of_run:
        return Binding(notes=[f"the checkpoint resumed from was saved by run {resumed.run_id}, none of whose "
                              f"segments has a ledger under {root}: goodput counts from this segment, as a new run"])
    ordered = run_history(of_run)[0]
    saver = [s for s in ordered if _segment_id(s) == resumed.segment_run_id]
    previous = saver[-1] if saver else ordered[-1]
    earlier, notes = run_history(ordered, previous)
    if not saver:
        notes.insert(0, f"the segment that saved the checkpoint resumed from ({resumed.segment_run_id}) has no "
                        f"ledger under {root}: this segment follows the other segments of run {resumed.run_id} there")
    return Binding(previous, earlier, "checkpoint", notes)


def _by_ledgers(segments: list[Segment], key: str | None, first_step: int, root: str | os.PathLike) -> Binding:
    """Without the checkpoint's word: the one run that can be this segment's past, or none."""
    if key is not None:
        fits, joined_by = [s for s in segments if s.identity.get("scheduler_key") == key], "scheduler"
        why = f"of the scheduler's job {key}"
    else:
        fits = [s for s in segments if s.identity.get("scheduler_key") is None and s.last_step >= first_step > 0]
        joined_by, why = "directory", f"that trained to step {first_step} or past it"
    runs = sorted({s.run_id for s in fits})
    if len(runs) > 1:
        note = (f"runs {', '.join(runs)} under {root} each have a segment {why}, and the checkpoint resumed from "
                "does not say which run saved it: this segment starts a new run rather than continue one at a guess")
        log.warning("nemo-throughput: goodput: %s", note)
        return Binding(notes=[note])
    if not runs:
        return Binding()
    ordered = run_history([s for s in segments if s.run_id == runs[0]])[0]
    earlier, notes = run_history(ordered, ordered[-1])
    return Binding(ordered[-1], earlier, joined_by, notes)
