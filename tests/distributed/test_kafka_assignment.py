"""KafkaSource's explicit partition assignment and end-of-partition stop (what the coordinator relies on)."""

from __future__ import annotations

import anyio
import numpy as np
import pyarrow as pa
import pytest

from streamfit.exceptions import SourceError
from streamfit.sources import KafkaSource

pytestmark = pytest.mark.kafka


def _batches(start: int, n: int, rows: int = 10) -> list[pa.RecordBatch]:
    return [pa.record_batch({"rid": np.arange(start + i * rows, start + (i + 1) * rows, dtype=np.int64)})
            for i in range(n)]


async def _read(source: KafkaSource) -> tuple[list[int], dict]:
    ids: list[int] = []
    position = None
    async with source:
        async for sb in source:
            ids += sb.batch.column("rid").to_pylist()
            position = sb.position_at(sb.num_rows)
    return ids, position


@pytest.mark.parametrize("fetch_ahead", [1, 0])
def test_assigned_partitions_are_read_to_their_end_then_committed(kafka_broker, fetch_ahead) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    kafka_broker.produce_batches(topic, _batches(0, 5), partition=0)
    kafka_broker.produce_batches(topic, _batches(1000, 7), partition=1)
    config = dict(kafka_broker.consumer_config)

    def source(**kw):
        return KafkaSource(kafka_broker.bootstrap, topic, group="g", config=config, fetch_ahead=fetch_ahead,
                           partitions=[1], until_eof=True, **kw)

    ids, position = anyio.run(_read, source())
    assert ids == list(range(1000, 1070))  # partition 1 only, all of it, then the stream ended
    assert position == {"topic": topic, "partitions": {"1": {"offset": 7, "row": 0}}}

    async def commit_mid() -> None:
        s = source()
        async with s:
            await s.__anext__()
            await s.commit({"topic": topic, "partitions": {"1": {"offset": 3, "row": 0}}})

    anyio.run(commit_mid)
    ids, _ = anyio.run(_read, source())  # a new consumer starts at the group's committed offset
    assert ids == list(range(1030, 1070))

    resumed = source()
    resumed.seek({"topic": topic, "partitions": {"1": {"offset": 5, "row": 4}}})  # a position wins
    ids, _ = anyio.run(_read, resumed)
    assert ids == list(range(1054, 1070))


def test_unknown_partition_is_refused(kafka_broker) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    source = KafkaSource(kafka_broker.bootstrap, topic, group="g", config=kafka_broker.consumer_config,
                         partitions=[0, 5], until_eof=True)
    with pytest.raises(SourceError, match="not \\[5\\]"):
        anyio.run(_read, source)
    with pytest.raises(ValueError, match="partitions"):
        KafkaSource(kafka_broker.bootstrap, topic, group="g", partitions=[0, 0])
