"""A rebalance that takes a partition away and gives it back must not replay what the source already returned.

Seen before on tansu: a resumed Runner (its checkpoint's offsets ahead of the group's committed ones) lost its
partition to a session timeout (SESSTMOUT, librdkafka's ``on_lost``) and got it back at the group's stale
offset, so it trained rows again (896 rows where 384 were left).  Here a second member of the group joins and
leaves, which revokes and reassigns the partition the same way.
"""

from __future__ import annotations

import time

import anyio
import numpy as np
import pyarrow as pa
import pytest

from streamfit.sources import KafkaSource

pytestmark = pytest.mark.kafka

MESSAGES, ROWS = 10, 64


def _batches() -> list[pa.RecordBatch]:
    return [pa.record_batch({"i": np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)}) for k in range(MESSAGES)]


def test_a_partition_given_back_after_a_rebalance_resumes_where_the_source_was(kafka_broker):
    from confluent_kafka import Consumer

    topic = kafka_broker.create_topic(partitions=1)
    batches = _batches()
    kafka_broker.produce_batches(topic, batches[:7], partition=0)
    group = f"g-{topic}"
    config = {**kafka_broker.consumer_config}

    async def main() -> list[int]:
        # the group's committed offset is 2 (an older checkpoint's), the run resumes at offset 5 (its newest)
        first = KafkaSource(kafka_broker.bootstrap, topic, group=group, config=config, coalesce_rows=0)
        seen = [await first.__anext__() for _ in range(2)]
        await first.commit(seen[-1].position_at(seen[-1].num_rows))
        await first.aclose()
        source = KafkaSource(kafka_broker.bootstrap, topic, group=group, config=config, coalesce_rows=0)
        source.seek({"topic": topic, "partitions": {"0": {"offset": 5, "row": 0}}})
        rows: list[int] = []
        for _ in range(2):  # offsets 5 and 6: the end of the topic for now
            rows += (await source.__anext__()).batch.column("i").to_pylist()
        # another member joins (the partition is revoked, maybe handed to it), then leaves (handed back)
        other = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group,
                          "enable.auto.commit": False, "auto.offset.reset": "earliest", **config})
        other.subscribe([topic])
        deadline = time.monotonic() + 3  # tansu may hold the join longer: its leaving rebalances too
        while time.monotonic() < deadline and not other.assignment():
            other.poll(0.1)
            await anyio.sleep(0)
        other.close()
        await anyio.sleep(4)  # the source's fetch thread keeps polling: the rebalance completes meanwhile
        kafka_broker.produce_batches(topic, batches[7:], partition=0)
        with anyio.move_on_after(8):
            while len(rows) < (MESSAGES - 5) * ROWS + 5 * ROWS:  # stops early on the expected rows + 2 s
                rows += (await source.__anext__()).batch.column("i").to_pylist()
                if rows[-1] == MESSAGES * ROWS - 1:
                    with anyio.move_on_after(2):  # nothing may follow
                        rows += (await source.__anext__()).batch.column("i").to_pylist()
                    break
        await source.aclose()
        return rows

    rows = anyio.run(main)
    assert rows == list(range(5 * ROWS, MESSAGES * ROWS)), (
        f"read {len(rows)} rows from offset 5 on, expected {(MESSAGES - 5) * ROWS} (rows {rows[0]}..{rows[-1]}, "
        f"repeated: {len(rows) - len(set(rows))})")


def _stalling(broker, topic: str, group: str, **options) -> KafkaSource:  # type: ignore[no-untyped-def]
    """A source that leaves its group once nothing calls librdkafka's consume for 2 s (max.poll.interval.ms):
    its next fetch rejoins, and the rebalance revokes (on_lost) and re-assigns the partition, as a session
    timeout under load does."""
    config = {**broker.consumer_config, "max.poll.interval.ms": 2000}
    return KafkaSource(broker.bootstrap, topic, group=group, config=config, coalesce_rows=0, max_messages=1,
                       **options)


async def _rows_until(source: KafkaSource, last: int) -> list[int]:
    rows: list[int] = []
    with anyio.fail_after(30):
        while not rows or rows[-1] < last:
            rows += (await source.__anext__()).batch.column("i").to_pylist()
    return rows


def _left_the_group(caplog: pytest.LogCaptureFixture) -> bool:
    return any("maximum poll interval" in r.getMessage() for r in caplog.records)


def test_a_rebalance_before_the_first_batch_gives_the_partition_back_at_the_seek_position(kafka_broker, caplog):
    # a resumed learner at the end of what the topic holds (its checkpoint at offset 7, the group's offset
    # older: none here) loses its partition before it got a batch; given back, it started at the group's
    # offset and re-read offsets 0-6 (trained before the restart)
    topic = kafka_broker.create_topic(partitions=1)
    batches = _batches()
    kafka_broker.produce_batches(topic, batches[:7], partition=0)

    async def main() -> list[int]:
        source = _stalling(kafka_broker, topic, f"g-{topic}", fetch_ahead=0)
        source.seek({"topic": topic, "partitions": {"0": {"offset": 7, "row": 0}}})
        async with source:
            with anyio.move_on_after(2.5):  # assigned at offset 7 (tansu holds the join ~1 s): nothing to read
                await source.__anext__()
            await anyio.sleep(3)  # no consume call: the consumer leaves the group
            kafka_broker.produce_batches(topic, batches[7:], partition=0)
            return await _rows_until(source, MESSAGES * ROWS - 1)

    rows = anyio.run(main)
    assert _left_the_group(caplog)
    assert rows == list(range(7 * ROWS, MESSAGES * ROWS)), f"rows {rows[0]}..{rows[-1]}, {len(rows)} read"


def test_a_stalled_resumed_source_given_back_its_partition_continues_mid_message(kafka_broker, caplog):
    # resumed at offset 3 row 4 (the group's offset: none); the caller stalls with batches fetched ahead
    topic = kafka_broker.create_topic(partitions=1)
    kafka_broker.produce_batches(topic, _batches(), partition=0)

    async def main() -> list[int]:
        source = _stalling(kafka_broker, topic, f"g-{topic}", fetch_ahead=3)
        source.seek({"topic": topic, "partitions": {"0": {"offset": 3, "row": 4}}})
        async with source:
            rows = (await source.__anext__()).batch.column("i").to_pylist()
            await anyio.sleep(3.5)
            return rows + await _rows_until(source, MESSAGES * ROWS - 1)

    rows = anyio.run(main)
    assert _left_the_group(caplog)
    assert rows == list(range(3 * ROWS + 4, MESSAGES * ROWS))


def test_a_partition_given_back_continues_at_the_group_offset_when_another_member_read_further(kafka_broker):
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka_broker.create_topic(partitions=1)
    kafka_broker.produce_batches(topic, _batches(), partition=0)
    group = f"g-{topic}"

    async def main() -> list[int]:
        async with _stalling(kafka_broker, topic, group, fetch_ahead=1) as source:
            rows = (await source.__anext__()).batch.column("i").to_pylist()
            await anyio.sleep(3.5)  # out of the group: meanwhile another member reads up to offset 7, commits
            other = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
            try:
                other.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
            finally:
                other.close()
            return rows + await _rows_until(source, MESSAGES * ROWS - 1)

    rows = anyio.run(main)
    # offset 1 was fetched ahead before the rebalance and returned after it (the caller has it); then 7 on
    assert rows == list(range(0, 2 * ROWS)) + list(range(7 * ROWS, MESSAGES * ROWS))


def test_a_session_timeout_before_the_first_batch_is_returned_keeps_the_rows_to_skip_in_the_message():
    # the daemon's 8256 rows where 8192 were in the topic (one partition, 128-row messages): a resumed serve
    # at offset o row 64, the group committed at o; while its model was being built (no batch taken yet) the
    # consumer's session timed out (librdkafka's on_lost); given back at the group's offset o, message o was
    # trained whole.  Here the broker (this test's own) stops answering for longer than the session timeout.
    import os
    import signal

    from confluent_kafka import Consumer, TopicPartition

    from streamfit.testing import LocalKafkaBroker

    with LocalKafkaBroker() as broker:
        topic = broker.create_topic(partitions=1)
        broker.produce_batches(topic, _batches(), partition=0)
        other = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g"})
        try:
            other.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        finally:
            other.close()

        async def main() -> list[int]:
            # fetch_ahead: the fetch thread keeps consuming while the caller takes nothing
            source = KafkaSource(broker.bootstrap, topic, group="g", config=broker.consumer_config,
                                 coalesce_rows=0, max_messages=1, fetch_ahead=100)
            source.seek({"topic": topic, "partitions": {"0": {"offset": 3, "row": 32}}})
            async with source:
                await source._ensure_consumer()
                with anyio.fail_after(20):
                    while source._fetched < 1:  # message 3 fetched (its first 32 rows skipped), not returned
                        await anyio.sleep(0.01)
                os.kill(broker.proc.pid, signal.SIGSTOP)
                try:
                    await anyio.sleep(3.5)  # session.timeout.ms is 2000
                finally:
                    os.kill(broker.proc.pid, signal.SIGCONT)
                return await _rows_until(source, MESSAGES * ROWS - 1)

        rows = anyio.run(main)
        assert rows == list(range(3 * ROWS + 32, MESSAGES * ROWS)), f"{len(rows)} rows from {rows[0]}"
