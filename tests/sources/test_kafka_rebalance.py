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
