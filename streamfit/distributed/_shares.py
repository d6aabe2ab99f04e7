"""Who reads what: the coordinator's explicit assignment of a source to N learners.

Kafka: partition ``p`` goes to learner ``p % N``, assigned to its consumer directly (no consumer-group
rebalance), so every learner's position names exactly its partitions and nothing moves between learners
behind the coordinator's back.  Parquet: the files (sorted by name) are dealt round-robin.  A followed Parquet
directory (``follow``) has files that appear later: each learner follows it and reads the files whose name
hashes to it (CRC-32 of the name modulo N: the same owner whenever a file appears, whatever the others' progress),
with the single learner's rule (files sorting after the last one it started).  Assignments are
stored in the global checkpoint; a job resumed with as many learners reads the same shares, one resumed with
another number re-deals them (:mod:`streamfit.distributed._elastic`).
"""

from __future__ import annotations

import os
import zlib
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
    #: a followed Parquet directory: this learner reads the files whose name hashes to ``index`` among ``learners``
    follow: bool = False
    learners: int = 1

    def describe(self) -> dict[str, Any]:
        """The JSON form stored in a global checkpoint."""
        out: dict[str, Any] = {"index": self.index, "kind": self.kind, "partitions": list(self.partitions),
                               "files": list(self.files)}
        if self.starts:
            out["starts"] = dict(self.starts)
        if self.follow:
            out["follow"], out["learners"] = True, self.learners
        return out

    def open(self, position: Position | None, finite: bool) -> Source:
        """This share's source, restarted at ``position``; ``finite`` ends Kafka at the partitions' ends."""
        if self.kind == "kafka":
            source: Source = open_source(self.uri, **{**self.options, "partitions": list(self.partitions),
                                                      "until_eof": finite})
        else:
            proto = open_source(self.uri, **self.options)
            assert isinstance(proto, ParquetSource)
            if self.follow:
                source = FollowedFiles(proto._paths[0], self.index, self.learners, columns=proto.columns,
                                       batch_size=proto.batch_size, poll_interval=proto.poll_interval,
                                       batch_readahead=proto.batch_readahead, use_threads=proto.use_threads)
            else:
                source = ParquetSource(list(self.files), columns=proto.columns, batch_size=proto.batch_size,
                                       batch_readahead=proto.batch_readahead, use_threads=proto.use_threads,
                                       start_rows=self.starts)
        if position is not None:
            source.seek(position)
        return source


def file_owner(name: str, learners: int) -> int:
    """The learner that reads file ``name`` (relative, as positions name it) of a followed directory."""
    return zlib.crc32(name.encode()) % learners


class FollowedFiles(ParquetSource):
    """A followed Parquet directory as one learner sees it: only the files :func:`file_owner` gives it."""

    def __init__(self, path: str, index: int, learners: int, **options: Any) -> None:
        super().__init__(path, follow=True, **options)
        self.index, self.learners = index, learners

    def _list(self) -> list[str]:
        return [n for n in super()._list() if file_owner(n, self.learners) == self.index]


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
        paths = proto._paths
        if proto.follow:
            if len(paths) != 1 or not os.path.isdir(paths[0]):
                raise ValueError(f"{uri}: follow needs a directory")
            # no file list: it grows; a learner's position says which of its files are done
            return [Share(i, "parquet", uri, options, follow=True, learners=workers) for i in range(workers)]
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
