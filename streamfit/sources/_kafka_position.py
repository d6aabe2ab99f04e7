"""Where a KafkaSource stands: typed, per partition, parsed once from (and written as) a checkpoint's JSON.

A position names every partition the learner ever trained, including those away at the moment (revoked by
a rebalance, not yet given back after a session timeout): their rows are in the model, so a resume must not
read them again from the group's committed offset, which lags behind (it is committed only once a checkpoint
is durable).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from streamfit.sources._base import Position, position_int

FORMAT = '{"topic": str, "partitions": {"<partition>": {"offset": int, "row": int}}}'


@dataclass(frozen=True, order=True)
class PartitionPosition:
    """One partition: every message before ``offset`` is done, and the first ``row`` rows of message ``offset``.

    >>> PartitionPosition(5, 3).after_commit(PartitionPosition(7)), PartitionPosition(5, 3).after_commit(
    ...     PartitionPosition(5)), PartitionPosition(5, 3).after_commit(PartitionPosition(5, 9))
    (PartitionPosition(offset=7, row=0), PartitionPosition(offset=5, row=3), PartitionPosition(offset=5, row=9))
    """

    offset: int
    row: int = 0

    def after_commit(self, committed: "PartitionPosition") -> "PartitionPosition":
        """The later of this position and where a group's commit ends (another member trained up to there)."""
        return committed if committed > self else self


@dataclass(frozen=True)
class KafkaPosition:
    """A KafkaSource position: ``partitions`` maps partition numbers to where each stands.

    >>> p = KafkaPosition.parse({"topic": "t", "partitions": {"1": {"offset": 4, "row": 2}}}, "t")
    >>> p.partitions[1], p.to_json()
    (PartitionPosition(offset=4, row=2), {'topic': 't', 'partitions': {'1': {'offset': 4, 'row': 2}}})
    """

    topic: str
    partitions: Mapping[int, PartitionPosition]

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", MappingProxyType(dict(sorted(self.partitions.items()))))

    @classmethod
    def parse(cls, position: Any, topic: str) -> "KafkaPosition":
        """Check a checkpoint's position (JSON) for ``topic``; a clear error names what is wrong."""
        parts = position.get("partitions") if isinstance(position, Mapping) else None
        if not isinstance(parts, Mapping) or position.get("topic") != topic:
            raise ValueError(f"KafkaSource({topic}): invalid position {position!r}, expected {FORMAT}")
        out: dict[int, PartitionPosition] = {}
        for key, value in parts.items():
            if not str(key).isdigit() or not isinstance(value, Mapping):
                raise ValueError(f"KafkaSource: invalid partition entry {key!r}: {value!r} in position")
            out[int(key)] = PartitionPosition(position_int(value, "offset", "KafkaSource", FORMAT),
                                              position_int(value, "row", "KafkaSource", FORMAT))
        return cls(topic, out)

    def to_json(self) -> Position:
        """The JSON form a checkpoint stores (string partition keys, in order)."""
        return {"topic": self.topic,
                "partitions": {str(p): {"offset": at.offset, "row": at.row} for p, at in self.partitions.items()}}
