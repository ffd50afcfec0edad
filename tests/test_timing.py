"""The step timer's lazy reading, through a device clock whose marks complete only when told.

``LaggingDevice`` stands in for a GPU stream: marks are recorded with a device timestamp and
complete in order, later than the host records them. Reading a mark that has not completed
raises, so a passing test shows the timer never reads unfinished work; the access log shows
it touches no mark at all on steps that are not log steps.
"""

import threading
import time

import pytest

from nemo_throughput.timing import BACKWARD, OPTIMIZER, START, HostClock, StepTimer, StepTimes


class LaggingDevice:
    def __init__(self):
        self.device_time_s = 0.0
        self.recorded: list[float] = []  # device timestamp of each mark
        self.completed = 0  # marks [0, completed) have completed
        self.accesses: list[tuple[str, int]] = []

    def mark(self) -> int:
        self.recorded.append(self.device_time_s)
        return len(self.recorded) - 1

    def ready(self, mark: int) -> bool:
        self.accesses.append(("ready", mark))
        return mark < self.completed

    def wait(self, mark: int) -> None:
        self.accesses.append(("wait", mark))
        self.completed = max(self.completed, mark + 1)  # in-order completion up to this mark

    def seconds(self, earlier: int, later: int) -> float:
        self.accesses.append(("read", later))
        if max(earlier, later) >= self.completed:
            raise AssertionError(f"read mark {max(earlier, later)} before it completed")
        return self.recorded[later] - self.recorded[earlier]

    def advance(self, seconds: float) -> None:
        self.device_time_s += seconds

    def release(self, mark: int) -> None:
        self.accesses.append(("release", mark))


class PooledDevice:
    """A device whose marks are reusable cells, as CUDA events from a pool are: ``mark`` re-records a
    released cell. A cell released while a step still needs it would be read with a later time."""

    def __init__(self):
        self.device_time_s = 0.0
        self.free: list[list[float]] = []
        self.created = 0

    def mark(self) -> list[float]:
        cell = self.free.pop() if self.free else []
        self.created += not cell and cell not in self.free
        cell[:] = [self.device_time_s]
        return cell

    def ready(self, mark) -> bool:
        return True

    def wait(self, mark) -> None:
        pass

    def seconds(self, earlier, later) -> float:
        return later[0] - earlier[0]

    def release(self, mark) -> None:
        assert all(cell is not mark for cell in self.free), "a mark released twice"
        self.free.append(mark)

    def advance(self, seconds: float) -> None:
        self.device_time_s += seconds


def run_step(timer: StepTimer, device: LaggingDevice, step: int, data=0.01, forward=0.1, backward=0.2,
             optimizer=0.03) -> None:
    device.advance(data)
    timer.mark(START)
    device.advance(forward)
    timer.mark(BACKWARD)
    device.advance(backward)
    timer.mark(OPTIMIZER)
    device.advance(optimizer)
    timer.end_step(step)


def test_marks_are_read_only_on_collection_and_only_when_one_step_old_and_complete():
    device = LaggingDevice()
    timer = StepTimer(device)
    timer.anchor()
    for step in range(1, 5):
        run_step(timer, device, step)
        device.completed = len(device.recorded) - 4  # the device still runs the newest step
    assert device.accesses == []  # the hot path never asked the device anything

    # Log step 4: collect through step 3. Step 3's marks completed already; step 4's have not.
    times = timer.collect(through_step=3)
    assert [t.step for t in times] == [1, 2, 3]
    assert not any(kind == "wait" for kind, _ in device.accesses)
    newest_step_marks = set(range(len(device.recorded) - 4, len(device.recorded)))
    assert not any(mark in newest_step_marks for _, mark in device.accesses)
    assert timer.pending == 1

    for t in times:
        assert t.step_s == pytest.approx(0.34)
        assert (t.data_s, t.forward_s, t.backward_s, t.optimizer_s) == pytest.approx((0.01, 0.1, 0.2, 0.03))
        assert t.local_s == pytest.approx(0.11)


def test_a_log_step_waits_only_for_unfinished_steps_up_to_the_previous_one():
    device = LaggingDevice()
    timer = StepTimer(device)
    timer.anchor()
    for step in range(1, 4):
        run_step(timer, device, step)
    device.completed = 0  # the device lags by more than a step
    end_of_step_2 = 8  # anchor, then four marks per step: step 2 ends with mark 8
    times = timer.collect(through_step=2)
    assert [t.step for t in times] == [1, 2]
    assert [m for kind, m in device.accesses if kind == "wait"] == [4, end_of_step_2]
    assert device.completed == end_of_step_2 + 1  # step 3 was not waited for


def test_collect_all_at_the_end_and_step_times_chain_end_to_end():
    device = LaggingDevice()
    timer = StepTimer(device)
    timer.anchor()
    run_step(timer, device, 1, data=0.5)
    run_step(timer, device, 2, data=0.02)
    times = timer.collect()
    assert [t.step for t in times] == [1, 2] and timer.pending == 0
    assert times[0].step_s == pytest.approx(0.5 + 0.33)
    assert times[1].step_s == pytest.approx(0.02 + 0.33)
    # end-to-end: the steps tile the timeline from the anchor to the last end
    assert sum(t.step_s for t in times) == pytest.approx(device.recorded[-1] - device.recorded[0])


def test_gradient_accumulation_keeps_the_first_start_and_the_last_backward():
    device = LaggingDevice()
    timer = StepTimer(device)
    timer.anchor()
    device.advance(0.01)
    for _ in range(3):  # three micro-batches in one optimizer step
        timer.mark(START)
        device.advance(0.1)
        timer.mark(BACKWARD)
        device.advance(0.2)
    timer.mark(OPTIMIZER)
    device.advance(0.05)
    timer.end_step(1)
    (t,) = timer.collect()
    assert t.step_s == pytest.approx(0.01 + 3 * 0.3 + 0.05)
    assert t.data_s == pytest.approx(0.01)
    assert t.forward_s == pytest.approx(0.3 + 0.3 + 0.1)  # up to the last micro-batch's backward
    assert t.backward_s == pytest.approx(0.2)
    assert t.optimizer_s == pytest.approx(0.05)


def test_anchor_after_validation_leaves_it_out_of_the_next_step():
    device = LaggingDevice()
    timer = StepTimer(device)
    timer.anchor()
    run_step(timer, device, 1)
    device.advance(5.0)  # validation
    timer.anchor()
    run_step(timer, device, 2)
    assert [t.step_s for t in timer.collect()] == pytest.approx([0.34, 0.34])


def test_pooled_marks_are_reused_only_once_read_and_give_the_same_times():
    """Marks from a pool (CUDA events) go back once read: every step's times are what a device with a
    new mark per record gives, under gradient accumulation, validation anchors and lagging reads,
    and after the first interval no step needs a new mark."""
    fresh, pooled = LaggingDevice(), PooledDevice()
    timers = StepTimer(fresh), StepTimer(pooled)
    collected: dict[int, list] = {0: [], 1: []}
    created_after_first_interval = None
    for timer in timers:
        timer.anchor()
    for step in range(1, 61):
        for index, (timer, device) in enumerate(zip(timers, (fresh, pooled))):
            device.advance(0.001 * (step % 7))
            for _ in range(1 + step % 3):  # 1 to 3 micro-batches
                timer.mark(START)
                device.advance(0.01 * (1 + step % 5))
                timer.mark(BACKWARD)
                device.advance(0.02)
            timer.mark(OPTIMIZER)
            device.advance(0.003)
            timer.end_step(step)
            if step % 13 == 0:  # a validation
                device.advance(1.0)
                timer.anchor()
            if step % 10 == 0:  # a log step reads the steps up to the previous one
                fresh.completed = len(fresh.recorded)
                collected[index] += timer.collect(step - 1)
        if step == 20:
            created_after_first_interval = pooled.created
    for index, timer in enumerate(timers):
        fresh.completed = len(fresh.recorded)
        collected[index] += timer.collect()
    assert [t.step for t in collected[1]] == list(range(1, 61))
    for a, b in zip(collected[0], collected[1], strict=True):
        assert tuple(a) == pytest.approx(tuple(b))
    assert pooled.created == created_after_first_interval  # steps 21-60 took every mark from the pool


def test_phases_not_observed_are_none():
    device = LaggingDevice()
    timer = StepTimer(device)
    timer.anchor()
    device.advance(0.1)
    timer.end_step(1)  # e.g. manual optimisation without the backward hook
    (t,) = timer.collect()
    assert t.step_s == pytest.approx(0.1)
    assert (t.data_s, t.forward_s, t.backward_s, t.optimizer_s, t.local_s) == (None, None, None, None, None)


def test_host_clock_measures_real_time():
    timer = StepTimer(HostClock())
    timer.anchor()
    for step in (1, 2):
        timer.mark(START)
        time.sleep(0.02)
        timer.end_step(step)
    times = timer.collect()
    assert all(t.step_s >= 0.02 and t.forward_s is None for t in times)


def test_step_times_round_trip_through_floats():
    t = StepTimes(step=7, step_s=0.5, data_s=None, forward_s=0.2, backward_s=0.25, optimizer_s=0.05)
    assert StepTimes.from_floats(7, t.to_floats()) == t
    # The exchange sends a StepTimes as it is, field by field: its fields are the exchanged columns in order.
    assert StepTimes._fields == ("step", *StepTimes.VALUES)


def test_the_first_measured_live_figures_leave_the_warmup_steps_out(tmp_path):
    """A real Lightning fit whose warm-up steps are slow on purpose: every interval the loggers get
    is the mean of its counted steps as steps.jsonl has them, the one that holds the last warm-up
    step included (it used to average the warm-up steps in)."""
    import json

    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback
    from nemo_throughput.demo.gpt import DemoGPT

    warmup_steps = 3

    class SlowWarmup(DemoGPT):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step < warmup_steps:
                time.sleep(0.2)
            return super().training_step(batch, batch_idx)

    class Collector(pl.loggers.logger.Logger):
        name, version = "collector", 0
        logged: list[tuple[int, float]] = []

        def log_hyperparams(self, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            if "throughput/step_time_s" in metrics:  # at Lightning's step: the steps done before the last one
                self.logged.append((step + 1, metrics["throughput/step_time_s"]))

    callback = ThroughputCallback(log_every_n_steps=5, warmup_steps=warmup_steps, output_dir=tmp_path,
                                  per_step_jsonl=True, model_name="tiny")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=12, logger=Collector(), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                         default_root_dir=tmp_path)
    trainer.fit(SlowWarmup(tiny_gpt_cfg()))

    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    by_step = {row["step"]: row for row in rows}
    logged = Collector.logged
    assert [step for step, _ in logged] == [4, 9, 12]  # intervals 1-4, 5-9, 10-12
    first = 1
    for last, step_time_s in logged:
        counted = [by_step[s]["step_time_s"] for s in range(first, last + 1) if s > warmup_steps]
        assert step_time_s == pytest.approx(sum(counted) / len(counted), rel=1e-12), (first, last)
        first = last + 1


def test_log_steps_hand_the_reporting_to_its_thread_and_the_end_loses_nothing(tmp_path):
    """A real Lightning fit, every step a log step: the live lines are written by the reporting
    thread, not the training thread, and at the end every step is in the lines, steps.jsonl and the
    summary (the end drains the thread before the final exchange)."""
    import json
    import logging

    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback
    from nemo_throughput.demo.gpt import DemoGPT

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.records = []

        def emit(self, record):
            if record.getMessage().startswith("[throughput]"):
                self.records.append(record)

    lines, package_log = Lines(), logging.getLogger("nemo_throughput")
    level = package_log.level
    package_log.addHandler(lines)
    package_log.setLevel(logging.INFO)
    try:
        callback = ThroughputCallback(log_every_n_steps=1, warmup_steps=1, output_dir=tmp_path, per_step_jsonl=True,
                                      model_name="tiny")
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=30, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
                             default_root_dir=tmp_path)
        trainer.fit(DemoGPT(tiny_gpt_cfg()))
    finally:
        package_log.removeHandler(lines)
        package_log.setLevel(level)

    training_thread = threading.main_thread().name
    threads = [record.threadName for record in lines.records]
    # each exchange is read one log step late; the end (on the training thread) takes the last two
    assert threads[:-2] == ["nemo-throughput-report"] * (len(threads) - 2) and len(threads) == 30
    assert threads[-2:] == [training_thread] * 2
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, 31))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["timing"]["steps_measured"] == 29
