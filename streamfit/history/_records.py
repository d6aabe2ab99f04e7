"""The typed records of a run's metrics history: one JSON line each, with a schema version.

An :class:`Interval` covers the batches ``(batch_start, batch_end]`` (rows ``(rows_start, rows_end]``) of the
model's lineage: a crash or a rollback discards the intervals after the state training goes on from, so the
intervals of a history follow each other without gap or overlap.  A :class:`RunStart` marks each start of a
process on the run (fresh or resumed), with the configuration it was given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

__all__ = ["SCHEMA_VERSION", "CheckpointMark", "Interval", "RollbackMark", "RunStart", "record_from_json",
           "record_to_json"]

#: the version of the record layout below; a reader refuses a newer one by name
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CheckpointMark:
    """A checkpoint that became durable in the interval: its step and rows, write time and bytes on disk.

    Attributes
    ----------
    step, rows
        The checkpoint's step and rows.
    seconds, bytes
        Its write time and size on disk.
    name
        Its directory's name.
    """

    step: int
    rows: int
    seconds: float
    bytes: int
    name: str


@dataclass(frozen=True)
class RollbackMark:
    """A divergence rollback: at ``at_rows`` training went back to ``to_rows`` (batch ``to_step``) with the
    learning-rate scale ``lr_scale``; ``quarantined`` names the poison messages it set aside (a quarantine).

    Attributes
    ----------
    at_rows
        The rows trained when the divergence was caught.
    to_step, to_rows
        The batch and rows training went back to.
    reason
        What the guard saw.
    lr_scale
        The learning-rate scale after the rollback.
    quarantined
        The poison messages set aside.
    """

    at_rows: int
    to_step: int
    to_rows: int
    reason: str
    lr_scale: float
    quarantined: tuple[str, ...] = ()


@dataclass(frozen=True)
class Interval:
    """What the run did over batches ``(batch_start, batch_end]``: progressive metrics over the interval's
    evaluated rows, throughput, skips by reason, checkpoints, rollbacks, the learning-rate scale at its end and
    the source's lag (Kafka: messages behind the high watermark per partition) where known.

    Attributes
    ----------
    seq, run
        The interval's number, and the run (process) it belongs to.
    batch_start, batch_end, rows_start, rows_end
        The batches ``(batch_start, batch_end]`` and the rows it covers.
    time_start, time_end, rows_per_s
        Its start and end (Unix time), and its throughput.
    metrics, evaluated_rows
        Progressive metrics over its evaluated rows, and how many.
    skipped_rows, skipped_messages
        Input skipped in it, by reason.
    lr_scale
        The learning-rate scale at its end.
    checkpoints, rollbacks
        Checkpoints that became durable, and rollbacks, in it.
    lag
        The source's lag at its end (Kafka: messages behind the high watermark, per partition).
    """

    seq: int
    run: int
    batch_start: int
    batch_end: int
    rows_start: int
    rows_end: int
    time_start: float  # unix time
    time_end: float
    rows_per_s: float
    metrics: dict[str, float | None] = field(default_factory=dict)
    evaluated_rows: int = 0
    skipped_rows: dict[str, int] = field(default_factory=dict)
    skipped_messages: dict[str, int] = field(default_factory=dict)
    lr_scale: float | None = None
    checkpoints: tuple[CheckpointMark, ...] = ()
    rollbacks: tuple[RollbackMark, ...] = ()
    lag: dict[str, int] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        """Nothing was trained in it (no rows): what a run's end writes to hold a checkpoint that became durable
        after its last trained batch.  It has no throughput nor metrics: trackers and plots show none for it."""
        return self.rows_end == self.rows_start


@dataclass(frozen=True)
class RunStart:
    """A process started on the run: at batch ``batches`` (row ``rows``), resumed from ``resumed_from`` or
    fresh, with its configuration (plain JSON values).

    Attributes
    ----------
    run, time
        The run's number and its start (Unix time).
    batches, rows
        Where it starts (the resumed checkpoint's counters, or 0).
    resumed_from, source
        The checkpoint it resumed from (None: fresh), and its source.
    config
        Its configuration, as plain JSON.
    """

    run: int
    time: float
    batches: int
    rows: int
    resumed_from: str | None = None
    source: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


_KINDS: dict[str, type] = {"interval": Interval, "run": RunStart}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: a non-finite metric is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def record_to_json(record: Interval | RunStart) -> dict[str, Any]:
    """The record as a JSON object: ``schema``, ``kind`` and its fields."""
    data = asdict(record)
    if isinstance(record, Interval):
        data["metrics"] = {k: _finite(v) for k, v in record.metrics.items()}
        data["rows_per_s"] = _finite(record.rows_per_s)
    return {"schema": SCHEMA_VERSION, "kind": _KIND_OF[type(record)], **data}


def record_from_json(data: Mapping[str, Any]) -> Interval | RunStart:
    """A record read back; ``ValueError`` names what is wrong (an unknown kind, a newer schema, a field)."""
    schema = data.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise ValueError(f"history record of schema {schema!r}: this streamfit reads schema <= {SCHEMA_VERSION}")
    kind = data.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"history record of unknown kind {kind!r}, expected one of {sorted(_KINDS)}")
    values = {k: v for k, v in data.items() if k not in ("schema", "kind")}
    if cls is Interval:
        values["checkpoints"] = tuple(CheckpointMark(**c) for c in values.get("checkpoints") or ())
        values["rollbacks"] = tuple(RollbackMark(**{**r, "quarantined": tuple(r.get("quarantined") or ())})
                                    for r in values.get("rollbacks") or ())
    try:
        return cls(**values)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ValueError(f"history record of kind {kind!r}: {exc}") from None
