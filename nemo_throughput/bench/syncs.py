"""Counting host-device synchronizations (CUDA): what a callback's hooks must not cause."""

from __future__ import annotations

import warnings
from typing import Any

SYNC_WARNING = "synchroniz"  # torch's "called a synchronizing CUDA operation"


class SyncCounter:
    """Counts host-device synchronizations while active (a context manager, CUDA only).

    Two kinds: the implicit ones that ``torch.cuda.set_sync_debug_mode`` reports (``.item()``, copies
    to the host, ``nonzero``...), as warnings; and explicit calls of ``torch.cuda.synchronize``,
    ``torch.cuda.Stream.synchronize`` and ``torch.cuda.Event.synchronize``, which that mode does not
    all report, counted by wrapping them (each counted once: the debug mode is off inside them).
    With ``mode="error"`` the first synchronization of either kind raises instead. Counters nest:
    an inner one's synchronizations count in the outer ones too. Not thread-safe (nor is the debug
    mode: it is process-wide); operations in torch.distributed are not covered by the debug mode.
    """

    _active: list[SyncCounter] = []
    _originals: dict[tuple[Any, str], Any] = {}

    def __init__(self, mode: str = "warn") -> None:
        if mode not in ("warn", "error"):
            raise ValueError(f"SyncCounter mode must be 'warn' or 'error', got {mode!r}")
        self.mode = mode
        self.implicit = 0
        self.explicit = 0
        self._previous_mode: int | None = None
        self._catcher: Any = None
        self._caught: list[warnings.WarningMessage] = []

    @property
    def count(self) -> int:
        return self.implicit + self.explicit

    def __enter__(self) -> SyncCounter:
        import torch

        if not SyncCounter._active:
            self._patch()
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        self._catcher = warnings.catch_warnings(record=True)
        self._caught = self._catcher.__enter__()
        warnings.simplefilter("always")
        SyncCounter._active.append(self)
        torch.cuda.set_sync_debug_mode(self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.cuda.set_sync_debug_mode(self._previous_mode)
        SyncCounter._active.remove(self)
        implicit = sum(SYNC_WARNING in str(w.message) for w in self._caught)
        self._catcher.__exit__(*exc)
        self.implicit += implicit
        for outer in SyncCounter._active:  # their warning catchers did not see these
            outer.implicit += implicit
        if not SyncCounter._active:
            self._unpatch()

    @classmethod
    def _patch(cls) -> None:
        import torch

        targets = {"torch.cuda.synchronize": torch.cuda, "torch.cuda.Stream.synchronize": torch.cuda.Stream,
                   "torch.cuda.Event.synchronize": torch.cuda.Event}
        for label, owner in targets.items():
            original = owner.synchronize
            cls._originals[(owner, "synchronize")] = original
            owner.synchronize = cls._counted(original, label)

    @classmethod
    def _unpatch(cls) -> None:
        for (owner, name), original in cls._originals.items():
            setattr(owner, name, original)
        cls._originals.clear()

    @classmethod
    def _counted(cls, original: Any, label: str) -> Any:
        import torch

        def counted(*args: Any, **kwargs: Any) -> Any:
            active = cls._active
            if not active:
                return original(*args, **kwargs)
            if active[-1].mode == "error":
                raise RuntimeError(f"called a synchronizing CUDA operation ({label}) where none is allowed")
            for counter in active:
                counter.explicit += 1
            torch.cuda.set_sync_debug_mode(0)  # counted here: the debug mode must not count it again
            try:
                return original(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(active[-1].mode)

        return counted
