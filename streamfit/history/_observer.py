"""The observer a training run feeds: it cuts the run into intervals and appends one record per interval.

The Runner tells it four things: a batch was trained (cheap: a counter and a clock), a state it may go back
to was taken (a checkpoint or a rollback point: an interval ends there, so that going back never lands inside
an interval), a checkpoint became durable, and a rollback happened.  Everything else (skips, metrics, the
learning-rate scale, lag) it reads from a :class:`Progress` the Runner makes on demand, at interval ends only.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from streamfit.history._file import HistoryLog, history_dir
from streamfit.history._records import CheckpointMark, Interval, RollbackMark, RunStart

__all__ = ["HistoryOptions", "HistorySink", "Progress", "RunHistory", "interval_metrics", "plain_json"]

logger = logging.getLogger("streamfit.history")


@dataclass(frozen=True)
class HistoryOptions:
    """How a run's history is cut and kept: an interval ends every ``every_rows`` rows or ``every_seconds``
    seconds (whichever first; and at every checkpoint and rollback point); parts of ``max_bytes``, at most
    ``keep_parts`` of them.

    Attributes
    ----------
    every_rows, every_seconds
        An interval ends every this many rows, or seconds, whichever comes first (None: not by that).
    max_bytes, keep_parts
        As for :class:`HistoryLog`.
    """

    every_rows: int | None = None
    every_seconds: float | None = 10.0
    max_bytes: int = 4 << 20
    keep_parts: int = 16

    def __post_init__(self) -> None:
        if self.every_rows is not None and (isinstance(self.every_rows, bool) or self.every_rows < 1):
            raise ValueError(f"Invalid history every_rows: {self.every_rows!r}, expected an int >= 1")
        if self.every_seconds is not None and not self.every_seconds > 0:
            raise ValueError(f"Invalid history every_seconds: {self.every_seconds!r}, expected seconds > 0")


class HistorySink(Protocol):
    """What sees the history's records as they are written (a tracker logging while the run goes:
    :mod:`streamfit.report.trackers`): each :class:`RunStart` and :class:`Interval` once it is on disk, then
    ``close`` when the run ends."""

    def record(self, record: "Interval | RunStart") -> None:
        """See one record, once it is on disk.

        Parameters
        ----------
        record
            An :class:`Interval` or a :class:`RunStart`.
        """
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Progress:
    """The run's counters at an interval's end, as the Runner has them (cumulative over resumes).

    Attributes
    ----------
    batches, rows
        Trained batches and rows (over resumes).
    skipped_rows, skipped_messages
        Skipped input, by reason.
    stream_metrics
        The stream's progressive metrics so far.
    lr_scale
        The learning-rate scale now (None: no divergence guard).
    lag
        The source's lag (Kafka: per partition), where known.
    """

    batches: int
    rows: int
    skipped_rows: Mapping[str, int] = field(default_factory=dict)
    skipped_messages: Mapping[str, int] = field(default_factory=dict)
    #: the current stream loop's progressive metrics over all its evaluated rows (``StreamSummary.stream_metrics``)
    stream_metrics: Mapping[str, Any] = field(default_factory=dict)
    lr_scale: float | None = None
    lag: Mapping[str, int] = field(default_factory=dict)


@dataclass
class _Open:
    """The interval being accumulated."""

    batches: int
    rows: int
    time: float
    clock: float
    skipped_rows: dict[str, int]
    skipped_messages: dict[str, int]
    stream_metrics: dict[str, Any]
    checkpoints: list[CheckpointMark] = field(default_factory=list)
    rollbacks: list[RollbackMark] = field(default_factory=list)


def interval_metrics(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[dict[str, float | None], int]:
    """The progressive metrics over the rows evaluated between two stream-metric snapshots of one loop
    (means over all rows so far, ``rows`` their count): per mean, ``(m1 n1 - m0 n0) / (n1 - n0)``; an ``rmse``
    through its square.  Returns the metrics and the rows evaluated."""
    n0, n1 = int(before.get("rows") or 0), int(after.get("rows") or 0)
    n = n1 - n0
    out: dict[str, float | None] = {}
    if n <= 0:
        return out, 0
    for key, v1 in after.items():
        if key == "rows" or not isinstance(v1, (int, float)) or isinstance(v1, bool):
            continue
        v0 = before.get(key) if n0 else 0.0
        if not isinstance(v0, (int, float)):
            out[key] = None
            continue
        if key == "rmse":
            mean = (v1 * v1 * n1 - v0 * v0 * n0) / n
            out[key] = math.sqrt(max(mean, 0.0))
        else:
            out[key] = (v1 * n1 - v0 * n0) / n
    return out, n


def _minus(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: int(v) - int(before.get(k, 0)) for k, v in after.items() if int(v) != int(before.get(k, 0))}


def plain_json(value: Any, depth: int = 0) -> Any:
    """A configuration value as plain JSON (what is not JSON becomes its ``repr``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth > 6:
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): plain_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain_json(v, depth + 1) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


class RunHistory:
    """Keeps the metrics history of a run in ``CHECKPOINT_DIR/history`` (see :mod:`streamfit.history`), or in
    ``directory`` when given.  ``sinks`` see every record once it is written (a failing sink is logged and
    dropped: the history on disk stays whole, and ``streamfit report --mlflow/--tensorboard`` replays it).

    Parameters
    ----------
    checkpoint_dir
        The run's checkpoint directory (the history goes in its ``history``); None with ``directory``.
    options
        How intervals are cut and parts kept (default: :class:`HistoryOptions`'s defaults).
    directory
        Keep the history here instead.
    sinks
        :class:`HistorySink` objects fed each record once it is written.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None, options: HistoryOptions | None = None, *,
                 directory: str | os.PathLike[str] | None = None, sinks: Sequence[HistorySink] = ()) -> None:
        if directory is None and checkpoint_dir is None:
            raise ValueError("a RunHistory needs a checkpoint_dir or a directory")
        self.options = options or HistoryOptions()
        root = Path(directory) if directory is not None else history_dir(checkpoint_dir)  # type: ignore[arg-type]
        self.log = HistoryLog(root, self.options.max_bytes, self.options.keep_parts)
        self.sinks = list(sinks)
        self._progress: Callable[[], Progress] | None = None
        self._open: _Open | None = None
        self._seq = 0
        self._run = 0
        self._pending_rollbacks: list[RollbackMark] = []
        self._next_rows = math.inf
        self._next_clock = math.inf
        self._rows_at: dict[int, int] = {}  # rows at the latest boundaries, by step

    # -- the run's life ------------------------------------------------------------------------------
    def start(self, progress: Callable[[], Progress], *, resumed_from: str | None, source: str | None,
              config: Mapping[str, Any]) -> None:
        """A process starts on the run: cut what a lost tail held (after the resumed checkpoint's batch), note
        the start and its configuration, open the first interval.

        Parameters
        ----------
        progress
            A callable giving the run's counters now (the Runner's).
        resumed_from, source
            The checkpoint resumed from (None: fresh), and the source.
        config
            The run's configuration (plain JSON values).
        """
        self._progress = progress
        now = progress()
        if resumed_from is None and now.batches == 0:
            for part in sorted(self.log.root.glob("history-*.jsonl")):  # a fresh run: an earlier history is not its own
                part.unlink()
        last = self.log.truncate_after(now.batches)
        runs = self.log.read().runs
        self._run = runs[-1].run + 1 if runs else 0
        self._seq = last.seq + 1 if last is not None else 0
        if last is not None and last.batch_end != now.batches:
            logger.warning("history: the last interval kept ends at batch %d, the run resumes at batch %d: the "
                           "batches between have no interval", last.batch_end, now.batches)
        self._append(RunStart(self._run, time.time(), now.batches, now.rows, resumed_from, source,
                              dict(plain_json(config))), sync=True)
        self._begin(now, now.stream_metrics)

    def batch(self, rows: int) -> None:
        """A batch was trained (``rows``: the run's row counter): end the interval if it is due.

        Parameters
        ----------
        rows
            The run's row counter after the batch.
        """
        if rows >= self._next_rows or time.monotonic() >= self._next_clock:
            self.boundary()

    def boundary(self, sync: bool = False) -> None:
        """End the open interval here (a checkpoint or rollback point was taken: a resume or rollback may come
        back to this batch); ``sync`` fsyncs it (before the checkpoint that covers it is written).

        Parameters
        ----------
        sync
            fsync the interval.
        """
        if self._open is None or self._progress is None:
            return
        now = self._progress()
        self._rows_at[now.batches] = now.rows
        if len(self._rows_at) > 64:
            del self._rows_at[min(self._rows_at)]
        if now.batches > self._open.batches:
            self._write(now, sync)
        elif sync:
            self.log.sync()
        self._begin(now, now.stream_metrics)

    def checkpoint(self, step: int, rows: int | None, seconds: float, path: str | os.PathLike[str]) -> None:
        """A checkpoint became durable: noted in the interval open now (``rows`` None: the rows at the boundary
        of that step).

        Parameters
        ----------
        step, rows
            The checkpoint's step and rows (None: the rows at that step's boundary).
        seconds
            Its write time.
        path
            Its directory.
        """
        if rows is None:
            rows = self._rows_at.get(step, 0)
        if self._open is not None:
            self._open.checkpoints.append(CheckpointMark(step, rows, float(seconds), _size(Path(path)),
                                                         Path(path).name))

    def rollback(self, *, at_rows: int, to_step: int, to_rows: int, reason: str, lr_scale: float,
                 quarantined: tuple[str, ...] = ()) -> None:
        """Training went back to batch ``to_step``: the intervals after it leave the lineage (their rollbacks
        are kept: they happened), the next interval starts there and notes this one.

        Parameters
        ----------
        at_rows, to_step, to_rows, reason, lr_scale, quarantined
            As in :class:`RollbackMark`.
        """
        self.rewind(to_step, RollbackMark(at_rows, to_step, to_rows, reason, float(lr_scale), tuple(quarantined)),
                    fresh_metrics=True)

    def rewind(self, to_step: int, mark: RollbackMark | None = None, fresh_metrics: bool = False) -> None:
        """Training goes on from step ``to_step`` again (a rollback; a distributed run's learners restarted
        from its last global checkpoint): the intervals after it are cut, the next one starts there.
        ``fresh_metrics``: the progressive metrics count from zero again (a new stream loop).

        Parameters
        ----------
        to_step
            The batch training goes on from.
        mark
            The rollback to note in the next interval, or None.
        fresh_metrics
            Whether the progressive metrics count from zero again.
        """
        dropped = [i for i in self.log.read().intervals if i.batch_end > to_step]
        carried = [r for i in dropped for r in i.rollbacks]
        if self._open is not None:
            carried += self._open.rollbacks
        self.log.truncate_after(to_step)
        last = self.log.read().intervals
        self._seq = last[-1].seq + 1 if last else 0
        self._pending_rollbacks = carried + ([mark] if mark is not None else [])
        if self._progress is not None:
            now = self._progress()
            self._begin(now, {} if fresh_metrics else now.stream_metrics)

    def close(self) -> None:
        """The run ends: the open interval (if it has rows) is written, the file synced and closed."""
        if self._open is not None and self._progress is not None:
            now = self._progress()
            if now.batches > self._open.batches or self._open.checkpoints:
                self._write(now, sync=True)
        self._open = None
        self.log.sync()
        self.log.close()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                logger.warning("history: closing %s failed (%s: %s)", type(sink).__name__, type(exc).__name__, exc)
        self.sinks = []

    # -- intervals -----------------------------------------------------------------------------------
    def _begin(self, now: Progress, metrics: Mapping[str, Any]) -> None:
        opts = self.options
        pending = self._pending_rollbacks
        self._pending_rollbacks = []
        self._open = _Open(now.batches, now.rows, time.time(), time.monotonic(), dict(now.skipped_rows),
                           dict(now.skipped_messages), dict(metrics), rollbacks=pending)
        self._next_rows = now.rows + opts.every_rows if opts.every_rows is not None else math.inf
        self._next_clock = (self._open.clock + opts.every_seconds) if opts.every_seconds is not None else math.inf

    def _write(self, now: Progress, sync: bool) -> None:
        o = self._open
        assert o is not None
        metrics, evaluated = interval_metrics(o.stream_metrics, now.stream_metrics)
        seconds = time.monotonic() - o.clock
        record = Interval(
            seq=self._seq, run=self._run, batch_start=o.batches, batch_end=now.batches, rows_start=o.rows,
            rows_end=now.rows, time_start=o.time, time_end=time.time(),
            rows_per_s=(now.rows - o.rows) / seconds if seconds > 0 else 0.0, metrics=metrics,
            evaluated_rows=evaluated, skipped_rows=_minus(now.skipped_rows, o.skipped_rows),
            skipped_messages=_minus(now.skipped_messages, o.skipped_messages), lr_scale=now.lr_scale,
            checkpoints=tuple(o.checkpoints), rollbacks=tuple(o.rollbacks),
            lag={str(k): int(v) for k, v in now.lag.items()})
        self._append(record, sync=sync)
        self._seq += 1

    def _append(self, record: Interval | RunStart, sync: bool) -> None:
        self.log.append(record, sync=sync)
        for sink in list(self.sinks):
            try:
                sink.record(record)
            except Exception as exc:  # a tracker never stops the run: the history on disk is whole
                logger.warning("history: %s failed (%s: %s); it sees no more of this run (streamfit report can "
                               "replay the history to it)", type(sink).__name__, type(exc).__name__, exc)
                self.sinks.remove(sink)


def _size(path: Path) -> int:
    """Bytes of a checkpoint directory's files (a few entries: cheap)."""
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat().st_size
    except OSError:
        return 0
    return total
