"""What a source that commits to a consumer group needs from the run: a ledger of its own commits, and a settler
that trains and commits a partition before a rebalance takes it away.

A committed offset ahead of a resumed position says nothing of who committed it (the broker here, tansu,
drops commit metadata): another member (which trained the rows in between) or this learner from a newer
checkpoint since lost (then the model lacks them).  A source (Kafka) notes each commit in a ledger before
sending it and asks the ledger at assignment time; the run owns the ledger (durable, beside its checkpoints)
and scopes it to the checkpoint it resumed from.

On a revoke the source hands the run a :class:`Handover` (the partitions and where the source has returned
rows of each) and waits, serving the commits the run makes, until the run has trained those rows, written a
checkpoint of them and committed it (:attr:`Handover.done`), or the handover's deadline passes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class GroupCommit:
    """Offsets committed to consumer group ``group`` on ``topic``: partition -> first offset not consumed.

    >>> GroupCommit("t", "g", {1: 7, 0: 3}).offsets[0]
    3
    """

    topic: str
    group: str
    offsets: Mapping[int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", MappingProxyType(dict(sorted(self.offsets.items()))))


@runtime_checkable
class CommitLedger(Protocol):
    """This learner's own commits, as a source sees them (called from the source's consumer thread)."""

    def record(self, commit: GroupCommit) -> None:
        """Durably note ``commit`` before it is sent (raise if that fails: then it is not sent)."""
        ...

    def own_offsets(self, topic: str, group: str, partition: int) -> frozenset[int]:
        """The offsets of ``partition`` this learner committed since the point it resumed from."""
        ...


@dataclass(frozen=True)
class Handover:
    """Partitions of ``topic`` a rebalance revokes: ``returned`` maps each to ``(offset, row)``, where the rows
    the source returned of it end (the run must train up to there, checkpoint and commit before ``deadline``, a
    ``time.monotonic()`` instant); the run sets ``committed`` when the group has accepted the commit of those rows,
    then ``done`` (``done`` alone: it has given up)."""

    topic: str
    returned: Mapping[int, tuple[int, int]]
    deadline: float
    done: threading.Event = field(default_factory=threading.Event, compare=False)
    committed: threading.Event = field(default_factory=threading.Event, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "returned", MappingProxyType(dict(sorted(self.returned.items()))))


@runtime_checkable
class HandoverSettler(Protocol):
    """The run's side of a handover: called in the source's consumer thread, returns at once."""

    def __call__(self, handover: Handover) -> None:
        """Start settling ``handover`` (train, checkpoint, commit its partitions); set ``handover.committed`` once
        committed, and ``handover.done`` when over."""
        ...
