"""Noticing SIGTERM without blocking in the signal handler.

Slurm (at the time limit, then SIGKILL after KillWait, 30 s by default), torchrun and Kubernetes
(then SIGKILL after terminationGracePeriodSeconds, 30 s by default) stop a job with SIGTERM. The
handler installed here only notes it and wakes a thread, which writes what this rank knows; then
it hands the signal on to the handler it found (Lightning's), whatever that one does: Lightning
2.6 broadcasts from inside its handler, which can hang a run with several ranks.

A Python signal handler runs on the main thread only once that thread is back in the interpreter.
A rank blocked in a collective that another rank never joins (that rank is in Lightning's
broadcast) is not, until the collective times out: the watch thread is also woken by the
interpreter's wakeup file descriptor, which its C-level handler writes to as the signal arrives.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from nemo_throughput.text import package_logger

log = package_logger(__name__)

_INSTALLED: weakref.WeakSet[SigtermWatch] = weakref.WeakSet()
STOP_WAIT_S = 2.0  # for the watch thread to end at uninstall (longer only while it writes on SIGTERM)


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the watches and the wakeup fd, whose socket
    its parent's watch thread reads: a SIGTERM to the child must not look like one to the parent."""
    for watch in list(_INSTALLED):
        watch.forget()


os.register_at_fork(after_in_child=_forget_in_child)


class SigtermWatch:
    """Calls ``on_sigterm`` on a thread of its own when SIGTERM arrives, before the signal goes on
    to the handler that was there. Installed only in front of a Python handler (Lightning's)."""

    def __init__(self, on_sigterm: Callable[[], None]) -> None:
        self.received = False
        self._on_sigterm = on_sigterm
        self._previous: Any = None
        self._installed = False
        self._stopping = False
        self._reader: socket.socket | None = None  # the watch thread waits on it; _writer wakes it
        self._writer: socket.socket | None = None
        self._owns_wakeup_fd = False
        self._pid = os.getpid()
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
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        # The interpreter's wakeup fd, where no one else (asyncio) has it: each signal's number is
        # written to it by the C-level handler, whatever the main thread is doing.
        others = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._owns_wakeup_fd = others == -1
        if not self._owns_wakeup_fd:
            signal.set_wakeup_fd(others)
        self._thread = threading.Thread(target=self._watch, name="nemo-throughput-sigterm", daemon=True)
        self._thread.start()
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        _INSTALLED.add(self)
        return True

    def uninstall(self) -> None:
        """Give the handler and the wakeup fd back (where still ours) and end the thread."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)
        if self._owns_wakeup_fd:
            current = signal.set_wakeup_fd(-1)
            if current != self._writer.fileno():  # taken by someone since: theirs it stays
                signal.set_wakeup_fd(current)
        self._installed = False
        _INSTALLED.discard(self)
        self._stopping = True
        self._wake(0)
        self._thread.join(timeout=STOP_WAIT_S)  # ended before uninstall returns, not at interpreter exit

    def forget(self) -> None:
        """In a forked child: the parent's watch wakes nothing (its handler still hands the signal on)."""
        if self._owns_wakeup_fd:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:  # forked from a thread other than the main one: the fd stays (a SIGTERM
                pass  # to such a child would wake the parent's watch; DataLoader workers fork from the main one)
        self._owns_wakeup_fd = False
        _INSTALLED.discard(self)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs on the main thread between two bytecodes of whatever it was doing: take no lock,
        # touch no file, wait for nothing. A byte to the watch thread's socket wakes it (in the
        # process that installed it, not in a forked child).
        if os.getpid() == self._pid:
            self.received = True
            self._wake(signal.SIGTERM)
        self._previous(signum, frame)

    def _wake(self, byte: int) -> None:
        try:
            self._writer.send(bytes([byte]))
        except OSError:  # its buffer is full of bytes not read yet: the thread is awake anyway
            pass

    def _watch(self) -> None:
        try:
            while not self._stopping:
                woken_by = self._reader.recv(256)  # signal numbers (0: stop)
                if self._stopping or not woken_by:
                    return
                if signal.SIGTERM in woken_by:
                    break
            else:
                return
        finally:
            if self._stopping:
                self._reader.close()
                self._writer.close()
        self.received = True
        try:
            self._on_sigterm()
        except Exception:  # a thread's exception would go unseen; the run goes on to its end
            log.exception("nemo-throughput: could not write the summary on SIGTERM")
