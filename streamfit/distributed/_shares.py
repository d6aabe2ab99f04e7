"""Who reads what: the coordinator's explicit assignment of a source to N learners.

Kafka: partition ``p`` goes to learner ``p % N``, assigned to its consumer directly (no consumer-group
rebalance), so every learner's position names exactly its partitions and nothing moves between learners
behind the coordinator's back.  Parquet: the files (sorted by name) are dealt round-robin.  Assignments are
stored in the global checkpoint; a job resumed with as many learners reads the same shares, one resumed with
another number re-deals them (:mod:`streamfit.distributed._elastic`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streamfit.sources import KafkaSource, ParquetSource, Position, Source, open_source
from streamfit.sources.parquet import _list_directory

__all__ = ["Share", "plan_shares"]


@dataclass(frozen=True)
class Share:
    """One learner's part of the source: Kafka ``partitions`` or Parquet ``files`` (absolute paths)."""

    index: int
    kind: str                       # "kafka" or "parquet"
    uri: str
    options: Mapping[str, Any] = field(default_factory=dict)
    partitions: tuple[int, ...] = ()
    files: tuple[str, ...] = ()
    #: Parquet: rows of these files (by name, as positions name them) trained before a re-deal
    starts: Mapping[str, int] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The JSON form stored in a global checkpoint."""
        out: dict[str, Any] = {"index": self.index, "kind": self.kind, "partitions": list(self.partitions),
                               "files": list(self.files)}
        if self.starts:
            out["starts"] = dict(self.starts)
        return out

    def open(self, position: Position | None, finite: bool) -> Source:
        """This share's source, restarted at ``position``; ``finite`` ends Kafka at the partitions' ends."""
        if self.kind == "kafka":
            source: Source = open_source(self.uri, **{**self.options, "partitions": list(self.partitions),
                                                      "until_eof": finite})
        else:
            proto = open_source(self.uri, **self.options)
            assert isinstance(proto, ParquetSource)
            source = ParquetSource(list(self.files), columns=proto.columns, batch_size=proto.batch_size,
                                   batch_readahead=proto.batch_readahead, use_threads=proto.use_threads,
                                   start_rows=self.starts)
        if position is not None:
            source.seek(position)
        return source


def _kafka_partitions(source: KafkaSource) -> list[int]:
    from confluent_kafka import Consumer

    consumer = Consumer({k: v for k, v in source.config.items()
                         if k in ("bootstrap.servers", "group.id") or k.startswith(("security.", "sasl.", "ssl."))})
    try:
        meta = consumer.list_topics(source.topic, timeout=10)
    finally:
        consumer.close()
    topic = meta.topics.get(source.topic)
    if topic is None or topic.error is not None or not topic.partitions:
        raise ValueError(f"Kafka topic {source.topic!r} not found or without partitions "
                         f"({getattr(topic, 'error', None)})")
    return sorted(topic.partitions)


def plan_shares(uri: str, workers: int, options: Mapping[str, Any] | None = None) -> list[Share]:
    """Split ``uri`` among ``workers`` learners (see the module docstring); a clear error when it cannot."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Invalid workers: {workers!r}, expected an int >= 1")
    options = dict(options or {})
    proto = open_source(uri, **options)
    if isinstance(proto, KafkaSource):
        parts = _kafka_partitions(proto)
        if len(parts) < workers:
            raise ValueError(f"Kafka topic {proto.topic!r} has {len(parts)} partition(s): at most that many "
                             f"learners can share it, not {workers}")
        return [Share(i, "kafka", uri, options, partitions=tuple(p for p in parts if p % workers == i))
                for i in range(workers)]
    if isinstance(proto, ParquetSource):
        if proto.follow:
            raise ValueError("a followed Parquet directory cannot be shared among learners yet: the files are "
                             "assigned once, at the start (drop follow)")
        paths = proto._paths
        if len(paths) == 1 and os.path.isdir(paths[0]):
            files = [os.path.join(paths[0], name) for name in _list_directory(paths[0])]
        else:
            files = sorted(paths)
        if len(files) < workers:
            raise ValueError(f"{uri}: {len(files)} Parquet file(s) cannot be shared among {workers} learners "
                             "(each needs at least one file)")
        return [Share(i, "parquet", uri, options, files=tuple(files[i::workers])) for i in range(workers)]
    raise ValueError(f"{uri}: only Kafka topics and Parquet files can be shared among learners "
                     f"(got a {type(proto).__name__})")
