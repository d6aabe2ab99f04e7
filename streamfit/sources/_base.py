"""The one interface every source implements: an async iterator of record batches with positions.

A *position* is a small JSON-serializable mapping that says where the stream can be restarted so that
every row already consumed is skipped and no row is lost (Parquet: file + row; Kafka: per partition the
message offset + row inside the message).  Checkpoints store positions; ``Source.seek`` restarts there.
"""

from __future__ import annotations

import abc
import json
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pyarrow as pa

from streamfit.exceptions import BadInputError

if TYPE_CHECKING:
    from streamfit.sources._commits import CommitLedger, HandoverSettler

__all__ = ["Position", "SourceBatch", "Source", "Unit"]

#: A JSON-serializable mapping (str keys; values str/int/float/bool/None, lists or nested mappings).
Position = Mapping[str, Any]


@dataclass(frozen=True)
class Unit:
    """One message of a source batch: rows ``start:stop`` of it, named by a ``key`` that stays the same when
    the message is read again (after a restart or a rollback).  The unit of poison-message quarantine."""

    key: str
    start: int
    stop: int
    where: str = ""


@dataclass(frozen=True)
class SourceBatch:
    """One record batch read from a source, or one message that could not be decoded.

    ``position_at(r)`` is the position meaning "the first ``r`` rows of this batch are consumed"
    (``position_at(0)`` = before the batch, ``position_at(batch.num_rows)`` = after it), as a full
    snapshot for the whole source (all partitions), not just this batch's partition.
    When ``error`` is set, ``batch`` is ``None``: the bytes at that position could not be decoded;
    ``position_at(0)`` is the position after the bad message (it is skipped as a whole).

    Parameters
    ----------
    batch
        The rows read (an Arrow record batch), or None for a message that could not be decoded.
    position_at
        ``r`` -> the source's position once the first ``r`` rows of this batch are consumed.
    error
        Why the message could not be decoded (then ``batch`` is None), else None.
    where
        A readable place for messages and dead letters (``"part-3.parquet row 4096"``).
    meta
        What the source knows of the message besides its rows (Kafka: partition, offset, key, timestamp).
    raw
        The undecodable message's bytes, for a dead-letter sink, where the source has them.
    units_fn
        The messages the batch holds (Kafka concatenates small ones); None: the batch is one message.
    """

    batch: pa.RecordBatch | None
    position_at: Callable[[int], Position]
    error: BadInputError | None = None
    #: human-readable place for messages ("part-3.parquet row 4096", "partition 1 offset 17").
    where: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: the message's bytes when it could not be decoded (for a dead-letter sink), if the source has them.
    raw: bytes | None = None
    #: the messages this batch holds (Kafka concatenates small ones); ``None``: the batch is one message.
    units_fn: Callable[[], tuple[Unit, ...]] | None = None

    @property
    def num_rows(self) -> int:
        return 0 if self.batch is None else self.batch.num_rows

    def units(self) -> tuple[Unit, ...]:
        """The messages of this batch; by default one, named by the position after it (stable across
        re-reads: a source restarted inside a message still ends it at the same position)."""
        if self.units_fn is not None:
            return self.units_fn()
        key = json.dumps(self.position_at(self.num_rows), sort_keys=True, default=str)
        return (Unit(key, 0, self.num_rows, self.where),)

    def sub(self, unit: Unit) -> "SourceBatch":
        """The rows of one of its units, as a batch of their own (positions unchanged).

        Parameters
        ----------
        unit
            One of :meth:`units`.
        """
        assert self.batch is not None
        start, outer = unit.start, self.position_at
        return SourceBatch(self.batch.slice(start, unit.stop - start), lambda r: outer(start + r),
                           where=unit.where or self.where, meta={**self.meta, "message": unit.key},
                           units_fn=lambda: (Unit(unit.key, 0, unit.stop - start, unit.where),))


class Source(abc.ABC):
    """Async iterator of :class:`SourceBatch`; usable with ``async with``; ``aclose()`` is idempotent.

    Sources validate their arguments in ``__init__`` and open lazily on the first ``__anext__``.
    """

    _closed: bool = False
    _opened: bool = False

    def __aiter__(self) -> "Source":
        return self

    @abc.abstractmethod
    async def __anext__(self) -> SourceBatch:
        """Next batch; ``StopAsyncIteration`` at the end of a finite source."""

    def seek(self, position: Position) -> None:
        """Restart at ``position`` (from a checkpoint). Must be called before iteration starts.

        Parameters
        ----------
        position
            A position this source gave (``SourceBatch.position_at``, a checkpoint's), in its own form.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot seek")

    async def commit(self, position: Position) -> None:
        """Tell the source that everything before ``position`` is durably trained (Kafka commits offsets).

        Sources without an external notion of progress ignore it.

        Parameters
        ----------
        position
            The position up to which training is durable (a checkpoint's), in this source's form.
        """

    def attach_commit_ledger(self, ledger: "CommitLedger") -> None:
        """Note this source's group commits in ``ledger`` and consult it on assignment, so that a committed
        offset of this learner's own never skips rows its resumed model lacks (Kafka).  Others ignore it.

        Parameters
        ----------
        ledger
            A commit ledger (``record(commit)``, ``own_offsets(topic, group, partition)``): the daemon's
            :class:`~streamfit.daemon.commit_ledger.RunCommitLedger`, kept beside its checkpoints.
        """

    def attach_handover_settler(self, settler: "HandoverSettler") -> None:
        """Before a rebalance takes a partition away, let ``settler`` train, checkpoint and commit what was read
        of it, so that its next owner starts after those rows (Kafka).  Others ignore it.

        Parameters
        ----------
        settler
            A callable the source gives the revoked partitions to; it returns once their rows are settled.
        """

    async def aclose(self) -> None:
        self._closed = True

    async def __aenter__(self) -> "Source":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _mark_opened(self) -> None:
        """Called by subclasses when iteration starts: a closed source cannot be iterated again."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        self._opened = True

    def _check_seek_allowed(self) -> None:
        """Seeking after iteration started would silently drop or repeat rows: refuse it."""
        if self._opened or self._closed:
            raise RuntimeError(f"{type(self).__name__}.seek() must be called before iteration starts")

    def __del__(self) -> None:  # pragma: no cover - depends on GC timing
        if self._opened and not self._closed:
            warnings.warn(f"{type(self).__name__} was not closed; use 'async with' or aclose()",
                          ResourceWarning, stacklevel=1)


def position_int(position: Position, key: str, owner: str, expected: str) -> int:
    """Read a non-negative int from a position, with an error naming the expected format."""
    value = position.get(key) if isinstance(position, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}: invalid position {position!r}, expected {expected}")
    return value
