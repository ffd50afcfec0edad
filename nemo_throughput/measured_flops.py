"""Model FLOPs of any model, counted on one real training step (``flops_formula: measured``).

torch.utils.flop_counter's ``FlopCounterMode`` sees every aten operation that runs while it is
entered, forward and autograd's backward alike, and adds up the FLOPs of those it has a formula
for (matrix multiplications, convolutions, attention). Entered for one whole optimizer step (all
its gradient-accumulation micro-batches), it counts what that model really computes: frozen
parameters get no weight gradient, so a LoRA fine-tune's backward is less than twice its
forward, which no 3x-forward formula can tell. Element-wise operations (norms, activations, the
optimizer's update) have no formula and are not counted, as in the formulas of ``flops.py``.

The counting slows the step it covers, so it is done on the first optimizer step of the run,
which is a warm-up step and left out of the statistics anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch.utils.flop_counter import FlopCounterMode

from nemo_throughput.flops import MEASURED
from nemo_throughput.text import package_logger

if TYPE_CHECKING:
    from nemo_throughput.run_facts import Learned, RunFacts

__all__ = ["MEASURED", "FirstStepFlops", "MeasuredFlops", "StepFlopCounter", "flops_per_sample"]

log = package_logger(__name__)


@dataclass(frozen=True)
class MeasuredFlops:
    """What one optimizer step of this rank computed, split at the start of backward."""

    forward: int
    backward: int
    samples: int  # this rank's samples in the step

    @property
    def total(self) -> int:
        return self.forward + self.backward

    def to_dict(self) -> dict[str, int]:
        return {"forward": self.forward, "backward": self.backward, "total": self.total, "samples": self.samples}


class StepFlopCounter:
    """Counts one optimizer step: ``start`` at its first micro-batch, ``backward_starts`` before each
    backward, ``forward_starts`` at each later micro-batch, ``stop`` when the step has ended.

    The forward part is what runs from a micro-batch's start to its backward; the backward part
    from there to the next micro-batch (or the optimizer step, whose element-wise update has no
    FLOP formula and adds nothing).
    """

    def __init__(self) -> None:
        self._mode: FlopCounterMode | None = None
        self._forward = 0
        self._backward = 0
        self._phase_start = 0
        self._in_backward = False

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()
        self._phase_start, self._in_backward = 0, False

    def forward_starts(self) -> None:
        """A later micro-batch of the same optimizer step begins."""
        if self._mode is not None and self._in_backward:
            self._close_phase()

    def backward_starts(self) -> None:
        if self._mode is not None and not self._in_backward:
            self._close_phase()

    def stop(self, samples: int) -> MeasuredFlops | None:
        """Leave the counting mode; the step's counts, or None if it was not counting."""
        if self._mode is None:
            return None
        self._close_phase()
        self._mode.__exit__(None, None, None)
        self._mode = None
        return MeasuredFlops(forward=self._forward, backward=self._backward, samples=samples)

    def abandon(self) -> None:
        """Leave the mode without a result (the run ended inside the counted step)."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    def _close_phase(self) -> None:
        total = self._mode.get_total_flops()
        if self._in_backward:
            self._backward += total - self._phase_start
        else:
            self._forward += total - self._phase_start
        self._phase_start, self._in_backward = total, not self._in_backward


def flops_per_sample(measured: MeasuredFlops, model_parallel: int = 1) -> float:
    """Model FLOPs per sample from one rank's count: a rank of a model-parallel group computes
    its share of every sample of its data-parallel replica (shares taken as equal)."""
    if measured.total <= 0:
        raise ValueError("flops_formula measured: the counted training step has no FLOPs torch's FlopCounterMode "
                         "knows (no matmul, convolution or attention ran inside the step); set flops_per_sample=... "
                         "instead.")
    return measured.total * model_parallel / measured.samples


class FirstStepFlops:
    """A run's count: its first optimizer step (``start_step + 1``) counted on every rank, then
    its FLOPs per sample learned, from then on the run's."""

    def __init__(self, start_step: int) -> None:
        self._start_step = start_step
        self._counter = StepFlopCounter()

    def step_start(self, steps_done: int) -> None:
        """A micro-batch starts: the run's first one starts the count; a later one of the counted
        step starts a new forward."""
        if self._counter.counting:
            self._counter.forward_starts()
        elif steps_done == self._start_step:
            self._counter.start()

    def backward_starts(self) -> None:
        self._counter.backward_starts()

    def step_end(self, step: int, facts: RunFacts, learned: Learned, rank: int) -> bool:
        """The counted step ended: its counts and FLOPs per sample go into ``learned``. True when
        counting is over (it ended, or the step was not counted)."""
        if not self._counter.counting:
            return False
        data_parallel = facts.parallel["data"]
        counted = self._counter.stop(samples=facts.global_batch_size // data_parallel)
        learned.measured_flops = counted.to_dict()
        try:
            learned.flops_per_sample = flops_per_sample(counted, facts.num_gpus // data_parallel)
        except ValueError as error:  # known only now: the run goes on without model TFLOPS and MFU
            if rank == 0:
                log.warning("nemo-throughput: %s Model TFLOPS and MFU stay null for this run.", error)
            return True
        if rank == 0:
            log.info("nemo-throughput: measured %.4g model FLOPs per sample (forward %.4g, backward %.4g FLOPs "
                     "on this rank's %d samples of step %d)", learned.flops_per_sample, counted.forward,
                     counted.backward, counted.samples, step)
        return True

    def abandon(self) -> None:
        """The run ends inside the counted step: no count."""
        self._counter.abandon()
