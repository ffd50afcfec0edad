"""The SIGTERM watch on its own: woken while the main thread is stuck in a collective another rank
never joins (the Python handler cannot run then), and not woken by a SIGTERM to a forked child."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import free_port

STUCK_RANK = textwrap.dedent("""
    import os, signal, sys, time
    import torch.distributed as dist
    from nemo_throughput.signals import SigtermWatch
    rank, port, woken = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        time.sleep(60)  # never joins the barrier
        sys.exit(0)
    signal.signal(signal.SIGTERM, lambda *args: sys.exit(143))  # the framework's handler
    watch = SigtermWatch(lambda: open(woken, "w").write(str(time.monotonic())))
    assert watch.install()
    print("in the barrier", flush=True)
    dist.barrier()  # blocks in C++ until rank 1 comes (it never does)
""")


def test_a_rank_stuck_in_a_collective_still_writes_when_sigterm_arrives(tmp_path):
    port, woken = free_port(), tmp_path / "woken"
    ranks = [subprocess.Popen([sys.executable, "-c", STUCK_RANK, str(rank), str(port), str(woken)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        assert ranks[0].stdout.readline().strip() == "in the barrier"
        time.sleep(0.5)  # inside dist.barrier by now
        ranks[0].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not woken.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert woken.exists(), "the watch was not woken while the main thread was in the barrier"
        assert ranks[0].poll() is None  # still stuck: the Python-level handler has not run, the watch did
    finally:
        for rank in ranks:
            rank.kill()
            rank.communicate()


def test_a_sigterm_to_a_forked_child_does_not_wake_the_parent_s_watch(tmp_path):
    from nemo_throughput.signals import SigtermWatch

    woken = []
    previous = signal.signal(signal.SIGTERM, lambda *args: None)
    watch = SigtermWatch(lambda: woken.append(os.getpid()))
    try:
        assert watch.install()
        child = os.fork()
        if child == 0:  # a DataLoader worker, say: SIGTERM to itself, through both handlers
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.5)
        assert woken == [] and not watch.received
        os.kill(os.getpid(), signal.SIGTERM)  # to the parent itself: woken
        deadline = time.monotonic() + 5
        while not woken and time.monotonic() < deadline:
            time.sleep(0.02)
        assert woken == [os.getpid()] and watch.received
    finally:
        watch.uninstall()
        signal.signal(signal.SIGTERM, previous)
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd given back
