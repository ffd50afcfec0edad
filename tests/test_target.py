"""Time to target, the MLPerf way: real Lightning fits on CPU with a validation metric and a target."""

import json
import time

import pytest
import torch
from torch import nn

from nemo_throughput import ThroughputCallback
from nemo_throughput.config import ThroughputConfig
from nemo_throughput.target import Target, TimeToTarget

pl = pytest.importorskip("pytorch_lightning")

VALIDATION_SLEEP_S = 0.02  # each validation takes at least this long: it must be inside the clock


class TouchRecorder(torch.utils.data.Dataset):
    """y = 3x; remembers when a sample was first read."""

    def __init__(self):
        self.x = torch.linspace(-1, 1, 64).unsqueeze(1)
        self.first_read_s = None

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.first_read_s is None:
            self.first_read_s = time.monotonic()
        return self.x[i], 3 * self.x[i]


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.line = nn.Linear(1, 1)
        self.train_data, self.val_data = TouchRecorder(), TouchRecorder()
        self.validations = []  # (global step, val_loss, seconds in validation)

    def training_step(self, batch, batch_idx):
        self.log("progress", float(self.global_step))  # 0, 1, 2...: rises by one each step
        return nn.functional.mse_loss(self.line(batch[0]), batch[1])

    def on_validation_epoch_start(self):
        self._validation_started = time.monotonic()

    def validation_step(self, batch, batch_idx):
        time.sleep(VALIDATION_SLEEP_S)
        self.log("val_loss", nn.functional.mse_loss(self.line(batch[0]), batch[1]))

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            loss = float(self.trainer.callback_metrics["val_loss"])
            self.validations.append((self.global_step, loss, time.monotonic() - self._validation_started))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_data, batch_size=4, shuffle=False)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val_data, batch_size=64)


def fit(tmp_path, quiet_trainer_kwargs, steps=40, **settings):
    model = Regression()
    callback = ThroughputCallback(output_dir=str(tmp_path / "throughput"), seq_length=1, micro_batch_size=4,
                                  flops_per_sample=6.0, model_name="regression", log_every_n_steps=2,
                                  warmup_steps=1, **settings)
    trainer = pl.Trainer(max_steps=steps, val_check_interval=5, num_sanity_val_steps=1, callbacks=[callback],
                         logger=False, **quiet_trainer_kwargs)
    started = time.monotonic()
    trainer.fit(model)
    run_s = time.monotonic() - started
    return model, callback, trainer, json.loads(open(callback.summary_path).read()), run_s


def first_validation_at_or_below(model, value):
    return next((v for v in model.validations if v[1] <= value), None)


def test_clock_stops_at_the_first_validation_that_reaches_the_target(tmp_path, quiet_trainer_kwargs):
    probe, *_ = fit(tmp_path / "probe", quiet_trainer_kwargs)  # where does val_loss go in this run?
    losses = [loss for _, loss, _ in probe.validations]
    assert losses[2] < losses[0]
    target = (losses[1] + losses[2]) / 2  # reached at the third validation, not before

    model, callback, trainer, summary, run_s = fit(tmp_path / "run", quiet_trainer_kwargs,
                                                   target={"metric": "val_loss", "value": target, "mode": "min"})
    reached = first_validation_at_or_below(model, target)
    section = summary["time_to_target"]
    assert section["status"] == "target_reached" and section["metric"] == "val_loss"
    assert section["target"] == target and section["mode"] == "min"
    assert (section["step"], section["value"]) == (reached[0], pytest.approx(reached[1])) and reached[0] == 15
    # the clock started before any data was read (the sanity check's validation batch included) ...
    clock = callback.measurement.run_clock.clock
    assert clock.started_s < model.val_data.first_read_s < model.train_data.first_read_s
    # ... and the validations up to the one that reached the target are inside it
    assert section["seconds"] >= sum(spent for step, _, spent in model.validations if step <= reached[0])
    assert section["seconds"] < run_s and trainer.global_step == 40  # training goes on (stop: false)


def test_a_target_never_reached_says_so_with_the_run_time_and_the_last_value(tmp_path, quiet_trainer_kwargs):
    model, _, _, summary, run_s = fit(tmp_path, quiet_trainer_kwargs, steps=12,
                                      target={"metric": "val_loss", "value": -1, "mode": "min"})
    section = summary["time_to_target"]
    assert section["status"] == "target_not_reached" and section["step"] is None
    assert section["value"] == pytest.approx(model.validations[-1][1])
    assert 0 < section["seconds"] < run_s


def test_a_training_metric_is_checked_on_log_steps_and_stop_ends_training(tmp_path, quiet_trainer_kwargs):
    # progress = global step - 1 when read after step k; log steps are even: first even k with k - 1 >= 5
    _, _, trainer, summary, _ = fit(tmp_path, quiet_trainer_kwargs,
                                    target={"metric": "progress", "value": 5, "mode": "max", "stop": True})
    section = summary["time_to_target"]
    assert section["status"] == "target_reached" and section["step"] == 6 and section["value"] == 5.0
    assert trainer.global_step == 6 and summary["status"] == "completed"


def test_a_target_metric_never_logged_is_said_after_the_first_validation_and_at_the_end(tmp_path, quiet_trainer_kwargs,
                                                                                        caplog):
    """A typo in the metric's name: never reached, and never silently so (stop: true would never stop)."""
    with caplog.at_level("WARNING", logger="nemo_throughput"):
        _, _, trainer, summary, _ = fit(tmp_path, quiet_trainer_kwargs, steps=12,
                                        target={"metric": "val_los", "value": 1.0, "mode": "min", "stop": True})
    section = summary["time_to_target"]
    assert section["status"] == "target_not_reached" and section["value"] is None and trainer.global_step == 12
    warnings = [record.getMessage() for record in caplog.records if "val_los " in record.getMessage()]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("nemo-throughput: the target's metric val_los is not among the metrics logged after "
                                  "validation at step 5 (")
    assert "val_loss" in warnings[0] and "training does not stop for it" in warnings[0]
    assert warnings[1] == ("nemo-throughput: the target's metric val_los was never logged in this run: time_to_target "
                           "is not reached, with no value")


def test_no_target_no_section(tmp_path, quiet_trainer_kwargs):
    *_, summary, _ = fit(tmp_path, quiet_trainer_kwargs, steps=3)
    assert summary["time_to_target"] is None


def test_mllog_lines_are_mlperfs_own_and_match_the_summary(tmp_path, quiet_trainer_kwargs, capsys):
    pytest.importorskip("mlperf_logging")
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    model, callback, _, summary, _ = fit(tmp_path, quiet_trainer_kwargs, mllog=True,
                                         target={"metric": "progress", "value": 5, "mode": "max"})
    lines, errors = parse_file(f"{callback.output_dir}/mlperf.log", ruleset="4.1.0")
    assert errors == []
    keys = [line.key for line in lines]
    assert keys == ["global_batch_size", "run_start", "eval_accuracy", "run_stop"]
    by_key = {line.key: line for line in lines}
    # after the validation at step 5, the monitored metric (whatever logged it) as MLPerf's eval_accuracy
    assert by_key["eval_accuracy"].value["value"] == 4.0
    assert by_key["eval_accuracy"].value["metadata"] | {"file": None, "lineno": None} == {
        "file": None, "lineno": None, "step_num": 5, "samples_count": 5 * 4}
    assert by_key["global_batch_size"].value["value"] == 4
    assert by_key["run_stop"].value["metadata"]["status"] == "success"
    assert by_key["run_stop"].value["metadata"]["step_num"] == 6
    run_ms = by_key["run_stop"].timestamp - by_key["run_start"].timestamp
    assert run_ms == pytest.approx(summary["time_to_target"]["seconds"] * 1000, abs=1)
    assert capsys.readouterr().out.count(":::MLLOG") == 4  # and on stdout, where launchers collect them


def test_mllog_writes_eval_accuracy_and_an_aborted_run_stop(tmp_path, quiet_trainer_kwargs):
    pytest.importorskip("mlperf_logging")
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    model, callback, _, _, _ = fit(tmp_path, quiet_trainer_kwargs, steps=12, mllog=True,
                                   target={"metric": "val_loss", "value": -1, "mode": "min"})
    lines, _ = parse_file(f"{callback.output_dir}/mlperf.log", ruleset="4.1.0")
    evaluations = [line for line in lines if line.key == "eval_accuracy"]
    assert [e.value["metadata"]["step_num"] for e in evaluations] == [step for step, _, _ in model.validations]
    assert [e.value["value"] for e in evaluations] == pytest.approx([loss for _, loss, _ in model.validations])
    assert lines[-1].key == "run_stop" and lines[-1].value["metadata"]["status"] == "aborted"


def test_time_to_target_counts_from_start_with_any_clock():
    now = [100.0]
    clock = TimeToTarget(Target("acc", 0.9, "max"), clock=lambda: now[0])
    clock.start()
    now[0] = 103.0
    assert clock.check({"loss": 1.0}, step=3) is None  # the metric is not logged yet
    assert clock.check({"acc": 0.5}, step=4) is False
    now[0] = 110.0
    assert clock.check({"acc": torch.tensor(0.95)}, step=9) is True
    now[0] = 120.0
    assert clock.check({"acc": 0.99}, step=10) is False  # only the first time counts
    assert clock.section() == {"status": "target_reached", "seconds": 10.0, "step": 9, "metric": "acc",
                               "value": pytest.approx(0.95), "target": 0.9, "mode": "max"}


@pytest.mark.parametrize("settings, message", [
    ({"target": {"metric": "val_loss", "value": 2.5}}, r"missing \['mode'\]"),
    ({"target": {"metric": "val_loss", "value": 2.5, "mode": "down"}}, "target.mode must be min"),
    ({"target": {"metric": "val_loss", "value": "2.5", "mode": "min"}}, "target.value must be a finite number"),
    ({"target": {"metric": "val_loss", "value": 2.5, "mode": "min", "patience": 3}}, r"unknown \['patience'\]"),
    ({"target": "val_loss<2.5"}, "target must be a mapping"),
    ({"mllog": True}, "set target too"),
])
def test_target_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        ThroughputConfig(**settings)
