"""The loggers' metrics in the trackers users already run, read back from the real packages' files.

Megatron-Bridge's writers live on its ``GlobalState``, on the last rank: a real TensorBoard
``SummaryWriter``, the ``wandb`` module after ``wandb.init`` (offline), the ``mlflow`` module with a
run started in a local file store, and a Comet experiment (offline: Comet's ``OfflineExperiment``,
where Bridge makes an ``Experiment``), as Bridge's ``GlobalState`` properties make them. The
``GlobalState`` itself is test_megatron_bridge's stand-in (Bridge's own cannot be imported on
Python 3.11); the writers in it are the real ones. A Lightning run of the same length logs to
Lightning's own CSV, TensorBoard, W&B (offline) and MLflow loggers, read back the same way.
"""

import csv
import glob
import json
import math
import os
import zipfile
from pathlib import Path

import pytest
import torch
from test_megatron_bridge import ThroughputCallback, llama_like_config, on_two_gloo_ranks, run_bridge_loop

from conftest import read_json
from nemo_throughput.explain.telemetry import FIELDS
from nemo_throughput.explain.telemetry_stats import GIB, TelemetryStats
from nemo_throughput.progress import LOGGED_KEYS, TELEMETRY_KEYS

STEPS, LOG_EVERY = 10, 2
# Megatron-Bridge has no event inside a step: its steps have no forward/backward/optimizer phases.
NOT_UNDER_BRIDGE = {"forward_s", "backward_s", "optimizer_s"}


def tensorboard_scalars(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_history(directory):
    """Every history row of an offline W&B run, read with wandb's own record reader."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = glob.glob(os.path.join(directory, "wandb", "offline-run-*", "run-*.wandb"))
    store = datastore.DataStore()
    store.open_for_scan(path)
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def mlflow_history(tracking_uri, run_id):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    return {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
            for key in client.get_run(run_id).data.metrics}


def comet_history(directory):
    """The metrics of an offline Comet experiment, from the archive it leaves (its messages file)."""
    (archive,) = glob.glob(os.path.join(directory, "*.zip"))
    with zipfile.ZipFile(archive) as files:
        messages = [json.loads(line) for line in files.read("messages.json").decode().splitlines()]
    history = {}
    for message in messages:
        metric = message["payload"].get("metric") if message["type"] == "metric_msg" else None
        if metric and metric["metricName"].startswith("throughput/"):
            history.setdefault(metric["metricName"], []).append((metric["step"], metric["metricValue"]))
    return history


def _writers_worker(rank, output_dir):
    """Bridge's loop on a rank of a gloo group of two; the writers on the last, as Bridge makes them."""
    writers, run_id = {}, None
    if rank == 1:
        # COMET_DISABLE_AUTO_LOGGING: comet_ml would also patch TensorBoard's add_scalar into the experiment
        os.environ["COMET_DISABLE_AUTO_LOGGING"] = "1"
        import comet_ml
        import mlflow
        import wandb
        from torch.utils.tensorboard import SummaryWriter

        wandb.init(project="throughput", name="bridge", dir=output_dir)
        mlflow.set_tracking_uri(Path(output_dir, "mlruns").as_uri())
        mlflow.set_experiment("throughput")
        run_id = mlflow.start_run(run_name="bridge").info.run_id
        comet_dir = os.path.join(output_dir, "comet")
        comet = comet_ml.OfflineExperiment(project_name="throughput", offline_directory=comet_dir,
                                           auto_output_logging=False, log_env_details=False, log_git_metadata=False,
                                           log_git_patch=False, display_summary_level=0)
        writers = {"tensorboard_logger": SummaryWriter(os.path.join(output_dir, "tb")), "wandb_logger": wandb,
                   "mlflow_logger": mlflow, "comet_logger": comet}
    callback = ThroughputCallback(output_dir=os.path.join(output_dir, "throughput"), log_every_n_steps=LOG_EVERY,
                                  warmup_steps=1, per_step_jsonl=True)
    run_bridge_loop(llama_like_config(steps=STEPS), callback, writers=writers, slow_s=0.01)
    if rank == 1:
        writers["tensorboard_logger"].close()
        writers["wandb_logger"].finish()
        writers["mlflow_logger"].end_run()
        writers["comet_logger"].end()
    return run_id


def lightning_tracker_keys(directory):
    """The ``throughput/`` keys a real Lightning run of the demo GPT (fixed-length batches, as above)
    logs to each of its loggers: CSV, TensorBoard, W&B (offline) and MLflow (a local file store), read
    back from their files. (Lightning's CometLogger disables an offline experiment: not among them.)"""
    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback as LightningCallback
    from nemo_throughput.demo.gpt import DemoGPT

    loggers = {"csv": pl.loggers.CSVLogger(directory / "csv"),
               "tensorboard": pl.loggers.TensorBoardLogger(directory / "tb"),
               "wandb": pl.loggers.WandbLogger(project="throughput", save_dir=directory, offline=True),
               "mlflow": pl.loggers.MLFlowLogger(experiment_name="throughput",
                                                 tracking_uri=(directory / "mlruns").as_uri())}
    callback = LightningCallback(output_dir=str(directory / "throughput"), log_every_n_steps=LOG_EVERY, warmup_steps=1)
    pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=list(loggers.values()), enable_progress_bar=False,
               enable_model_summary=False, enable_checkpointing=False, callbacks=[callback],
               ).fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    for logger in loggers.values():
        logger.finalize("success")
    loggers["wandb"].experiment.finish()
    with open(Path(loggers["csv"].log_dir) / "metrics.csv") as file:
        csv_keys = {key for row in csv.DictReader(file) for key, value in row.items() if value}
    keys = {"csv": csv_keys, "tensorboard": set(tensorboard_scalars(loggers["tensorboard"].log_dir)),
            "wandb": {key for row in wandb_history(directory) for key in row},
            "mlflow": set(mlflow_history((directory / "mlruns").as_uri(), loggers["mlflow"].run_id))}
    return {tracker: {key for key in found if key.startswith("throughput/")} for tracker, found in keys.items()}


@pytest.mark.slow
def test_bridge_writers_on_the_last_rank_get_the_lightning_keys_with_the_run_s_values(tmp_path, monkeypatch):
    # Offline W&B; MLflow 3 keeps its file store only on request. The spawned ranks inherit these.
    for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("MLFLOW_ALLOW_FILE_STORE", "true")):
        monkeypatch.setenv(name, value)
    run_id = on_two_gloo_ranks(_writers_worker, tmp_path)[1]
    out = tmp_path / "out"
    tensorboard = tensorboard_scalars(out / "tb")
    mlflow = mlflow_history((out / "mlruns").as_uri(), run_id)
    rows = [row for row in wandb_history(out) if "throughput/step" in row]
    wandb = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("throughput/") and key != "throughput/step":
                wandb.setdefault(key, []).append((row["throughput/step"], value))
    comet = comet_history(out / "comet")
    # The same keys and points in every writer (TensorBoard keeps float32).
    assert set(tensorboard) == set(mlflow) == set(wandb) == set(comet)
    for key, points in mlflow.items():
        assert wandb[key] == comet[key] == points
        assert [step for step, _ in tensorboard[key]] == [step for step, _ in points]
        assert [value for _, value in tensorboard[key]] == pytest.approx([value for _, value in points], rel=1e-6)
    # The same keys as a Lightning run's logger, but the phases Bridge's events cannot split.
    bridge_keys = {key.removeprefix("throughput/") for key in mlflow}
    lightning = lightning_tracker_keys(tmp_path / "lightning")
    differ = {tracker: {"lacks": sorted(lightning["csv"] - keys), "adds": sorted(keys - lightning["csv"])}
              for tracker, keys in lightning.items() if keys != lightning["csv"]}
    assert not differ, differ  # each tracker's keys against the CSV logger's
    lightning_keys = {key.removeprefix("throughput/") for key in lightning["csv"]}
    assert bridge_keys == lightning_keys - NOT_UNDER_BRIDGE
    # A CPU has no peak and no telemetry; fixed-length batches are not counted.
    assert lightning_keys == set(LOGGED_KEYS) - TELEMETRY_KEYS - {"mfu", "mfu_above_peak", "padding_share",
                                                                  "tokens_per_s_with_padding"}
    # The last rank logged what rank 0 measured: each interval's mean global step time, from steps.jsonl.
    summary = read_json(out / "throughput" / "summary.json")
    with open(out / "throughput" / "steps.jsonl") as file:
        rows = {row["step"]: row for row in map(json.loads, file)}
    logged = dict(mlflow["throughput/step_time_s"])
    assert sorted(logged) == [1, 3, 5, 7, 9, 10]  # each log step hands over the steps before it; the end, the rest
    first = 1
    for last, seconds in sorted(logged.items()):
        interval = [rows[s] for s in range(first, last + 1)]
        measured = [row["step_time_s"] for row in interval if not row["warmup"]] or [r["step_time_s"] for r in interval]
        assert seconds == pytest.approx(sum(measured) / len(measured), rel=1e-12)
        first = last + 1
    tokens = summary["batch"]["tokens_per_step"]
    for (_, rate), (_, seconds) in zip(mlflow["throughput/tokens_per_s"], mlflow["throughput/step_time_s"],
                                          strict=True):
        assert rate == pytest.approx(tokens / seconds, rel=1e-12)
    assert 0 < mlflow["throughput/goodput_pct"][-1][1] <= 100


def test_the_loggers_telemetry_keys_are_the_latest_readings_over_ranks():
    places = [{"rank": r, "host": "node0", "gpu_index": r} for r in range(3)]
    stats = TelemetryStats(places, {"nvml": "test"})

    def sample(power, clock, reserved_gib, throttle, joules):
        row = dict.fromkeys(FIELDS, math.nan)
        row.update(power_w=power, sm_clock_mhz=clock, mem_peak_reserved_bytes=reserved_gib * GIB,
                   throttle_reasons=throttle, energy_j=joules)
        return [row[name] for name in FIELDS]

    stats.add(torch.tensor([sample(300, 1980, 40, 0, 1000), sample(310, 1980, 41, 0, 2000),
                            sample(290, 1980, 40, 0, 3000)], dtype=torch.float64), step=10, is_measured=lambda step: True)
    # Step 20: rank 1 power-capped (0x4) and rank 2 idle (0x1, not a slowdown); 10 steps of 1000 tokens.
    stats.add(torch.tensor([sample(700, 1980, 42, 0, 1500), sample(650, 1700, 43, 0x4, 2600),
                            sample(100, 1410, 40, 0x1, 3400)], dtype=torch.float64), step=20, is_measured=lambda step: True)
    live = stats.live(tokens_per_step=1000)
    assert live == pytest.approx({
        "memory_reserved_gib_min": 40, "memory_reserved_gib_median": 42, "memory_reserved_gib_max": 43,
        "power_w_min": 100, "power_w_median": 650, "power_w_max": 700,
        "sm_clock_mhz_min": 1410, "sm_clock_mhz_median": 1700, "sm_clock_mhz_max": 1980,
        "throttled_ranks": 1,
        "joules_per_token": (500 + 600 + 400) / 10_000, "tokens_per_kwh": 10_000 / (1500 / 3.6e6)}, rel=1e-12)
    assert set(live) == TELEMETRY_KEYS


def test_a_tracker_that_raises_never_fails_the_run_and_the_others_still_get_every_interval(tmp_path, caplog):
    """A tracker whose server is unreachable raises on every call of ours: the run completes, its
    summary says so, the failure is logged once (and counted at the end), and the loggers after it
    still get every interval."""
    import logging

    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback as LightningCallback
    from nemo_throughput.demo.gpt import DemoGPT

    class Unreachable(pl.loggers.CSVLogger):  # as a tracker whose server is down answers our calls
        def log_metrics(self, metrics, step=None):
            if any(key.startswith("throughput/") for key in metrics):
                raise ConnectionError("tracking server 127.0.0.1:9 refused the connection")
            super().log_metrics(metrics, step)

    down, csv_logger = Unreachable(tmp_path / "down"), pl.loggers.CSVLogger(tmp_path / "csv")
    callback = LightningCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=2, warmup_steps=1)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        pl.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=[down, csv_logger], enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, callbacks=[callback],
                   ).fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    csv_logger.finalize("success")
    assert read_json(callback.summary_path)["status"] == "completed"
    failures = [r.getMessage() for r in caplog.records if "Unreachable logger" in r.getMessage()]
    assert failures[0].startswith("nemo-throughput: the Unreachable logger could not take our metrics (ConnectionError: "
                                  "tracking server 127.0.0.1:9 refused the connection); training goes on")
    with open(Path(csv_logger.log_dir) / "metrics.csv") as file:
        steps = {int(row["step"]) for row in csv.DictReader(file) if row.get("throughput/step_time_s")}
    # every interval's metrics, past the failing logger, at its last step as Lightning numbers it (what a
    # step logs, Lightning logs at the steps done before it): intervals ending at steps 1, 3, 5, 7 (a log
    # step reads the one before it) and 8 (the end) are Lightning's 0, 2, 4, 6, 7
    assert steps == {0, 2, 4, 6, 7}
    assert len(failures) == 2 and failures[1].endswith(f"failed to take our metrics {len(steps)} times in this run")


def test_a_bridge_writer_that_raises_never_fails_the_run(tmp_path, caplog):
    import logging

    class RefusingWriter:  # a TensorBoard SummaryWriter on a full disk raises from add_scalar
        def add_scalar(self, key, value, step):
            raise OSError(28, "No space left on device")

    class MlflowStandIn:
        def __init__(self):
            self.logged = []

        def log_metrics(self, metrics, step):
            self.logged.append(step)

    mlflow = MlflowStandIn()
    callback = ThroughputCallback(output_dir=str(tmp_path), log_every_n_steps=2, warmup_steps=1)
    with caplog.at_level(logging.WARNING, logger="nemo_throughput"):
        run_bridge_loop(llama_like_config(steps=8), callback,
                        writers={"tensorboard_logger": RefusingWriter(), "mlflow_logger": mlflow})
    assert read_json(callback.summary_path)["status"] == "completed"
    assert "the tensorboard_logger logger could not take our metrics (OSError: [Errno 28] No space left" in caplog.text
    assert mlflow.logged  # the writer after the failing one still gets every interval


def test_a_slow_tracker_s_time_is_in_the_step_time_and_goodput_does_not_blame_the_data_loader(tmp_path):
    """A tracker taking a second per call on log steps: the next step's time counts it (the wall time
    does), in its logging phase, not its data wait; goodput counts it with the steps, not as data.
    A second, far above any step of this model, even on a loaded machine (0.3 s was not)."""
    import time as clock

    DELAY_S = 1.0

    import pytorch_lightning as pl

    from conftest import tiny_gpt_cfg
    from nemo_throughput import ThroughputCallback as LightningCallback
    from nemo_throughput.demo.gpt import DemoGPT

    class Slow(pl.loggers.CSVLogger):  # a tracker whose server answers slowly
        def log_metrics(self, metrics, step=None):
            if any(key.startswith("throughput/") for key in metrics):
                clock.sleep(DELAY_S)
            super().log_metrics(metrics, step)

    callback = LightningCallback(output_dir=str(tmp_path / "throughput"), log_every_n_steps=3, warmup_steps=1,
                                 per_step_jsonl=True)
    pl.Trainer(max_steps=13, accelerator="cpu", devices=1, logger=Slow(tmp_path / "slow"), enable_progress_bar=False,
               enable_model_summary=False, enable_checkpointing=False, callbacks=[callback],
               ).fit(DemoGPT(tiny_gpt_cfg(global_batch_size=2)))
    rows = list(map(json.loads, open(Path(callback.output_dir) / "steps.jsonl")))
    held = [row for row in rows if row["step_time_s"] >= DELAY_S]  # after a log step that handed the tracker metrics
    assert held and all(row["step"] - 1 in (3, 6, 9, 12) for row in held)
    # The step's logging phase holds it, not its data wait; only a step after a log step has one.
    assert all(rank["logging_s"] >= DELAY_S > rank["data_s"] for row in held for rank in row["ranks"])
    after_log_step = [row["step"] - 1 in (3, 6, 9, 12) for row in rows]
    assert [rank["logging_s"] > 0 for row in rows for rank in row["ranks"]] == after_log_step
    summary = read_json(callback.summary_path)
    breakdown = summary["timing"]["breakdown_s"]
    assert breakdown["logging"] > breakdown["data"]
    goodput = summary["goodput"]["seconds"]
    assert goodput["data"] < DELAY_S <= goodput["productive"]  # the tracker's time is no data wait
