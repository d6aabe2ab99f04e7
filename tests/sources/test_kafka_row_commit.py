"""The row inside a message travels with the group's commit: a new member starts at that row of the message.

Seen before: a learner checkpointed (and committed) the first 40 rows of a 100-row message; the group's
committed offset names only the message (tansu drops commit metadata), so the next member assigned the
partition started at its row 0 and trained those 40 rows again.
"""

from __future__ import annotations

import anyio
import numpy as np
import pyarrow as pa
import pytest

from streamfit.sources import KafkaSource
from streamfit.sources.kafka import ROW_SPAN, ROWS_GROUP_SUFFIX
from tests.kafka_group import committed_offset

pytestmark = pytest.mark.kafka

ROWS = 100


def _messages(count: int) -> list[pa.RecordBatch]:
    return [pa.record_batch({"i": np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)}) for k in range(count)]


def _first_ids(kafka_broker, topic: str, group: str) -> list[int]:  # type: ignore[no-untyped-def]
    async def main() -> list[int]:
        async with KafkaSource(kafka_broker.bootstrap, topic, group=group, config=kafka_broker.consumer_config,
                               coalesce_rows=0) as source:
            with anyio.fail_after(30):
                sb = await source.__anext__()
            return sb.batch.column("i").to_pylist()

    return anyio.run(main)


def test_a_new_member_starts_at_the_committed_row_inside_a_message(kafka_broker):
    topic = kafka_broker.create_topic(partitions=1)
    group = f"g-{topic}"
    kafka_broker.produce_batches(topic, _messages(3), partition=0)

    async def first_member() -> None:
        async with KafkaSource(kafka_broker.bootstrap, topic, group=group, config=kafka_broker.consumer_config,
                               coalesce_rows=0) as source:
            with anyio.fail_after(30):
                sb = await source.__anext__()  # message 0; its first 40 rows trained, then a checkpoint
            await source.commit(sb.position_at(40))

    anyio.run(first_member)
    assert committed_offset(kafka_broker, topic, group) == 0  # the group's offset names the message only
    assert committed_offset(kafka_broker, topic, group + ROWS_GROUP_SUFFIX) == 0 * ROW_SPAN + 40
    ids = _first_ids(kafka_broker, topic, group)
    assert ids[0] == 40 and len(ids) == ROWS - 40, f"the next member started at id {ids[0]} ({len(ids)} rows)"


def test_a_rows_commit_of_another_message_is_ignored(kafka_broker):
    """The rows group ahead of the group's offset (a member killed between the two commits): row 0 of it."""
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka_broker.create_topic(partitions=1)
    group = f"g-{topic}"
    kafka_broker.produce_batches(topic, _messages(3), partition=0)
    for g, offset in ((group + ROWS_GROUP_SUFFIX, 2 * ROW_SPAN + 40), (group, 1)):
        consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": g})
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        consumer.close()
    assert _first_ids(kafka_broker, topic, group)[0] == ROWS  # message 1, row 0
