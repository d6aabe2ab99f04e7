"""Divergence guard: notice a loss that explodes or turns non-finite, so the run can roll back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DivergenceGuard", "guard_of"]


def guard_of(options: Any) -> "DivergenceGuard | None":
    """The guard a :class:`~streamfit.StreamOptions` describes (``guard``, ``guard_factor``, ``guard_lr_factor``,
    ``poison_after``, ``min_lr_scale``, ``lr_recover_after``), or None when ``guard`` is off."""
    if not options.guard:
        return None
    return DivergenceGuard(options.guard_factor, lr_factor=options.guard_lr_factor,
                           max_rollbacks=options.poison_after, min_lr_scale=options.min_lr_scale,
                           recover_after=options.lr_recover_after)


@dataclass
class DivergenceGuard:
    """Flags a batch whose loss is non-finite, whose step was refused, or that exceeds ``factor`` times
    the running mean of the loss (after ``warmup`` batches).

    On a rollback the run multiplies the learning-rate scale by ``lr_factor``; after ``recover_after``
    good batches in a row it multiplies it by ``recover_factor`` again, back up to 1.  A message (source
    position) that made training roll back ``max_rollbacks`` times is a *poison message*: the scale goes
    back to what it was before that message's first rollback and the rows of it that make training diverge
    are found by bisection and quarantined (skipped as ``poison``, sent to the dead-letter sink; see
    :mod:`streamfit.daemon.poison`); a message with more than ``poison_rows`` of them (``0``: at once) is
    quarantined whole.  The run stops with ``DivergenceError`` when the scale
    would fall below ``min_lr_scale``, or after ``max_poison_in_a_row`` quarantines with no good batch in
    between (then the model diverges, not the data).

    Parameters
    ----------
    factor
        A batch's loss above ``factor`` times the running mean is a divergence.
    warmup
        Batches before that test applies (the running mean settles first).
    lr_factor, recover_after, recover_factor
        The learning-rate scale's change on a rollback, the good batches in a row before it recovers, and its
        change then.
    max_rollbacks
        Rollbacks one message may cause before it is a poison message.
    decay
        The weight of the past in the running mean of the loss (per batch).
    min_lr_scale
        Stop with ``DivergenceError`` when a rollback would take the scale below this.
    max_poison_in_a_row, poison_rows
        Quarantines with no good batch between them before the run stops, and the most poison rows a message
        may have before it is quarantined whole.
    """

    factor: float = 100.0
    warmup: int = 20
    lr_factor: float = 0.1
    max_rollbacks: int = 3
    decay: float = 0.98  # weight of the past in the running mean
    min_lr_scale: float = 1e-4
    recover_after: int = 100
    recover_factor: float = 2.0
    max_poison_in_a_row: int = 3
    poison_rows: int = 64

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"factor must be > 1, got {self.factor!r}")
        if not 0 < self.lr_factor < 1:
            raise ValueError(f"lr_factor must be in (0, 1), got {self.lr_factor!r}")
        if self.max_rollbacks < 1:
            raise ValueError(f"max_rollbacks must be >= 1, got {self.max_rollbacks!r}")
        if not 0 < self.min_lr_scale < 1:
            raise ValueError(f"min_lr_scale must be in (0, 1), got {self.min_lr_scale!r}")
        if self.recover_after < 1:
            raise ValueError(f"recover_after must be >= 1, got {self.recover_after!r}")
        if not self.recover_factor > 1:
            raise ValueError(f"recover_factor must be > 1, got {self.recover_factor!r}")
        if self.poison_rows < 0:
            raise ValueError(f"poison_rows must be >= 0, got {self.poison_rows!r}")
        if self.max_poison_in_a_row < 1:
            raise ValueError(f"max_poison_in_a_row must be >= 1, got {self.max_poison_in_a_row!r}")
        self.reset()

    def reset(self) -> None:
        self.mean: float | None = None
        self.seen = 0

    def check(self, loss: float | None, refused_steps: int = 0) -> str | None:
        """A reason string when this batch diverged, else ``None`` (and the running mean moves on).

        Parameters
        ----------
        loss
            The batch's mean training loss, or None (no loss: nothing to judge).
        refused_steps
            Steps of the batch the trainer refused (non-finite).
        """
        if refused_steps:
            return f"{refused_steps} step(s) refused: non-finite loss, gradient or weight"
        if loss is None:
            return None
        if not math.isfinite(loss):
            return f"non-finite loss {loss}"
        if self.mean is not None and self.seen >= self.warmup and loss > self.factor * max(self.mean, 1e-12):
            return f"loss {loss:.4g} exceeds {self.factor:g} x its running mean {self.mean:.4g}"
        self.mean = loss if self.mean is None else self.decay * self.mean + (1 - self.decay) * loss
        self.seen += 1
        return None
