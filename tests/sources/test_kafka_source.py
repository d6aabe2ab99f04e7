from __future__ import annotations

import anyio
import pytest

from streamfit.sources import KafkaSource, SourceBatch, open_source

pytestmark = [pytest.mark.anyio, pytest.mark.kafka]


def _source(broker, topic: str, group: str, **options) -> KafkaSource:  # type: ignore[no-untyped-def]
    return KafkaSource(broker.bootstrap, topic, group=group, config=broker.consumer_config, **options)


async def _read(source: KafkaSource, rows: int, errors: int = 0) -> list[SourceBatch]:
    """Items until ``rows`` rows and ``errors`` errors arrived (a Kafka source never ends by itself)."""
    items: list[SourceBatch] = []
    with anyio.fail_after(30):
        while sum(i.num_rows for i in items) < rows or sum(i.error is not None for i in items) < errors:
            items.append(await source.__anext__())
    return items


def _ids(items: list[SourceBatch]) -> list[int]:
    return sum((i.batch.column("id").to_pylist() for i in items if i.batch is not None), [])


async def test_consumes_ipc_messages_and_reports_undecodable(kafka_broker, ids_table) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    kafka_broker.produce_batches(topic, [ids_table(i, i + 10) for i in (0, 10, 20)], partition=0)
    kafka_broker.produce(topic, [b"not arrow"], partition=0)  # offset 3
    kafka_broker.produce_batches(topic, [ids_table(30, 40)], partition=0)
    kafka_broker.produce_batches(topic, [ids_table(100, 110), ids_table(110, 120)], partition=1)
    async with _source(kafka_broker, topic, "g-ipc") as source:
        items = await _read(source, 60, errors=1)
    assert sorted(_ids(items)) == list(range(40)) + list(range(100, 120))
    [bad] = [i for i in items if i.error is not None]
    assert (bad.error.reason, bad.meta, bad.where) == ("undecodable", {"partition": 0, "offset": 3},
                                                       "partition 0 offset 3")
    assert bad.error.position == {"topic": topic, "partition": 0, "offset": 3}
    assert bad.position_at(0)["partitions"]["0"] == {"offset": 4, "row": 0}  # moved past the message
    last = items[-1]
    assert last.position_at(last.num_rows) == {
        "topic": topic, "partitions": {"0": {"offset": 5, "row": 0}, "1": {"offset": 2, "row": 0}}}


async def test_commit_then_restart_resumes_after_committed_position(kafka_broker, ids_table) -> None:
    topic = kafka_broker.create_topic()
    kafka_broker.produce_batches(topic, [ids_table(i, i + 10) for i in range(0, 50, 10)])
    async with _source(kafka_broker, topic, "g-commit", coalesce_rows=0) as first:
        items = await _read(first, 25)
        assert [i.num_rows for i in items] == [10, 10, 10]  # coalesce_rows=0: one batch per message
        await first.commit(items[1].position_at(10))
        partial = items[2].position_at(4)
        assert partial["partitions"] == {"0": {"offset": 2, "row": 4}}
        await first.commit(partial)  # a partly consumed message is not committed past
    async with _source(kafka_broker, topic, "g-commit", coalesce_rows=0) as second:
        assert _ids(await _read(second, 30)) == list(range(20, 50))


async def test_seek_mid_message_skips_exactly_the_consumed_rows(kafka_broker, ids_table) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    kafka_broker.produce_batches(topic, [ids_table(i, i + 10) for i in range(0, 40, 10)], partition=0)
    kafka_broker.produce_batches(topic, [ids_table(i, i + 10) for i in range(100, 130, 10)], partition=1)
    everything = list(range(40)) + list(range(100, 130))
    async with _source(kafka_broker, topic, "g-seek") as first:
        items = await _read(first, 1)
        cut = items[-1].num_rows // 2 + 3  # inside the batch, inside one of its messages
        consumed = _ids(items[:-1]) + items[-1].batch.column("id").to_pylist()[:cut]
        position = items[-1].position_at(cut)
        # the group's committed offsets say "all done" where the position has a say: the position wins
        ends = {"0": {"offset": 4, "row": 0}, "1": {"offset": 3, "row": 0}}
        await first.commit({"topic": topic, "partitions": {p: ends[p] for p in position["partitions"]}})
    assert any(p["row"] for p in position["partitions"].values())
    second = _source(kafka_broker, topic, "g-seek")
    second.seek(position)
    async with second:
        rest = _ids(await _read(second, len(everything) - len(consumed)))
    assert sorted(consumed + rest) == everything


async def test_cancelled_reads_lose_no_row(kafka_broker, ids_table, collect_ids_cancelling) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    kafka_broker.produce_batches(topic, [ids_table(i, i + 5) for i in range(0, 100, 5)])
    async with _source(kafka_broker, topic, "g-cancel", poll_timeout=0.05) as source:
        assert sorted(await collect_ids_cancelling(source, 100, every=0.02)) == list(range(100))


async def test_json_lines_from_a_uri_and_bad_json(kafka_broker) -> None:
    topic = kafka_broker.create_topic()
    lines = [b"\n".join(b'{"id": %d, "x": %d.5}' % (i, i) for i in range(k, k + 5)) for k in (0, 5)]
    kafka_broker.produce(topic, [lines[0], b'{"id": oops', lines[1]])
    query = "&".join(f"{k}={v}" for k, v in kafka_broker.consumer_config.items())
    source = open_source(f"kafka://{kafka_broker.bootstrap}/{topic}?group=g-json&decoder=jsonl&{query}")
    assert isinstance(source, KafkaSource) and source.config["session.timeout.ms"] == "2000"
    async with source:
        items = await _read(source, 10, errors=1)
    assert _ids(items) == list(range(10))
    assert [i.meta["offset"] for i in items if i.error is not None] == [1]
