"""Kafka source (extra ``[kafka]``): a consumer group on one topic, each message value decoded to rows.

Client: confluent-kafka, i.e. librdkafka, the most widely deployed and trusted Kafka client (the
reference C client behind most language bindings) and the fastest measured on this machine (consume
~130-180 MB/s on loopback).  Its calls block, so every call runs in a worker thread, one at a time.
"""

from __future__ import annotations

import bisect
import collections
import logging
from collections.abc import Mapping
from typing import Any

import anyio
import pyarrow as pa

from streamfit.exceptions import BadInputError, SourceError
from streamfit.sources._base import Position, Source, SourceBatch, position_int
from streamfit.sources.decoders import Decoder, _one_batch, get_decoder

__all__ = ["KafkaSource"]

_log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("streamfit.sources.librdkafka")  # instead of librdkafka's stderr
_FORMAT = '{"topic": str, "partitions": {"<partition>": {"offset": int, "row": int}}}'


def _import_kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("KafkaSource needs confluent-kafka: pip install 'streamfit[kafka]'") from exc
    return confluent_kafka


class KafkaSource(Source):
    """Messages of ``topic`` read by consumer group ``group``; never ends until closed.

    Position ``{"topic": t, "partitions": {"0": {"offset": o, "row": r}, ...}}``: in each partition every
    message before offset ``o`` is done and the first ``r`` rows of message ``o`` are.  :meth:`seek`
    positions win over the group's committed offsets (applied when a partition is first assigned);
    :meth:`commit` commits offset ``o`` per partition, so a partly consumed message is read again by a
    new consumer unless it seeks.  Consecutive small messages of one partition (JSON lines...) are
    concatenated up to ``coalesce_rows`` rows, larger ones pass without a copy; an undecodable value
    yields a :class:`SourceBatch` with ``error`` (reason ``"undecodable"``) and is skipped.  ``config``
    is passed to librdkafka (``session.timeout.ms``, ``fetch.wait.max.ms``, security...).
    Partitions revoked by a rebalance leave the position: their owner continues from the group offsets.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, group: str, decoder: str | Decoder = "ipc",
                 config: Mapping[str, Any] | None = None, max_messages: int = 500, poll_timeout: float = 0.02,
                 coalesce_rows: int = 1024) -> None:
        self._kafka = _import_kafka()
        if not topic or not isinstance(topic, str):
            raise ValueError(f"Invalid topic: {topic!r}")
        if not group or not isinstance(group, str):
            raise ValueError(f"Invalid consumer group: {group!r}")
        if not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"Invalid max_messages: {max_messages!r}, expected an int >= 1")
        if not poll_timeout > 0:
            raise ValueError(f"Invalid poll_timeout: {poll_timeout!r}, expected seconds > 0")
        if not isinstance(coalesce_rows, int) or coalesce_rows < 0:
            raise ValueError(f"Invalid coalesce_rows: {coalesce_rows!r}, expected an int >= 0")
        conf = {"bootstrap.servers": bootstrap_servers, "group.id": group, "auto.offset.reset": "earliest",
                "enable.auto.commit": False, "enable.auto.offset.store": False,
                # a trainer wants data as soon as it is there: librdkafka's default lets a fetch wait up to
                # 500 ms for more bytes, which starved the training loop (3x fewer rows/s measured here)
                "fetch.wait.max.ms": 10}
        conf.update(config or {})
        if str(conf["enable.auto.commit"]).lower() not in ("false", "0"):
            raise ValueError("KafkaSource commits itself what is trained: enable.auto.commit must stay false")
        self.topic, self.group, self.config = topic, group, conf
        self.decoder = get_decoder(decoder)
        self.max_messages, self.poll_timeout, self.coalesce_rows = max_messages, poll_timeout, coalesce_rows
        strategy = str(conf.get("partition.assignment.strategy", "")) + str(conf.get("group.protocol", ""))
        self._incremental = "cooperative" in strategy or "consumer" in strategy
        self._consumer: Any = None
        self._lock: anyio.Lock | None = None
        self._queue: collections.deque[SourceBatch] = collections.deque()
        self._live: dict[int, tuple[int, int]] = {}  # partition -> (offset, row) after the last batch
        self._seek_offsets: dict[int, int] = {}  # applied on the first assignment of each partition
        self._pending_skip: dict[int, tuple[int, int]] = {}  # partition -> (offset, rows to skip in it)

    # -- position ---------------------------------------------------------------------------------
    def seek(self, position: Position) -> None:
        """Resume at a position: its offsets override the group's, rows inside a message are skipped."""
        self._check_seek_allowed()
        parts = position.get("partitions") if isinstance(position, Mapping) else None
        if not isinstance(parts, Mapping) or position.get("topic") != self.topic:
            raise ValueError(f"KafkaSource({self.topic}): invalid position {position!r}, expected {_FORMAT}")
        for key, value in parts.items():
            if not str(key).isdigit() or not isinstance(value, Mapping):
                raise ValueError(f"KafkaSource: invalid partition entry {key!r}: {value!r} in position")
            offset = position_int(value, "offset", "KafkaSource", _FORMAT)
            row = position_int(value, "row", "KafkaSource", _FORMAT)
            self._live[int(key)] = (offset, row)
            self._seek_offsets[int(key)] = offset
            if row:
                self._pending_skip[int(key)] = (offset, row)

    def _snapshot(self, live: Mapping[int, tuple[int, int]]) -> Position:
        return {"topic": self.topic,
                "partitions": {str(p): {"offset": o, "row": r} for p, (o, r) in sorted(live.items())}}

    # -- consumer in the worker thread -----------------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            if tp.topic == self.topic and tp.partition in self._seek_offsets:
                tp.offset = self._seek_offsets.pop(tp.partition)
        (consumer.incremental_assign if self._incremental else consumer.assign)(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            if tp.topic == self.topic:
                self._live.pop(tp.partition, None)
                self._pending_skip.pop(tp.partition, None)
        if self._incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _create(self) -> Any:
        try:
            consumer = self._kafka.Consumer(self.config, logger=_librdkafka_log)
            consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                               on_lost=self._on_revoke)
        except self._kafka.KafkaException as exc:
            raise SourceError(f"cannot start a Kafka consumer for topic {self.topic!r}: {exc}") from exc
        return consumer

    def _fetch(self) -> list[SourceBatch]:
        """One ``consume`` call turned into batches; positions advance as they are built."""
        kafka = self._kafka
        try:
            messages = self._consumer.consume(self.max_messages, self.poll_timeout)
        except kafka.KafkaException as exc:
            raise SourceError(f"Kafka consume from {self.topic!r} failed: {exc}") from exc
        out: list[SourceBatch] = []
        group: list[tuple[int, int, int, pa.RecordBatch]] = []  # (partition, offset, skipped, batch)
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._handle_error(err)
                continue
            partition, offset = msg.partition(), msg.offset()
            skip_at = self._pending_skip.pop(partition, None)
            try:
                batch = self.decoder(msg.value() or b"")
                if isinstance(batch, pa.Table):
                    batch = _one_batch(batch)
                if not isinstance(batch, pa.RecordBatch):
                    raise TypeError(f"decoder returned {type(batch).__name__}, expected a RecordBatch")
            except Exception as exc:  # any decoder failure marks the message bad, the stream goes on
                self._flush(group, out)
                out.append(self._error_batch(partition, offset, exc))
                continue
            if skip_at is not None and skip_at[0] == offset:
                batch = batch.slice(min(skip_at[1], batch.num_rows))
                skip_rows = skip_at[1]
            else:
                skip_rows = 0
            if group and (group[0][0] != partition or not group[0][3].schema.equals(batch.schema)
                          or sum(g[3].num_rows for g in group) + batch.num_rows > self.coalesce_rows):
                self._flush(group, out)
            group.append((partition, offset, skip_rows, batch))
        self._flush(group, out)
        return out

    def _handle_error(self, err: Any) -> None:
        kafka = self._kafka
        if err.code() == kafka.KafkaError._PARTITION_EOF:
            return
        fatal_codes = (kafka.KafkaError.UNKNOWN_TOPIC_OR_PART, kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                       kafka.KafkaError.GROUP_AUTHORIZATION_FAILED)
        if err.fatal() or err.code() in fatal_codes:
            cause = kafka.KafkaException(err)
            raise SourceError(f"Kafka error on topic {self.topic!r}: {err.str()}") from cause
        _log.warning("Kafka (topic %s): %s", self.topic, err.str())

    def _error_batch(self, partition: int, offset: int, exc: Exception) -> SourceBatch:
        live = dict(self._live)
        self._live[partition] = live[partition] = (offset + 1, 0)
        where = f"partition {partition} offset {offset}"
        error = BadInputError(f"undecodable message in {self.topic!r} {where}: {exc}", reason="undecodable",
                              position={"topic": self.topic, "partition": partition, "offset": offset})
        return SourceBatch(None, lambda r: self._snapshot(live), error=error, where=where,
                           meta={"partition": partition, "offset": offset})

    def _flush(self, group: list[tuple[int, int, int, pa.RecordBatch]], out: list[SourceBatch]) -> None:
        """Turn the pending messages of one partition into one batch whose positions map rows to messages."""
        if not group:
            return
        partition = group[0][0]
        offsets, skips, batches = [g[1] for g in group], [g[2] for g in group], [g[3] for g in group]
        group.clear()
        before = dict(self._live)
        self._live[partition] = (offsets[-1] + 1, 0)
        starts = [0]
        for b in batches[:-1]:
            starts.append(starts[-1] + b.num_rows)
        total = starts[-1] + batches[-1].num_rows
        if total == 0:
            return
        batch = batches[0] if len(batches) == 1 else _concat(batches)
        snapshot = self._snapshot

        def position_at(r: int) -> Position:
            live = dict(before)
            if r >= total:
                live[partition] = (offsets[-1] + 1, 0)
            else:
                k = bisect.bisect_right(starts, r) - 1
                live[partition] = (offsets[k], skips[k] + r - starts[k])
            return snapshot(live)

        last = f"..{offsets[-1]}" if len(offsets) > 1 else ""
        where = f"partition {partition} offset {offsets[0]}{last}"
        out.append(SourceBatch(batch, position_at, where=where,
                               meta={"partition": partition, "first_offset": offsets[0],
                                     "last_offset": offsets[-1]}))

    # -- async API --------------------------------------------------------------------------------
    async def _ensure_consumer(self) -> anyio.Lock:
        if self._lock is None:
            self._mark_opened()
            self._lock = anyio.Lock()
            with anyio.CancelScope(shield=True):  # creating the consumer is quick and must not half-happen
                self._consumer = await anyio.to_thread.run_sync(self._create)
        return self._lock

    async def __anext__(self) -> SourceBatch:
        lock = await self._ensure_consumer()
        while not self._queue:
            async with lock:
                if self._closed:
                    raise RuntimeError(f"KafkaSource({self.topic}) is closed")
                # shielded: a cancellation waits for the poll (<= poll_timeout) instead of dropping messages
                # already consumed (positions have moved past them)
                with anyio.CancelScope(shield=True):
                    self._queue.extend(await anyio.to_thread.run_sync(self._fetch))
        return self._queue.popleft()

    async def commit(self, position: Position) -> None:
        """Commit to the group, per partition, the offset of the first message not fully consumed."""
        parts = position.get("partitions") if isinstance(position, Mapping) else None
        if not isinstance(parts, Mapping) or position.get("topic") != self.topic:
            raise ValueError(f"KafkaSource({self.topic}): invalid position {position!r}, expected {_FORMAT}")
        offsets = [self._kafka.TopicPartition(self.topic, int(p),
                                              position_int(v, "offset", "KafkaSource", _FORMAT))
                   for p, v in parts.items()]
        if not offsets:
            return
        lock = await self._ensure_consumer()
        async with lock:
            if self._closed:
                raise RuntimeError(f"KafkaSource({self.topic}) is closed")
            try:
                await anyio.to_thread.run_sync(
                    lambda: self._consumer.commit(offsets=offsets, asynchronous=False))
            except self._kafka.KafkaException as exc:
                raise SourceError(f"Kafka commit to group {self.group!r} failed: {exc}") from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        if self._lock is not None:
            async with self._lock:
                self._closed = True
                consumer, self._consumer = self._consumer, None
                if consumer is not None:
                    try:
                        await anyio.to_thread.run_sync(consumer.close)
                    except (self._kafka.KafkaException, RuntimeError) as exc:
                        raise SourceError(f"closing the Kafka consumer of {self.topic!r} failed: "
                                          f"{exc}") from exc
        await super().aclose()


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if hasattr(pa, "concat_batches"):
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
