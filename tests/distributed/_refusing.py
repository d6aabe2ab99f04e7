"""A learner's share whose source refuses commits, as KafkaSource does when the group refuses one.

A broker refusing a commit at an exact moment cannot be produced reliably: this stand-in reads a share's
Parquet files and raises, from ``commit``, the SourceError KafkaSource raises for a refused commit.  Every
commit asked of it (refused or accepted) is appended to ``<log>/<learner>.jsonl``: the log outlives the
sources a learner opens (one per loop) and is read by the test process whether the learner runs in it or in
a Ray worker.  Shipped to Ray workers by value (:func:`ship_by_value`): they need not import ``tests``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterator

from streamfit.distributed._shares import Share
from streamfit.exceptions import SourceError
from streamfit.sources import Position, Source, SourceBatch

__all__ = ["RefusingShare", "commits", "refusing", "ship_by_value"]

#: what KafkaSource.commit raises when the broker refuses a commit (confluent-kafka's text for ILLEGAL_GENERATION)
REFUSED = ("Kafka commit to group 'g' failed: KafkaError{code=ILLEGAL_GENERATION,val=22,"
           'str="Commit failed: Broker: Specified group generation id is not valid"}')


def _path(log: str, learner: int) -> Path:
    return Path(log) / f"{learner}.jsonl"


def commits(log: "str | os.PathLike[str]", learner: int) -> list[tuple[bool, Position]]:
    """The commits learner ``learner`` asked for, in order: ``(refused, position)``."""
    path = _path(str(log), learner)
    if not path.exists():
        return []
    return [(entry["refused"], entry["position"]) for entry in map(json.loads, path.read_text().splitlines())]


class _Refusing(Source):
    """``inner``'s batches; its commits refused while fewer than ``refusals`` were asked for (``error``: a
    RuntimeError instead, always: an error that is not a refusal)."""

    def __init__(self, inner: Source, log: str, learner: int, refusals: int, error: bool) -> None:
        self.inner, self.log, self.learner, self.refusals, self.error = inner, log, learner, refusals, error

    def seek(self, position: Position) -> None:
        self.inner.seek(position)

    async def __anext__(self) -> SourceBatch:
        return await self.inner.__anext__()

    async def commit(self, position: Position) -> None:
        if self.error:
            raise RuntimeError("the consumer is closed")
        refused = len(commits(self.log, self.learner)) < self.refusals
        with _path(self.log, self.learner).open("a") as f:
            f.write(json.dumps({"refused": refused, "position": position}) + "\n")
        if refused:
            raise SourceError(REFUSED)
        await self.inner.commit(position)

    async def aclose(self) -> None:
        await self.inner.aclose()
        await super().aclose()


@dataclasses.dataclass(frozen=True)
class RefusingShare(Share):
    """A Parquet share whose sources refuse the first ``refusals`` commits of this learner (logged in ``log``)."""

    log: str = ""
    refusals: int = 0
    error: bool = False

    def open(self, position: Position | None, finite: bool) -> Source:
        return _Refusing(super().open(position, finite), self.log, self.index, self.refusals, self.error)


def refusing(shares: list[Share], log: "str | os.PathLike[str]", refusals: list[int],
             error: bool = False) -> list[Share]:
    """``shares`` as :class:`RefusingShare` (learner ``i`` refusing its first ``refusals[i]`` commits)."""
    os.makedirs(log, exist_ok=True)
    return [RefusingShare(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)}, log=str(log),
                          refusals=n, error=error) for s, n in zip(shares, refusals)]


def ship_by_value() -> Iterator[None]:
    """(A generator for a fixture) this module pickled by value while it runs: Ray workers get its classes."""
    import sys

    from ray import cloudpickle

    module: Any = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)
