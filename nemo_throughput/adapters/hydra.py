"""Hydra glue: `+callbacks=throughput` on the command line -> a ThroughputCallback in the Trainer.

NeMo scripts build their Trainer without any config key for extra callbacks, so the route is:
1. the search-path plugin (``hydra_plugins/nemo_throughput_searchpath``) makes the config group
   ``callbacks/throughput`` visible to every Hydra app;
2. that group registers :class:`KeepThroughputConfig` as a Hydra job callback, which validates
   and keeps the composed ``callbacks.throughput`` settings when the job starts;
3. Lightning calls :func:`callbacks_factory` (an entry point) in every ``Trainer.__init__``;
   it returns a callback only if step 2 kept settings in this process.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from nemo_throughput.config import ThroughputConfig

_kept_settings: dict[str, Any] | None = None


class KeepThroughputConfig(Callback):
    """Hydra job callback registered by the ``callbacks/throughput`` config group."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _kept_settings
        section = OmegaConf.select(config, "callbacks.throughput")
        if section is None:
            raise SystemExit("nemo-throughput's Hydra callback is registered but `callbacks.throughput` is "
                             "missing from the config; add `+callbacks=throughput` to the command line.")
        # Hydra turns exceptions of job callbacks into warnings (Callbacks._notify catches
        # Exception) and the job trains on without the callback. A wrong setting must stop the
        # job now, before a model is built: SystemExit is not an Exception, so it gets through.
        try:
            settings = OmegaConf.to_container(section, resolve=True)
            if not isinstance(settings, dict):
                raise ValueError(f"callbacks.throughput must be a group of settings, got {settings!r}")
            ThroughputConfig.from_mapping(settings)
        except Exception as error:  # noqa: BLE001 - whatever it is, it must not become a warning
            raise SystemExit(f"nemo-throughput: {error}") from error
        _kept_settings = settings

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        # A later job in the same process (multirun, or a driver running several scripts) that
        # did not ask for the callback must not get this job's.
        global _kept_settings
        _kept_settings = None


def callbacks_factory() -> list[Any]:
    """Lightning ``callbacks_factory`` entry point: nothing unless `+callbacks=throughput` asked."""
    if _kept_settings is None:
        return []
    from nemo_throughput.adapters.lightning import ThroughputCallback

    callback = ThroughputCallback(**_kept_settings)
    callback.from_hydra_config = True
    return [callback]
