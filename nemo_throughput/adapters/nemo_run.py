"""The NeMo 2 / NeMo-Run entry: the callback as a ``run.Config``, for recipes and the ``nemo`` CLI.

Exported as ``nemo_throughput.nemo_callback``. Neither NeMo-Run nor Lightning is imported until
:func:`nemo_callback` is called, and then only after its settings were checked.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any

from nemo_throughput.config import ThroughputConfig


def nemo_callback(**settings: Any) -> Any:
    """``run.Config(ThroughputCallback, ...)`` for NeMo 2 recipes and the NeMo-Run CLI.

    Python: ``recipe.trainer.callbacks.append(nemo_callback(log_every_n_steps=20))``.
    CLI: ``nemo llm pretrain --factory llama3_8b 'trainer.callbacks+=[nemo_throughput.nemo_callback()]'``.
    Keyword arguments are ThroughputConfig's fields; a misspelt one fails here, before submission.
    """
    ThroughputConfig.from_mapping(settings)  # first: a wrong setting is named whether or not NeMo-Run is here

    import nemo_run as run

    from nemo_throughput.adapters.lightning import ThroughputCallback

    return run.Config(ThroughputCallback, **settings)


def _settings_signature() -> inspect.Signature:
    """Every ThroughputConfig field as a keyword parameter: NeMo-Run's CLI parses `name=value`
    against the factory's signature, and reads `Optional[X]` where Python 3.10 writes `X | None`."""

    def for_nemo_run(hint: Any) -> Any:
        return typing.Union[typing.get_args(hint)] if isinstance(hint, types.UnionType) else hint  # noqa: UP007

    hints = typing.get_type_hints(ThroughputConfig)
    return inspect.Signature([
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                          annotation=for_nemo_run(hints[f.name]))
        for f in dataclasses.fields(ThroughputConfig)
    ])


nemo_callback.__signature__ = _settings_signature()
