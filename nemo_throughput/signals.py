"""Noticing SIGTERM without blocking in the signal handler.

Slurm (at the time limit, then SIGKILL after KillWait, 30 s by default), torchrun and Kubernetes
(then SIGKILL after terminationGracePeriodSeconds, 30 s by default) stop a job with SIGTERM. The
handler installed here only notes it and wakes a thread, which writes what this rank knows; then
it hands the signal on to the handler it found (Lightning's), whatever that one does: Lightning
2.6 broadcasts from inside its handler, which can hang a run with several ranks.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from nemo_throughput.text import package_logger

log = package_logger(__name__)


class SigtermWatch:
    """Calls ``on_sigterm`` on a thread of its own when SIGTERM arrives, before the signal goes on
    to the handler that was there. Installed only in front of a Python handler (Lightning's)."""

    def __init__(self, on_sigterm: Callable[[], None]) -> None:
        self.received = False
        self._on_sigterm = on_sigterm
        self._previous: Any = None
        self._installed = False
        self._stopping = False
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> bool:
        """Put the watch in front of the current SIGTERM handler; False where it cannot be."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return self._installed
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous):
            # With the default action the process ends at once whatever we do; with SIG_IGN it
            # goes on. Either way there is nothing to hand the signal on to: keep out of it.
            return False
        self._previous = previous
        self._thread = threading.Thread(target=self._watch, name="nemo-throughput-sigterm", daemon=True)
        self._thread.start()
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Give the handler back (if ours is still the current one) and end the thread."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)
        self._installed = False
        self._stopping = True
        self._wakeup.set()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs on the main thread between two bytecodes of whatever it was doing: take no lock,
        # touch no file, wait for nothing. Event.set only notifies the waiting thread.
        self.received = True
        self._wakeup.set()
        self._previous(signum, frame)

    def _watch(self) -> None:
        self._wakeup.wait()
        if self._stopping:
            return
        try:
            self._on_sigterm()
        except Exception:  # a thread's exception would go unseen; the run goes on to its end
            log.exception("nemo-throughput: could not write the summary on SIGTERM")
