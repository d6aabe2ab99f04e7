"""What the coordinator and the learners hand each other through Ray (typed, host copies of arrays)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from streamfit.sources import Position

__all__ = ["LearnerState", "StartFrom", "RoundReport"]


@dataclass(frozen=True)
class LearnerState:
    """An estimator's state: the JSON tree of ``state_dict`` (arrays as references) and the arrays it names."""

    cls: str
    tree: Any
    arrays: Mapping[str, np.ndarray]


ARRAY_REF = "__array__"  # a state tree names an array as {ARRAY_REF: name}


def array_refs(tree: Any) -> list[str]:
    """The names of the arrays a state tree refers to, in tree order."""
    if isinstance(tree, dict):
        if set(tree) == {ARRAY_REF}:
            return [tree[ARRAY_REF]]
        return [r for v in tree.values() for r in array_refs(v)]
    if isinstance(tree, list):
        return [r for v in tree for r in array_refs(v)]
    return []


@dataclass(frozen=True)
class StartFrom:
    """Where a learner (re)starts: its state, its source position and the counters that go with them."""

    state: LearnerState | None = None
    position: Position | None = None
    rows: int = 0
    batches: int = 0
    evaluated_rows: int = 0
    loss_sum: float = 0.0
    skipped_rows: Mapping[str, int] = field(default_factory=dict)
    skipped_messages: Mapping[str, int] = field(default_factory=dict)
    rollbacks: int = 0
    poison: Mapping[str, Any] | None = None       # the learner's poison state (strikes, bisections, quarantines)
    dead_letter: Mapping[str, Any] | None = None  # its dead-letter sink's state


@dataclass(frozen=True)
class RoundReport:
    """A learner at a synchronization barrier (or at the end of its share).

    ``synced`` holds the arrays to mix (``None`` when the learner trained nothing this round); ``state`` the
    learner's whole state, sent only when the coordinator asked for it (a checkpoint round).
    """

    learner: int
    round: int
    rows: int                 # trained rows, since the job started (resumes included)
    batches: int
    round_rows: int           # trained in this round
    position: Position | None
    synced: Mapping[str, np.ndarray] | None
    state: LearnerState | None
    ended: bool
    evaluated_rows: int
    loss_sum: float           # progressive loss summed over evaluated rows
    skipped_rows: Mapping[str, int]
    train_seconds: float      # wall time of the round on this learner, barrier wait excluded
    skipped_messages: Mapping[str, int] = field(default_factory=dict)
    rollbacks: int = 0        # divergence rollbacks of this learner, since the job started
    poison: Mapping[str, Any] | None = None   # its poison state (with ``state``: a checkpoint round)
    quarantined_rows: list[dict[str, Any]] = field(default_factory=list)
    lr_scale: float = 1.0
    dead_letter: Mapping[str, Any] | None = None  # its sink's state, synced (a checkpoint round)
    capped: bool = False      # it trained its whole row quota (``max_rows``): waiting, its share not ended

    @property
    def synced_bytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.synced or {}).values())
