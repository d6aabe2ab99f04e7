"""Poison input: the messages that made training roll back, and the rows of them found to be poison.

A message (source unit) that made training roll back ``max_rollbacks`` times is *poison*.  Its rows are
then bisected from the rollback point: the rows of it in the batch that diverged are cut in two halves,
trained apart on the replay; a half that diverges again is cut again, until one row is left, which is
quarantined (dropped as ``poison``, sent to the dead-letter sink).  Every other row of the message is
trained, exactly once (a replay restores the state before it).  A row costs about ``log2(batch rows)``
extra rollbacks; a message with more than ``max_rows`` poison rows (its data, not a few cells, is broken)
is quarantined whole after that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from streamfit._stream.row_quarantine import MessageCuts, tail_range
from streamfit.exceptions import DivergenceError
from streamfit.sources._base import Position

if TYPE_CHECKING:
    from streamfit._stream.batching import Quarantine
    from streamfit.daemon.guard import DivergenceGuard

__all__ = ["PoisonTracker", "Verdict", "QuarantinedRow", "Rollback"]

#: messages whose rollbacks are remembered (the oldest are long behind the position)
_KEEP = 4096


@dataclass(frozen=True)
class QuarantinedRow:
    """A poison row: its message, its tail (rows before the message's end) and its source position."""

    message: str
    tail: int
    position: Position | None

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message, "row": self.position, "from_end": self.tail}


@dataclass
class Verdict:
    """What a rollback found: messages that became poison now, messages cut further, rows quarantined,
    messages quarantined whole."""

    poison: list[str] = field(default_factory=list)
    bisected: list[str] = field(default_factory=list)
    rows: list[QuarantinedRow] = field(default_factory=list)
    whole: list[str] = field(default_factory=list)

    @property
    def quarantines(self) -> bool:
        """Some input was set aside for good (a row or a message)."""
        return bool(self.rows or self.whole)

    @property
    def finds(self) -> bool:
        """The rollback is explained by poison input: no learning-rate cut for it."""
        return bool(self.poison or self.bisected or self.rows or self.whole)


@dataclass(frozen=True)
class Rollback:
    """What a rollback does: train on at learning-rate ``scale``; ``names`` the input it quarantined."""

    verdict: Verdict
    scale: float
    names: list[str]


class PoisonTracker:
    """Rollbacks per message, the poison messages' bisection (``cuts``: what the rebatcher reads) and the
    quarantined rows and messages; its state goes in every checkpoint."""

    def __init__(self, max_rollbacks: int, cuts: dict[str, MessageCuts], max_rows: int = 64) -> None:
        self.max_rollbacks = max_rollbacks
        self.max_rows = max_rows
        self.strikes: dict[str, int] = {}
        self.scale_before: dict[str, float] = {}
        #: poison messages under bisection (the rebatcher's quarantine reads the same dict)
        self.cuts = cuts
        self.rows: dict[tuple[str, int], QuarantinedRow] = {}
        #: the diverged batch's rows by message: tails [lo, hi) and the position of its first row
        self._diverged: dict[str, tuple[int, int, Position | None]] = {}
        #: quarantines with no good batch in between (the trainer resets it after a good batch)
        self.in_a_row = 0

    def diverged(self, spans: Iterable[Any]) -> list[str]:
        """Note the rows of the batch that diverged (its spans), by message; the messages' keys."""
        rows: dict[str, tuple[int, int, Position | None]] = {}
        for span in spans:
            for unit in span.units():
                lo, hi = tail_range(unit, span.start, span.stop)
                if unit.key in rows:
                    plo, phi, pos = rows[unit.key]
                    lo, hi = min(lo, plo), max(hi, phi)
                    if hi > phi:
                        pos = span.sb.position_at(max(span.start, unit.start))
                else:
                    pos = span.sb.position_at(max(span.start, unit.start))
                rows[unit.key] = (lo, hi, pos)
        self._diverged = rows
        return list(rows)

    def strike(self, scale: float) -> Verdict:
        """Count this rollback against each message of the diverged batch: a message reaching
        ``max_rollbacks`` becomes poison, and a poison one is bisected further (or a row of it quarantined)."""
        verdict = Verdict()
        for key, (lo, hi, position) in self._diverged.items():
            if key not in self.strikes:
                self.scale_before[key] = scale
            self.strikes[key] = self.strikes.get(key, 0) + 1
            if self.strikes[key] < self.max_rollbacks:
                continue
            if key not in self.cuts:
                verdict.poison.append(key)
                if self.max_rows == 0:  # no bisection: the message is quarantined whole
                    verdict.whole.append(key)
                    continue
                self.cuts[key] = MessageCuts()
            cuts = self.cuts[key]
            if hi - lo <= 1 and hi > lo:
                cuts.drop.add(lo)
                row = QuarantinedRow(key, lo, position)
                self.rows[(key, lo)] = row
                verdict.rows.append(row)
                if len(cuts.drop) > self.max_rows:
                    verdict.whole.append(key)
            elif hi > lo:
                cuts.cuts.update((lo, (lo + hi) // 2, hi))
                verdict.bisected.append(key)
            else:  # no rows of it in the batch (an empty message): nothing to cut
                verdict.whole.append(key)
        for key in verdict.whole:
            self.cuts.pop(key, None)
            for k in [k for k in self.rows if k[0] == key]:
                del self.rows[k]
        if len(self.strikes) > _KEEP:
            for key in list(self.strikes)[:-_KEEP // 4]:
                del self.strikes[key]
                self.scale_before.pop(key, None)
        return verdict

    def rollback(self, guard: "DivergenceGuard", quarantine: "Quarantine", units: list[str], lr_scale: float,
                 on_bad: str, reason: str, rollbacks: int) -> Rollback:
        """Decide a rollback after a divergence (``units``: the diverged batch's messages, as :meth:`diverged`
        named them): the learning-rate scale to go on with, what the rebatcher now trains apart, cuts or
        drops; :class:`DivergenceError` when the run cannot go on (see :class:`DivergenceGuard`)."""
        scale = lr_scale * guard.lr_factor
        verdict = self.strike(lr_scale)
        quarantine.isolate.update(units)  # trained apart from now on: a divergence names it alone
        quarantine.isolate.intersection_update(self.strikes)  # forgotten ones: long behind the position
        names = verdict.whole + [f"row {json.dumps(r.position, sort_keys=True)} of message {r.message}"
                                 for r in verdict.rows]
        if verdict.poison and on_bad == "raise":
            raise DivergenceError(f"poison message {', '.join(verdict.poison)}: training on it diverged "
                                  f"{guard.max_rollbacks} times ({reason}); with on_bad='skip' its poison rows "
                                  "would be quarantined")
        if verdict.quarantines:
            self.in_a_row += 1
            if self.in_a_row > guard.max_poison_in_a_row:
                raise DivergenceError(f"{self.in_a_row} rows or messages in a row made training diverge "
                                      f"{guard.max_rollbacks} times each ({reason}; the last: {names[-1]}): the "
                                      "model diverges, not the data; lower the learning rate")
        if verdict.finds:  # poison input, not the learning rate: the scale before the message's first rollback
            scale = min((self.scale_before.get(k, 1.0) for k in verdict.poison), default=lr_scale)
            quarantine.skip.update(verdict.whole)
            quarantine.isolate.difference_update(verdict.whole)
        elif scale < guard.min_lr_scale:
            raise DivergenceError(f"training diverged ({reason}) after {rollbacks} rollback(s): the "
                                  f"learning-rate scale would fall to {scale:g}, below the floor "
                                  f"{guard.min_lr_scale:g}; lower the learning rate or check the data")
        return Rollback(verdict, scale, names)

    def message_rows(self) -> list[dict[str, Any]]:
        """The quarantined rows, by message and row (what the checkpoint's manifest and the summary show)."""
        return [r.to_json() for _, r in sorted(self.rows.items(), key=lambda kv: (kv[0][0], -kv[0][1]))]

    def state(self, quarantined: Iterable[str]) -> dict[str, Any]:
        """The checkpoint's ``poison`` section (the newest 1024 of each)."""
        strikes = dict(list(self.strikes.items())[-1024:])
        return {"strikes": strikes,
                "scale_before": {k: self.scale_before[k] for k in strikes if k in self.scale_before},
                "quarantined": sorted(quarantined)[-1024:],
                "bisecting": {k: c.to_json() for k, c in list(self.cuts.items())[-1024:]},
                "quarantined_rows": self.message_rows()[-1024:]}

    def load(self, state: Mapping[str, Any]) -> set[str]:
        """Restore :meth:`state`; the messages quarantined whole."""
        self.strikes = {str(k): int(v) for k, v in (state.get("strikes") or {}).items()}
        self.scale_before = {str(k): float(v) for k, v in (state.get("scale_before") or {}).items()}
        self.cuts.clear()
        self.cuts.update({str(k): MessageCuts.from_json(v) for k, v in (state.get("bisecting") or {}).items()})
        self.rows = {}
        for r in state.get("quarantined_rows") or ():
            row = QuarantinedRow(str(r["message"]), int(r["from_end"]), r.get("row"))
            self.rows[(row.message, row.tail)] = row
        return {str(k) for k in state.get("quarantined") or ()}
