"""Write what a Trainer holds of nemo-throughput to the JSON file named by $THROUGHPUT_PROBE."""

import dataclasses
import json
import os

from nemo_throughput.adapters.lightning import ThroughputCallback


def dump(trainer) -> None:
    ours = [c for c in trainer.callbacks if isinstance(c, ThroughputCallback)]
    record = {
        "callbacks": [type(c).__name__ for c in trainer.callbacks],
        "settings": [c.config.to_dict() for c in ours],
        "from_hydra_config": [c.from_hydra_config for c in ours],
        "facts": [dataclasses.asdict(c.facts) if c.facts else None for c in ours],
    }
    with open(os.environ["THROUGHPUT_PROBE"], "w") as f:
        json.dump(record, f, default=str)


def set_up_throughput_callbacks(trainer, model) -> None:
    """What Lightning's fit does first for callbacks: setup("fit"), here for ours alone."""
    for callback in [c for c in trainer.callbacks if isinstance(c, ThroughputCallback)]:
        callback.setup(trainer, model, "fit")
