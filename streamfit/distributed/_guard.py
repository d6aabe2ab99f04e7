"""A learner's divergence guard: the single learner's guard, rollback decision and poison quarantine, per learner.

A learner whose batch diverges (non-finite loss, a refused step, a loss far above its running mean) rolls
back to its state at the last round (the mixed state it was given, its position there) and trains its share
again from there with the lowered learning-rate scale; a message that makes it roll back ``max_rollbacks``
times is bisected and its poison rows quarantined (:mod:`streamfit.daemon.poison`), exactly as one learner
does.  The other learners go on: a rollback happens inside a round, before the learner reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from streamfit._stream.batching import Quarantine
from streamfit._stream.events import BatchEvent
from streamfit.daemon.guard import DivergenceGuard
from streamfit.daemon.health import log_event
from streamfit.daemon.poison import PoisonTracker, Rollback
from streamfit.sources import Position

__all__ = ["LearnerGuard", "RollbackPoint"]


@dataclass
class RollbackPoint:
    """A learner's state at the last round, what a divergence goes back to (``tree`` None: not fitted yet)."""

    tree: Any
    arrays: Mapping[str, np.ndarray]
    position: Position | None
    rows: int
    batches: int
    evaluated_rows: int
    loss_sum: float
    skipped_rows: Mapping[str, int] = field(default_factory=dict)
    skipped_messages: Mapping[str, int] = field(default_factory=dict)
    round_rows: int = 0     # trained in the round at this point (0 at a barrier)
    round_batches: int = 0
    dead_letter: int = 0    # the dead-letter sink's mark


class LearnerGuard:
    """The guard of one learner: checks each batch, decides each rollback, holds the quarantine its loop reads."""

    def __init__(self, guard: DivergenceGuard, on_bad: str, learner: int) -> None:
        self.guard = guard
        self.on_bad = on_bad
        self.learner = learner
        self.quarantine = Quarantine()
        self.poison = PoisonTracker(guard.max_rollbacks, self.quarantine.rows, guard.poison_rows)
        self.rollbacks = 0
        self.reason: str | None = None
        self._units: list[str] = []
        self._good_run = 0
        self._refused_seen = 0

    def load(self, state: Mapping[str, Any] | None, rollbacks: int) -> None:
        """Restore the poison state a global checkpoint holds for this learner."""
        self.rollbacks = rollbacks
        self.quarantine.skip = self.poison.load(state or {})
        self.quarantine.isolate = set(self.poison.strikes) - self.quarantine.skip

    def state(self) -> dict[str, Any]:
        return self.poison.state(self.quarantine.skip)

    def loop_started(self, trainer: Any) -> None:
        self.reason = None
        self._refused_seen = 0 if trainer is None else trainer.n_skipped  # the loss's running mean is kept

    def check(self, event: BatchEvent, trainer: Any) -> bool:
        """True when this batch diverged (then :attr:`reason` says why); else the lr scale may recover."""
        refused = 0
        if trainer is not None:
            refused, self._refused_seen = trainer.n_skipped - self._refused_seen, trainer.n_skipped
        reason = self.guard.check(event.loss, refused)
        if reason is not None:
            self.reason = reason
            self._units = self.poison.diverged(event.spans)
            return True
        self.poison.in_a_row = 0
        self._good_run += 1
        if trainer is not None and self._good_run >= self.guard.recover_after and trainer.lr_scale < 1:
            self._good_run = 0
            trainer.lr_scale = min(1.0, trainer.lr_scale * self.guard.recover_factor)
        return False

    def roll_back(self, lr_scale: float, point: RollbackPoint) -> Rollback:
        """Decide the rollback of the batch :meth:`check` flagged (raises when the learner cannot go on)."""
        self.rollbacks += 1
        decision = self.poison.rollback(self.guard, self.quarantine, self._units, lr_scale, self.on_bad,
                                        str(self.reason), self.rollbacks)
        self._good_run = 0
        what = (f"quarantined {', '.join(decision.names)}" if decision.names else
                "bisecting a poison message" if decision.verdict.bisected else
                f"learning-rate scale x{decision.scale:g}")
        log_event("quarantine" if decision.names else "rollback",
                  f"learner {self.learner}: divergence ({self.reason}); rolled back to its state at the last round "
                  f"(row {point.rows}), {what}", learner=self.learner, reason=self.reason, rows=point.rows,
                  lr_scale=decision.scale, messages=decision.names, rollbacks=self.rollbacks)
        return decision
