"""The reporting thread: tasks in order, drained at the end, errors raised on the caller's thread."""

import threading
import time

import pytest

from nemo_throughput.background import OrderedWorker


def test_tasks_run_in_order_off_the_caller_thread_and_drain_waits_for_all():
    worker = OrderedWorker("test-worker")
    done, threads = [], set()

    def task(i):
        time.sleep(0.001 * (i % 3))  # uneven tasks: order must not depend on their length
        threads.add(threading.current_thread().name)
        done.append(i)

    for i in range(50):
        worker.submit(lambda i=i: task(i))
    assert worker.drain() is None
    assert done == list(range(50)) and threads == {"test-worker"}
    worker.close()


def fail(message):
    raise RuntimeError(message)


def test_an_error_in_a_task_reaches_the_caller_and_later_tasks_do_not_run_on_a_broken_state():
    worker = OrderedWorker("test-worker")
    ran = []
    worker.submit(lambda: fail("ranks disagree"))
    worker.submit(lambda: ran.append("after"))
    error = worker.drain(raise_error=False)  # the end of a failed run: reported, not raised
    assert isinstance(error, RuntimeError) and str(error) == "ranks disagree" and ran == []
    worker.submit(lambda: fail("again"))
    with pytest.raises(RuntimeError, match="again"):
        worker.drain()
    worker.submit(lambda: fail("at the next submit"))
    deadline = time.monotonic() + 10
    while worker._error is None and time.monotonic() < deadline:  # the task ran and failed
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="at the next submit"):
        worker.submit(lambda: None)
    worker.close()


def test_the_idle_call_runs_between_tasks_never_beside_one_and_drain_waits_for_it():
    running, overlaps, idles = [], [], []

    def idle():
        overlaps.append(bool(running))
        idles.append(threading.current_thread().name)
        time.sleep(0.01)

    def task():
        running.append(1)
        time.sleep(0.05)
        running.pop()

    worker = OrderedWorker("watched", idle=idle, idle_every_s=0.01)
    for _ in range(3):
        worker.submit(task)
    worker.drain()
    time.sleep(0.1)
    worker.close()
    assert len(idles) >= 3 and set(idles) == {"watched"} and not any(overlaps)


def test_an_idle_call_that_raises_is_logged_once_and_stops_and_the_tasks_go_on(caplog):
    calls, done = [], []

    def idle():
        calls.append(1)
        raise OSError("disk gone")

    worker = OrderedWorker("watched", idle=idle, idle_every_s=0.01)
    time.sleep(0.1)
    worker.submit(lambda: done.append(1))
    worker.drain()
    worker.close()
    assert calls == [1] and done == [1]
    assert caplog.text.count("watched: the idle call failed; it stops") == 1 and "disk gone" in caplog.text


def test_close_waits_for_the_thread_and_frees_what_its_last_task_held():
    """A daemon thread still ending at the interpreter's exit, dropping a task that holds tensors,
    aborts the process ("terminate called without an active exception": seen at the exit of one-rank
    runs under load). close() returns with the thread gone and the last task's tensor freed."""
    import weakref

    import torch

    from nemo_throughput.background import OrderedWorker

    worker = OrderedWorker("test-worker")
    held = torch.zeros(4)
    freed = weakref.ref(held)
    worker.submit(lambda tensor=held: tensor.sum())
    del held
    worker.drain()
    worker.close()
    assert not worker._thread.is_alive()
    assert freed() is None
