"""The step window, one syntax for every command that counts steps (`report`, `import`, `bench`):
`A:B` (steps A to B-1), `A:` (from A on), `:B`, `-N:` (the last N steps), `last` (the last step).

Steps are numbered as the callback numbers them, from 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_throughput.errors import ReportError

SYNTAX = "A:B (steps A to B-1), A:, -N: (last N steps) or last"


@dataclass(frozen=True)
class Window:
    """Which steps count, by step number (the callback's, from 1): `A:B` is A <= step < B,
    `A:` from A on, `-N:` the last N steps, `last` the last step."""

    text: str
    start: int | None  # negative: the last -start steps
    stop: int | None

    @classmethod
    def parse(cls, text: str) -> Window:
        """The window `text` names, or ReportError saying the syntax."""
        if text == "last":
            return cls(text, -1, None)
        parts = text.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            start, stop = (int(p) if p else None for p in parts)
        except ValueError:
            raise ReportError(f"--window {text!r}: use {SYNTAX}") from None
        if start == 0 and parts[0].lstrip().startswith("-"):  # read as 0: it took every step, warm-up included
            raise ReportError(f"--window {text!r} counts no step from the end: give -N: with N at least 1 (the last "
                              "N steps), or 0: for every step")
        if start is not None and stop is not None and (start < 0 or stop <= start):
            raise ReportError(f"--window {text!r} selects no step: A:B needs 0 <= A < B")
        return cls(text, start, stop)

    @property
    def counts_from_the_end(self) -> bool:
        """`-N:` and `last`: the steps depend on where the run ended."""
        return self.start is not None and self.start < 0

    def select(self, steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """The (step, value) pairs inside the window, of `steps` in step order."""
        if self.counts_from_the_end:
            return steps[self.start:]
        return [(n, t) for n, t in steps if (self.start is None or n >= self.start)
                and (self.stop is None or n < self.stop)]

    def among(self, last_step: int) -> range:
        """The steps it selects of a run of steps 1 to `last_step` (empty when none)."""
        if self.counts_from_the_end:
            return range(max(1, last_step + 1 + self.start), last_step + 1)
        start = 1 if self.start is None else max(1, self.start)
        stop = last_step + 1 if self.stop is None else min(self.stop, last_step + 1)
        return range(start, max(start, stop))

    def reaches_past(self, last_step: int) -> bool:
        """Whether it names steps after `last_step` (or, counting from the end, more steps than there are)."""
        if self.counts_from_the_end:
            return -self.start > last_step
        return self.stop is not None and self.stop > last_step + 1

