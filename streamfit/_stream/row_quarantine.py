"""Row-level quarantine of a poison message: its rows cut into pieces trained apart, its poison rows dropped.

A message that made training diverge again and again is bisected (:mod:`streamfit.daemon.poison` decides
where): the rebatcher trains each piece of it in batches of its own, so that a divergence names one piece,
and drops the rows found to be poison (skipped as ``poison``, one row each).  Rows are named by their
distance from the message's end (``tail``: 0 is its last row): a source restarted inside a message still
ends it at the same place, so the name stays the same however the message is read again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from streamfit.sources._base import SourceBatch, Unit

__all__ = ["MessageCuts", "Piece", "pieces", "tail_range"]


@dataclass
class MessageCuts:
    """One message under bisection: ``cuts`` (a batch boundary ``c`` rows before the message's end) and
    ``drop`` (the tails of its quarantined rows)."""

    cuts: set[int] = field(default_factory=set)
    drop: set[int] = field(default_factory=set)

    def to_json(self) -> dict[str, list[int]]:
        return {"cuts": sorted(self.cuts), "drop": sorted(self.drop)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "MessageCuts":
        return cls({int(c) for c in data.get("cuts") or ()}, {int(t) for t in data.get("drop") or ()})


@dataclass(frozen=True)
class Piece:
    """Rows of a message as a batch of their own, from row ``start`` of the message's batch; ``dropped``: one
    quarantined row."""

    sb: SourceBatch
    start: int
    dropped: bool


def pieces(sb: SourceBatch, unit: Unit, cuts: MessageCuts) -> list[Piece]:
    """Split ``sb`` (one message's rows, ``sb.sub(unit)``: they end where the message ends) at ``cuts``; each
    dropped row a piece of its own.  Each piece's unit keeps the message's coordinates (its rows counted from
    the piece's first, the message's end at the same place), so a span of it names the same tails."""
    n = sb.num_rows
    bounds = {0, n}
    bounds.update(n - c for c in cuts.cuts if 0 < n - c < n)
    for t in cuts.drop:
        i = n - 1 - t
        if 0 <= i < n:
            bounds.update((i, i + 1))
    edges = sorted(bounds)
    out = []
    for a, b in zip(edges, edges[1:]):
        piece = sb.sub(Unit(unit.key, a, b, unit.where))
        piece = replace(piece, units_fn=_units_fn(Unit(unit.key, -a, n - a, unit.where)))
        out.append(Piece(piece, a, b - a == 1 and n - 1 - a in cuts.drop))
    return out


def _units_fn(unit: Unit) -> Any:
    return lambda: (unit,)


def tail_range(unit: Unit, start: int, stop: int) -> tuple[int, int]:
    """Rows ``start:stop`` of a batch holding ``unit`` (clipped to it), as tails ``[lo, hi)`` of its message."""
    a, b = max(start, unit.start), min(stop, unit.stop)
    return unit.stop - b, unit.stop - a
