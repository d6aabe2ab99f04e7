"""The run's ledger of its own group commits (``kafka-commits.json`` beside the checkpoints).

Each commit a source is about to send is written here first (atomically, fsynced), stamped with the step of
the checkpoint it covers.  On a resume (or rollback) from the checkpoint of step ``s``, the ledger answers
which committed offsets this learner made at or after ``s``: a group offset ahead of the checkpoint that is
one of them came from a newer checkpoint of its own since lost, so the source trains those rows again
instead of skipping them (as it skips rows another member committed).  Plain JSON, no pickle.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfit.checkpoint._fs import atomic_write
from streamfit.exceptions import CheckpointError
from streamfit.sources._commits import GroupCommit

__all__ = ["RunCommitLedger"]

_log = logging.getLogger(__name__)
FORMAT = "streamfit.group-commits/1"
FILE = "kafka-commits.json"


@dataclass(frozen=True)
class _Entry:
    step: int
    commit: GroupCommit

    def to_json(self) -> dict[str, Any]:
        c = self.commit
        return {"step": self.step, "topic": c.topic, "group": c.group,
                "offsets": {str(p): o for p, o in c.offsets.items()}}

    @classmethod
    def parse(cls, raw: Any) -> "_Entry":
        offsets = raw["offsets"]
        if not (isinstance(raw["step"], int) and isinstance(raw["topic"], str) and isinstance(raw["group"], str)
                and isinstance(offsets, dict) and all(str(k).isdigit() and isinstance(v, int) and v >= 0
                                                      for k, v in offsets.items())):
            raise ValueError(f"invalid entry {raw!r}")
        return cls(raw["step"], GroupCommit(raw["topic"], raw["group"], {int(k): v for k, v in offsets.items()}))


class RunCommitLedger:
    """A :class:`~streamfit.sources._commits.CommitLedger` kept in ``root``: the Runner sets :attr:`step` (the
    checkpoint being committed) before each commit and :attr:`since` (the checkpoint resumed or rolled back to)
    before each source is opened.  Keeps the newest ``keep`` commits.

    >>> import tempfile
    >>> ledger = RunCommitLedger(tempfile.mkdtemp())
    >>> ledger.step = 8; ledger.record(GroupCommit("t", "g", {0: 40}))
    >>> ledger.since = 4; sorted(RunCommitLedger(ledger.path.parent).own_offsets("t", "g", 0))
    [40]
    >>> ledger.since = 9; sorted(ledger.own_offsets("t", "g", 0))
    []
    """

    def __init__(self, root: "str | Path", keep: int = 256) -> None:
        self.path = Path(root) / FILE
        self.keep = keep
        self.step = 0
        self.since = 0
        self._lock = threading.Lock()  # sources call from their consumer threads
        self._entries = self._load()

    def _load(self) -> list[_Entry]:
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            return self._unreadable(exc)
        try:
            if raw.get("format") != FORMAT:
                raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
            return [_Entry.parse(e) for e in raw["commits"]]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            return self._unreadable(exc)

    def _unreadable(self, exc: Exception) -> list[_Entry]:
        """Not fatal (it is written atomically: only a disk fault or a hand edit breaks it): the group's offsets
        then win over the checkpoint's, as without a ledger; the file is set aside for a post-mortem."""
        aside = self.path.with_name(self.path.name + ".corrupt")
        _log.warning("commit ledger %s unreadable (%s): set aside as %s; a group offset ahead of the resumed "
                     "checkpoint now wins even if this learner committed it", self.path, exc, aside.name)
        try:
            self.path.replace(aside)
        except OSError:
            pass
        return []

    def reset(self) -> None:
        """A fresh run: no commit of an earlier run in this directory counts as this run's."""
        with self._lock:
            self._entries = []
            self.path.unlink(missing_ok=True)

    def record(self, commit: GroupCommit) -> None:
        """Write ``commit`` (stamped with :attr:`step`) durably; only then may the source send it."""
        with self._lock:
            entries = (self._entries + [_Entry(self.step, commit)])[-self.keep:]
            data = json.dumps({"format": FORMAT, "commits": [e.to_json() for e in entries]}).encode()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(self.path, data)
            except OSError as exc:
                raise CheckpointError(f"cannot write the commit ledger {self.path}: {exc} (the offsets of "
                                      f"{commit.topic} for group {commit.group} were not committed)") from exc
            self._entries = entries

    def own_offsets(self, topic: str, group: str, partition: int) -> frozenset[int]:
        """Offsets of ``partition`` this learner committed for checkpoints of step :attr:`since` or later."""
        with self._lock:
            return frozenset(e.commit.offsets[partition] for e in self._entries
                             if e.step >= self.since and e.commit.topic == topic and e.commit.group == group
                             and partition in e.commit.offsets)
