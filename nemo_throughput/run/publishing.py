"""Where a measured run's summary goes, and how the run's end is written down.

Rank 0 publishes: its ``summary.json`` (rewritten in the background at every log step, closed at
the end) and, where asked for, the live Prometheus endpoint. Another rank keeps its own
``summary.rank<N>.json`` only while rank 0 may lack its steps (a final exchange that did not
complete). A SIGTERM watch writes the last consistent summary, marked interrupted, before the
framework's own handler runs (which may hang in a collective). One lock orders the two writers: the
final summary is never replaced by an older one.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemo_throughput.prometheus import PrometheusEndpoint, job_id
from nemo_throughput.run_facts import RunFacts
from nemo_throughput.signals import SigtermWatch
from nemo_throughput.summary import SummaryFile, outliers_text, write_json_atomic
from nemo_throughput.text import package_logger, printable

log = package_logger(__name__)


class Publisher:
    """One rank's summary files, endpoint and SIGTERM watch."""

    def __init__(self, rank: int, output_dir: str) -> None:
        self.rank, self.output_dir = rank, output_dir
        self.summary_path = os.path.join(output_dir, "summary.json")
        self.rank_summary_path = self._rank_file(rank)  # where a rank other than 0 leaves what it knew
        self.endpoint: PrometheusEndpoint | None = None  # rank 0, where asked for
        self._file: SummaryFile | None = None  # rank 0, from train start
        self._sigterm: SigtermWatch | None = None
        # The last consistent summary (and the step it was absorbed through), for the SIGTERM watch.
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        # Made with the watch (a callback may be pickled before, as by ddp_spawn): the writers' lock.
        self._lock: threading.Lock | None = None
        self._done = False

    @property
    def done(self) -> bool:
        """The final summary is written."""
        return self._done

    @property
    def sigterm_received(self) -> bool:
        return self._sigterm is not None and self._sigterm.received

    def _rank_file(self, rank: int) -> str:
        return os.path.join(self.output_dir, f"summary.rank{rank}.json")

    def _locked(self) -> threading.Lock | contextlib.nullcontext:
        return self._lock or contextlib.nullcontext()

    # ----------------------------------------------------------------------- start
    def serve(self, setting: Mapping[str, Any], facts: RunFacts) -> None:
        """Rank 0: serve live metrics as the prometheus setting (or its variable) asks."""
        labels = {"run": facts.name, "run_id": facts.run_id, "label": facts.label or "",
                  "model": facts.model_name or "", "job_id": job_id(os.environ)}
        try:
            endpoint = PrometheusEndpoint(setting, labels)
        except ImportError:
            log.warning("nemo-throughput: no Prometheus endpoint: prometheus-client is not installed "
                        "(pip install 'nemo-throughput[prometheus]'). Training goes on.")
            return
        if endpoint.serve():
            self.endpoint = endpoint

    def open(self) -> None:
        """Training starts: a run (again) in progress."""
        self._done = False
        if self.rank == 0:
            self._file = SummaryFile(self.summary_path)

    def watch_sigterm(self) -> None:
        """Install the SIGTERM watch (once): call it after the framework installed its own handler."""
        if self._sigterm is None:
            self._lock = threading.Lock()
            self._sigterm = SigtermWatch(self._write_at_sigterm)
            self._sigterm.install()

    # ----------------------------------------------------------------------- during the run
    def interval(self, logged: Mapping[str, float], measured_step_s: Iterable[float],
                 telemetry: list[dict[str, float]], places: list[dict[str, Any]],
                 rank_straggler_s: Sequence[float] = ()) -> None:
        """Rank 0: an interval's figures to the endpoint (on the reporting thread)."""
        if self.endpoint is not None:
            self.endpoint.interval(logged, measured_step_s, telemetry, places, rank_straggler_s)

    def last_step(self, epoch_s: float) -> None:
        """Rank 0: steps ended at ``epoch_s`` (Unix time, s), to the endpoint (for its stall alert)."""
        if self.endpoint is not None:
            self.endpoint.last_step(epoch_s)

    def running(self, summary: dict[str, Any], absorbed_through: int) -> None:
        """The running summary as of a log step, kept for the SIGTERM watch; rank 0 publishes it. After
        SIGTERM it is written marked interrupted, as the watch's write was: a `running` one would
        replace that, and stay if the process is then killed."""
        self._snapshot = (absorbed_through, summary)
        with self._locked():  # the watch checks and writes under it too
            if self.rank == 0 and not self.sigterm_received and not self._done:
                self._publish(summary)
        if self.sigterm_received:
            self._write_at_sigterm()

    def interim(self, summary: dict[str, Any], missing: str) -> None:
        """This rank's summary before the final exchange, ``missing`` naming the steps it may lack:
        rank 0 through its background writer, others to their own file."""
        summary = self.with_end(summary, missing)
        with self._locked():
            if self._done:
                return  # the final one is written; never replace it with an older one
            if self.rank == 0:  # on this thread: a kill may follow
                self._publish(summary, now=True)
            else:
                self._write_rank_file(summary, durable=False)

    def _write_at_sigterm(self) -> None:
        """On the SIGTERM watch's thread: the last summary the training thread built (a consistent
        one), marked interrupted, before the framework's handler broadcasts (which can hang)."""
        if self._snapshot is None:
            return
        absorbed_through, snapshot = self._snapshot
        self.interim({**snapshot, "status": "interrupted", "error": "SIGTERM received"},
                     f"steps after {absorbed_through}: written when SIGTERM arrived, before the final exchange "
                     "across ranks")

    def _publish(self, summary: dict[str, Any], now: bool = False) -> None:
        """Rank 0: a running or interrupted summary, to its file (in the background, or ``now`` on this
        thread) and the endpoint."""
        if now:
            try:
                self._file.write_now(summary)
            except (OSError, ValueError) as error:  # never raise from here (an exception event, SIGTERM)
                log.warning("nemo-throughput: could not write %s: %s", printable(self.summary_path), error)
        else:
            self._file.update(summary)
        if self.endpoint is not None:
            self.endpoint.summary(summary)

    # ----------------------------------------------------------------------- end
    def final(self, summary: dict[str, Any], missing: str | None) -> None:
        """The final summary (rank 0); other ranks keep theirs only while rank 0 may lack their steps.
        Then the endpoint and the SIGTERM watch end, even where the summary could not be written (a
        full disk: that error goes on to the caller)."""
        summary = self.with_end(summary, missing)
        status = summary["status"]
        try:
            with self._locked():
                self._done = True
                if self.rank == 0:
                    self._file.close(summary)
                    log.info("nemo-throughput: %s run summary written to %s", status, printable(self.summary_path))
                    if (outliers := outliers_text(summary["timing"])) is not None:
                        log.warning("nemo-throughput: outlier steps: %s (timing.outlier_steps)", outliers)
                elif missing is None:  # the final exchange completed: rank 0 has every step this rank has
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(self.rank_summary_path)
                elif self._write_rank_file(summary, durable=True):
                    log.warning("nemo-throughput: rank %d wrote what it knows to %s", self.rank,
                                printable(self.rank_summary_path))
        finally:
            self._end_services(summary)

    def _end_services(self, summary: dict[str, Any]) -> None:
        """Rank 0's endpoint serves the final figures ``linger_s`` longer (not after SIGTERM: the kill
        follows); the SIGTERM watch gives the handler back."""
        try:
            if self.endpoint is not None:
                self.endpoint.summary(summary)
                self.endpoint.close(linger_s=0.0 if self.sigterm_received else self.endpoint.setting["linger_s"])
                self.endpoint = None
        finally:
            if self._sigterm is not None:
                self._sigterm.uninstall()
                self._sigterm = None

    def with_end(self, summary: dict[str, Any], missing: str | None) -> dict[str, Any]:
        """Add how the run ended: which rank wrote it, the signal, what the summary lacks."""
        summary["end"] = {"rank": self.rank, "signal": "SIGTERM" if self.sigterm_received else None,
                          "all_steps_exchanged": missing is None, "missing": missing}
        return summary

    def ranks_interrupted_on_disk(self, world_size: int) -> list[int]:
        """Ranks whose own summary file (where this rank can see it) says they were interrupted:
        a rank stopped by SIGTERM writes it at once, and may be gone before the final exchange."""
        ranks = []
        for rank in range(world_size):
            with contextlib.suppress(OSError, ValueError):
                with open(self._rank_file(rank), encoding="utf-8") as file:
                    if rank != self.rank and json.load(file).get("status") == "interrupted":
                        ranks.append(rank)
        return ranks

    def _write_rank_file(self, summary: dict[str, Any], durable: bool) -> bool:
        # Never raise from here: an exception event must not replace the run's own error with ours.
        try:
            write_json_atomic(self.rank_summary_path, summary, durable=durable)
            return True
        except (OSError, ValueError) as error:
            log.warning("nemo-throughput: could not write %s: %s", printable(self.rank_summary_path), error)
            return False
