"""Skipped input, settled in stream order: a skip counts (and goes to a dead-letter sink) only once the
position that passes it is reached by a trained batch.

The reader runs ahead of training (a queue, a partly filled buffer), so bad input it drops is not yet
"behind" the position a checkpoint saves.  Counting it at read time made a checkpoint count rows that a
restart from it reads again (+155..+900 rows over a few restarts).  The :class:`SkipLedger` holds each
skip with its place in the stream (record batch number, row) and hands it out with the first training
batch whose end lies past it, so the counts and dead letters travelling with a batch are exactly those
of the input before its position.

The ledger is also the one count of skipped input, in two columns: as read (``read_rows``,
``read_messages``: the rebatcher's, read-ahead included) and as passed by a trained batch (``rows``,
``messages``: what a checkpoint at that position covers; :meth:`SkipLedger.passed`).  A loop's ledger may
count into a ``parent`` too: the daemon's, over its loops and the resumed checkpoint.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from streamfit.sources._base import Position, SourceBatch

__all__ = ["Skipped", "SkipLedger", "count_skips"]


@dataclass(frozen=True, eq=False)
class Skipped:
    """Input dropped by policy: ``rows`` rows (a whole message when ``message`` is True) for ``reason``.

    ``position`` is where the dropped input starts (for a message without rows, undecodable or empty,
    the position right after it: ``source`` then names it); ``batch``/``indices`` hold its rows (all rows of
    ``batch`` when ``indices`` is None; ``batch`` is None for an undecodable message, whose bytes are in
    ``raw`` when the source kept them).

    Attributes
    ----------
    reason
        Why (``"null"``, ``"non_finite"``, ``"missing_column"``, ``"undecodable"``, ``"poison"``...).
    rows, message
        How many rows, and whether they are a whole message (or record batch).
    position, where
        The source position where the dropped input starts (above), and a readable place.
    column
        The column at fault, if one is.
    text
        The message logged for it (what was found, what was expected, where).
    batch, indices
        Its rows: ``batch``'s rows at ``indices`` (all of them when None); ``batch`` is None for an
        undecodable message.
    raw
        An undecodable message's bytes, when the source kept them.
    source
        What the source said of the message (:attr:`SourceBatch.meta <streamfit.sources.SourceBatch.meta>`).
    """

    reason: str
    rows: int
    message: bool
    position: Position
    where: str
    column: str | None
    text: str
    batch: pa.RecordBatch | None = None
    indices: np.ndarray | None = field(default=None, repr=False)
    raw: bytes | None = field(default=None, repr=False)
    #: the source's own description of the message (Kafka: partition, offset), when it gives one.
    source: Mapping[str, Any] = field(default_factory=dict)

    def row_batch(self) -> pa.RecordBatch | None:
        """The dropped rows as a record batch (a copy of the chosen rows), or None (undecodable)."""
        if self.batch is None:
            return None
        if self.indices is None:
            return self.batch
        return self.batch.take(pa.array(self.indices, pa.int64()))


def count_skips(skips: Iterable[Skipped], rows: Counter[str], messages: Counter[str]) -> None:
    """Add ``skips`` to per-reason counters of rows and of whole messages."""
    for s in skips:
        if s.rows:
            rows[s.reason] += s.rows
        if s.message:
            messages[s.reason] += 1


@dataclass
class _Entry:
    seq: int                    # record batch number in the rebatcher (stream order)
    sb: SourceBatch
    reason: str
    column: str | None
    text: str
    indices: np.ndarray | None  # sorted source rows of sb dropped for ``reason``; None = the whole batch


class SkipLedger:
    """Skips waiting for a trained batch to pass them, in stream order, and the counts of skipped input (as
    read, as passed); see the module docstring."""

    def __init__(self, parent: "SkipLedger | None" = None) -> None:
        self._entries: list[_Entry] = []
        self.parent = parent
        #: rows / whole messages dropped as they were read, by reason (read-ahead included)
        self.read_rows: Counter[str] = Counter()
        self.read_messages: Counter[str] = Counter()
        #: rows / whole messages behind the position of the last trained batch, by reason
        self.rows: Counter[str] = Counter()
        self.messages: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def pending(self) -> bool:
        """Any skip waiting? (an attribute read on the hot path)."""
        return bool(self._entries)

    def read(self, reason: str, rows: int | None, message: bool) -> None:
        """Count input dropped as it is read: ``rows`` rows (None: none counted), a whole message or not."""
        ledger: SkipLedger | None = self
        while ledger is not None:
            if rows is not None:
                ledger.read_rows[reason] += rows
            if message:
                ledger.read_messages[reason] += 1
            ledger = ledger.parent

    def passed(self, skips: Iterable[Skipped]) -> None:
        """Count skips a trained batch passed (what :meth:`take_until` handed out with it)."""
        skips = tuple(skips)
        ledger: SkipLedger | None = self
        while ledger is not None:
            count_skips(skips, ledger.rows, ledger.messages)
            ledger = ledger.parent

    def restore(self, rows: Mapping[str, int], messages: Mapping[str, int]) -> None:
        """The passed counts of a checkpoint (a resume, a rollback)."""
        self.rows, self.messages = Counter(rows), Counter(messages)

    def add_message(self, seq: int, sb: SourceBatch, reason: str, column: str | None, text: str) -> None:
        self._entries.append(_Entry(seq, sb, reason, column, text, None))

    def add_rows(self, seq: int, sb: SourceBatch, reason: str, column: str | None, text: str,
                 indices: np.ndarray) -> None:
        self._entries.append(_Entry(seq, sb, reason, column, text, np.asarray(indices, dtype=np.int64)))

    def take_until(self, seq: int, row: int) -> tuple[Skipped, ...]:
        """The skips before row ``row`` of record batch ``seq`` (they leave the ledger)."""
        out: list[Skipped] = []
        kept: list[_Entry] = []
        for e in self._entries:
            if e.seq < seq:
                out.append(_skipped_of(e, e.indices))
            elif e.seq == seq and e.indices is not None:
                cut = int(np.searchsorted(e.indices, row))
                if cut:
                    out.append(_skipped_of(e, e.indices[:cut]))
                if cut < len(e.indices):
                    e.indices = e.indices[cut:]
                    kept.append(e)
            else:
                kept.append(e)
        self._entries = kept
        return tuple(out)

    def take_all(self) -> tuple[Skipped, ...]:
        out = tuple(_skipped_of(e, e.indices) for e in self._entries)
        self._entries = []
        return out

    def clear(self) -> None:
        self._entries = []


def _skipped_of(e: _Entry, indices: np.ndarray | None) -> Skipped:
    """The :class:`Skipped` of ledger entry ``e``'s rows ``indices`` (None: its whole message)."""
    sb = e.sb
    if indices is None:
        return Skipped(e.reason, sb.num_rows, True, sb.position_at(0), sb.where, e.column, e.text,
                       batch=sb.batch, raw=sb.raw, source=dict(sb.meta))
    first = int(indices[0])
    where = f"{sb.where}, row {first} of the record batch" if sb.where else f"row {first} of the record batch"
    return Skipped(e.reason, len(indices), False, sb.position_at(first), where, e.column, e.text,
                   batch=sb.batch, indices=indices, source=dict(sb.meta))
