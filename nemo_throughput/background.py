"""One worker thread that runs a run's reporting off the training thread, in order.

A log step hands it what arrived from the other ranks and returns; the worker folds it into
the statistics, writes the log line, steps.jsonl and the running summary. ``drain`` waits until
everything handed over is done: the end of a run (completed, failed, SIGTERM) drains before its
final exchange, so nothing handed over is lost. An error in a task is raised on the training
thread at the next ``submit`` or ``drain``, as it would have been had the task run there.
An ``idle`` callable, where given, runs on the same thread every ``idle_every_s`` between tasks
(the stall watch): never beside a task, and ``drain`` waits for it as for one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from nemo_throughput.text import package_logger

log = package_logger(__name__)


class OrderedWorker:
    """Runs submitted callables one at a time, in submission order, on a daemon thread."""

    def __init__(self, name: str, idle: Callable[[], None] | None = None, idle_every_s: float = 1.0) -> None:
        self._idle, self._idle_every_s = idle, idle_every_s
        self._tasks: deque[Callable[[], None]] = deque()
        self._busy = False
        self._error: BaseException | None = None
        self._closed = False
        self._draining = 0  # callers waiting in drain
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        """Queue ``task``; raises the error of an earlier task, if one failed."""
        self._raise_error()
        with self._changed:
            self._tasks.append(task)
            self._changed.notify_all()

    def drain(self, raise_error: bool = True) -> BaseException | None:
        """Wait until every task submitted so far has run. Returns (or raises) a task's error."""
        with self._changed:
            self._draining += 1
            self._changed.wait_for(lambda: not self._tasks and not self._busy)
            self._draining -= 1
        if raise_error:
            self._raise_error()
        error, self._error = self._error, None
        return error

    def close(self, wait_s: float = 10.0) -> None:
        """Let the thread end once its tasks are done, and wait for it (at most ``wait_s``): a daemon
        thread still ending at the interpreter's exit, dropping a task that holds tensors, aborts the
        process ("terminate called without an active exception")."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        next_idle = time.monotonic() + self._idle_every_s
        while True:
            with self._changed:
                timeout = None if self._idle is None else max(next_idle - time.monotonic(), 0.0)
                self._changed.wait_for(lambda: bool(self._tasks) or self._closed, timeout)
                if self._closed and not self._tasks:
                    return
                if not self._tasks and self._draining:  # no idle call while a caller drains: it would
                    next_idle = time.monotonic() + self._idle_every_s  # never see the thread free
                    continue
                task = self._tasks.popleft() if self._tasks else None
                self._busy = True
            if task is None:  # the idle call is due
                next_idle = time.monotonic() + self._idle_every_s
                self._run_idle()
                continue
            try:
                if self._error is None:  # after a failure, later tasks would build on a broken state
                    task()
            except BaseException as error:  # noqa: BLE001 - handed to the training thread
                self._error = error
            finally:
                task = None  # what it holds (tensors) is freed now, not when the thread ends
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _run_idle(self) -> None:
        try:
            self._idle()
        except Exception:  # noqa: BLE001 - a watch's failure is logged, never the run's
            log.exception("nemo-throughput: %s: the idle call failed; it stops", self._thread.name)
            self._idle = None
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()
