"""Divergence guard: a non-finite step is skipped and counted; a run that keeps diverging stops.

An optimizer step whose loss or gradient norm is NaN/inf would poison every parameter it
touches (Adam's moments keep the NaN forever), so it is skipped instead, and counted
(``actor/skipped_steps``, ``sft/skipped_steps``). A few skipped steps are noise (a rare sample
with a huge ratio); ``max_in_row`` of them in a row means the run has diverged, and it stops
with :class:`TrainingDiverged` naming where. Parameters that became non-finite anyway (a finite
gradient times an enormous learning rate) can never recover: that stops the run at once.
Nothing non-finite is ever saved: :func:`assert_finite` guards every write of a policy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentr1.errors import TrainingStopped


class TrainingDiverged(TrainingStopped, RuntimeError):
    """Training produced non-finite numbers it cannot recover from; nothing was saved from it."""


@dataclass
class StepGuard:
    """Counts skipped (non-finite) optimizer steps; raises after ``max_in_row`` in a row."""

    max_in_row: int
    where: str = ""
    """Where the caller is (``"PPO iteration 7"``), for the error message."""
    skipped: int = 0
    """Steps skipped since the counter was last read (:meth:`take_skipped`)."""
    in_row: int = 0

    def ok(self, loss: float, grad_norm: float | None = None) -> bool:
        """True when the step may be taken; False (and counted) when the loss or gradient norm is
        not finite. Raises :class:`TrainingDiverged` on the ``max_in_row``-th such step in a row."""
        finite = math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm))
        if finite:
            self.in_row = 0
            return True
        self.skipped += 1
        self.in_row += 1
        if self.in_row >= self.max_in_row:
            raise TrainingDiverged(
                f"{self.where}: {self.in_row} optimizer steps in a row had a non-finite loss or gradient norm "
                f"(last: loss {loss}, grad norm {grad_norm}); the run stopped and kept its last checkpoint. "
                "Lower the learning rate or check the reward weights.")
        return False

    def take_skipped(self) -> int:
        """Skipped steps since the last call (the per-iteration metric)."""
        n, self.skipped = self.skipped, 0
        return n


def first_nonfinite(model: torch.nn.Module, trainable_only: bool = False) -> str | None:
    """The name of the first parameter or buffer holding NaN/inf, None when all are finite
    (``trainable_only``: the parameters that train, no buffer)."""
    tensors = [(n, p) for n, p in model.named_parameters() if p.requires_grad] if trainable_only else \
        [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def assert_finite(model: torch.nn.Module, what: str, trainable_only: bool = False) -> None:
    """Raise :class:`TrainingDiverged` when ``model`` holds a non-finite number: what is about to
    be written (``what``) would be a NaN policy."""
    bad = first_nonfinite(model, trainable_only)
    if bad is not None:
        raise TrainingDiverged(f"{what}: parameter {bad!r} is not finite (NaN/inf); refusing to write or use it")


PROBE_ROWS = 4
"""Sequences an updated model is run on to check that its outputs are finite (a few suffice:
absurd but finite weights, say 1e30 after an enormous step, overflow on any input)."""


@torch.no_grad()
def assert_finite_outputs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          what: str, trunk: torch.Tensor | None = None) -> None:
    """Raise :class:`TrainingDiverged` unless the actor-critic ``model`` gives finite logits and
    values on the first :data:`PROBE_ROWS` rows of ``input_ids`` (B, L), cut to their longest:
    finite parameters can still make a NaN policy, and it must not reach a checkpoint or the
    registry. ``trunk``: the frozen layers' output for the batch (``Scored.trunk``), so that only
    the layers training changed run. At the caller's precision (PPO: its autocast, as the next
    scoring runs). Of the parameters only those that train are scanned: the frozen ones are the
    loaded base's, which nothing changes (on SmolLM2 the scan of all 135M took 0.4 s)."""
    assert_finite(model, what, trainable_only=True)
    n = int(attention_mask[:PROBE_ROWS].sum(dim=1).max())
    ids, attention_mask = input_ids[:PROBE_ROWS, :n], attention_mask[:PROBE_ROWS, :n]
    extra = {} if trunk is None else {"trunk": trunk[:PROBE_ROWS, :n]}
    was_training = model.training
    model.eval()
    logits, values = model(input_ids=ids, attention_mask=attention_mask, **extra)
    model.train(was_training)
    keep = attention_mask.bool()
    if not (bool(torch.isfinite(logits[keep]).all()) and bool(torch.isfinite(values[keep]).all())):
        raise TrainingDiverged(f"{what}: the model's parameters are finite but its outputs are not (NaN/inf "
                               "logits or values): the run has diverged")
