"""The history on disk: JSON lines in numbered parts, appended a whole line at a time, bounded and rotated.

A crash leaves every line written before it (each record is one ``write`` of one line, flushed; the line that
closes an interval at a checkpoint is also fsynced before the checkpoint is written), and at most one torn
last line, which the reader ignores.  Resuming cuts the intervals after the checkpoint's step
(:meth:`HistoryLog.truncate_after`): the rows after it are trained again and their intervals written again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from streamfit.history._records import Interval, RunStart, record_from_json, record_to_json

__all__ = ["History", "HistoryLog", "read_history"]

logger = logging.getLogger("streamfit.history")

_PART_RE = re.compile(r"history-([0-9]{6})\.jsonl")
#: the history's directory inside a checkpoint directory
DIRNAME = "history"


def history_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    """Where a run's history lives: ``CHECKPOINT_DIR/history``.

    Parameters
    ----------
    checkpoint_dir
        The run's checkpoint directory.
    """
    return Path(checkpoint_dir) / DIRNAME


def _parts(root: Path) -> list[tuple[int, Path]]:
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), root / n) for n in names if (m := _PART_RE.fullmatch(n))]
    return sorted(found)


def _read_part(path: Path, last: bool) -> Iterator[Interval | RunStart]:
    """The records of one part; a torn (unterminated or unparsable) last line is skipped, quietly if it is the
    end of the newest part (a crash mid-write), with a warning elsewhere."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        at_end = i == len(lines) - 1  # no newline after it: cut short
        try:
            raw = json.loads(line)
        except ValueError:
            if not (at_end and last):
                logger.warning("history %s: line %d is not JSON (%d bytes), skipped", path, i + 1, len(line))
            continue
        yield record_from_json(raw)


@dataclass(frozen=True)
class History:
    """A run's history as read back: its starts (one per process, fresh or resumed) and its intervals in order.

    Attributes
    ----------
    runs
        The starts, one per process.
    intervals
        The intervals, in order.
    """

    runs: list[RunStart]
    intervals: list[Interval]

    @property
    def end(self) -> tuple[int, int]:
        """``(batches, rows)`` where the history ends: its last interval's end, else its last start's (0, 0 when
        empty); where a run that continues it goes on counting."""
        if self.intervals:
            return self.intervals[-1].batch_end, self.intervals[-1].rows_end
        if self.runs:
            return self.runs[-1].batches, self.runs[-1].rows
        return 0, 0

    def gaps(self) -> list[tuple[int, int]]:
        """Batch ranges ``(end, next start)`` between consecutive intervals that do not meet (none in a healthy
        history)."""
        return [(a.batch_end, b.batch_start) for a, b in zip(self.intervals, self.intervals[1:])
                if a.batch_end != b.batch_start]


def read_history(path: str | os.PathLike[str]) -> History:
    """Read the history of a checkpoint directory (or of its ``history`` directory itself).

    Parameters
    ----------
    path
        A checkpoint directory, or its ``history`` directory.
    """
    root = Path(path)
    if not _parts(root) and _parts(root / DIRNAME):
        root = root / DIRNAME
    parts = _parts(root)
    runs: dict[int, RunStart] = {}
    intervals: list[Interval] = []
    for i, (_, part) in enumerate(parts):
        for record in _read_part(part, last=i == len(parts) - 1):
            if isinstance(record, RunStart):
                runs.setdefault(record.run, record)  # each part starts with the newest run's copy
            else:
                intervals.append(record)
    return History(sorted(runs.values(), key=lambda r: r.run), intervals)


class HistoryLog:
    """Append-only JSON-lines parts in ``root``: a new part past ``max_bytes``, the oldest removed beyond
    ``keep_parts`` (so at most about ``max_bytes * keep_parts`` on disk).

    Parameters
    ----------
    root
        The directory of the parts.
    max_bytes
        Bytes per part before a new one starts.
    keep_parts
        Parts kept (the oldest removed beyond).
    """

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = 4 << 20, keep_parts: int = 16) -> None:
        if max_bytes < 1024:
            raise ValueError(f"Invalid max_bytes: {max_bytes!r}, expected >= 1024")
        if keep_parts < 1:
            raise ValueError(f"Invalid keep_parts: {keep_parts!r}, expected >= 1")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.keep_parts = keep_parts
        self._file: IO[bytes] | None = None
        self._part = 0
        self._size = 0
        self._run: RunStart | None = None  # copied at the head of each new part

    def read(self) -> History:
        return read_history(self.root)

    def truncate_after(self, step: int) -> Interval | None:
        """Drop the intervals ending after batch ``step`` (and a torn last line); the last interval kept.

        Parameters
        ----------
        step
            The last batch to keep.
        """
        self.close()
        for number, part in reversed(_parts(self.root)):
            kept: list[bytes] = []
            last: Interval | None = None
            dropped = 0
            for record in _read_part(part, last=True):
                if isinstance(record, Interval) and record.batch_end > step:
                    dropped += 1
                    continue
                if isinstance(record, Interval):
                    last = record
                kept.append(_line(record))
            if dropped or part.read_bytes() != b"".join(kept):
                _rewrite(part, kept)
            if dropped:
                logger.info("history: %d interval(s) after batch %d dropped from %s (trained again)", dropped,
                            step, part.name)
            if last is not None:
                return last
        return None

    def append(self, record: Interval | RunStart, sync: bool = False) -> None:
        """Write one record as one line (flushed; fsynced with ``sync``).

        Parameters
        ----------
        record
            An :class:`Interval` or a :class:`RunStart`.
        sync
            fsync it too.
        """
        if isinstance(record, RunStart):
            self._run = record
        line = _line(record)
        if self._file is None or self._size + len(line) > self.max_bytes and self._size > 0:
            self._next_part(skip_run=isinstance(record, RunStart))
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        self._size += len(line)
        if sync:
            os.fsync(self._file.fileno())

    def sync(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _next_part(self, skip_run: bool) -> None:
        parts = _parts(self.root)
        if self._file is None and parts and parts[-1][1].stat().st_size < self.max_bytes:
            self._part, path = parts[-1]  # go on appending to the newest part
            self.close()
            self._file = open(path, "ab")
            self._size = path.stat().st_size
            if self._size and not path.read_bytes().endswith(b"\n"):  # a torn line: end it (the reader skips it)
                self._file.write(b"\n")
                self._size += 1
            return
        self.close()
        self.root.mkdir(parents=True, exist_ok=True)
        self._part = (parts[-1][0] if parts else 0) + 1
        self._file = open(self.root / f"history-{self._part:06d}.jsonl", "ab")
        self._size = 0
        for _, old in parts[:max(len(parts) + 1 - self.keep_parts, 0)]:
            old.unlink(missing_ok=True)
        if self._run is not None and not skip_run:  # the newest run's configuration stays readable
            line = _line(self._run)
            self._file.write(line)
            self._size += len(line)


def _line(record: Interval | RunStart) -> bytes:
    return (json.dumps(record_to_json(record), separators=(",", ":"), allow_nan=False) + "\n").encode()


def _rewrite(path: Path, lines: list[bytes]) -> None:
    """Replace a part atomically (a crash leaves the old or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
