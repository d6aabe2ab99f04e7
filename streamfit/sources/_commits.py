"""What a source needs to tell its own group commits from another member's: a typed ledger interface.

The broker drops commit metadata, so a committed offset ahead of a resumed position says nothing of who
committed it: another member (which trained the rows in between) or this learner from a newer checkpoint
since lost (then the model lacks them).  A source that commits to a group (Kafka) notes each commit in a
ledger before sending it and asks the ledger at assignment time; the run owns the ledger (durable, beside
its checkpoints) and scopes it to the checkpoint it resumed from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
