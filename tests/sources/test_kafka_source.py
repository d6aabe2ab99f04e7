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
        await first.commit(partial)  # a partly consumed message is not committed past; its row travels
    async with _source(kafka_broker, topic, "g-commit", coalesce_rows=0) as second:
        assert _ids(await _read(second, 26)) == list(range(24, 50))


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
        # the group's committed offsets lag behind (an older checkpoint's): the position wins (a group offset
        # further on wins over it: another member trained those rows, tests/sources/test_kafka_partitions_away.py)
        await first.commit({"topic": topic, "partitions": {p: {"offset": 0, "row": 0} for p in position["partitions"]}})
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


def _trace(items: list[SourceBatch]) -> list[tuple]:
    """What a reader sees: rows, and the positions before, inside and after each batch."""
    return [(i.batch.column("id").to_pylist(), i.position_at(0), i.position_at(i.num_rows // 2),
             i.position_at(i.num_rows)) for i in items]


async def test_fetch_ahead_holds_a_bounded_number_of_messages_and_positions_are_exact(kafka_broker, ids_table) -> None:
    topic = kafka_broker.create_topic()
    kafka_broker.produce_batches(topic, [ids_table(i, i + 10) for i in range(0, 200, 10)])  # 20 messages
    opts = {"max_messages": 2, "coalesce_rows": 0}  # one batch per message, at most 2 per consume call
    async with _source(kafka_broker, topic, "g-ahead-0", fetch_ahead=0, **opts) as on_demand:
        expected = _trace(await _read(on_demand, 200))
    for ahead in (1, 3):
        async with _source(kafka_broker, topic, f"g-ahead-{ahead}", fetch_ahead=ahead, **opts) as source:
            first = await source.__anext__()
            await anyio.sleep(0.5)  # a reader that stalls: the thread fetches ahead, then waits
            held = len(source._ahead)
            assert 1 <= held <= (1 + ahead) * 2 - 1  # the rest of the fetch being read + `ahead` fetches
            assert source._fetched - source._taken == ahead
            got = [first] + await _read(source, 190)
        assert _trace(got) == expected  # same rows, same positions, in the same order


@pytest.mark.parametrize("ahead", [0, 1])
async def test_cancelled_reads_lose_no_row_with_and_without_fetch_ahead(kafka_broker, ids_table,
                                                                        collect_ids_cancelling, ahead) -> None:
    topic = kafka_broker.create_topic(partitions=2)
    kafka_broker.produce_batches(topic, [ids_table(i, i + 5) for i in range(0, 100, 5)])
    async with _source(kafka_broker, topic, f"g-cancel-{ahead}", poll_timeout=0.05, fetch_ahead=ahead) as source:
        assert sorted(await collect_ids_cancelling(source, 100, every=0.003)) == list(range(100))


async def test_commit_while_fetching_ahead_and_close_with_a_full_buffer(kafka_broker, ids_table) -> None:
    topic = kafka_broker.create_topic()
    kafka_broker.produce_batches(topic, [ids_table(i, i + 10) for i in range(0, 100, 10)])
    async with _source(kafka_broker, topic, "g-ahead-commit", coalesce_rows=0, max_messages=1) as first:
        items = await _read(first, 30)
        with anyio.fail_after(5):
            await first.commit(items[-1].position_at(10))  # the fetch thread runs it between two consumes
        thread = first._thread
        assert thread is not None and thread.is_alive()
    assert not thread.is_alive()  # closing stopped the thread (it was waiting for room)
    async with _source(kafka_broker, topic, "g-ahead-commit", coalesce_rows=0) as second:
        assert _ids(await _read(second, 70)) == list(range(30, 100))


class _FakeTopicPartition:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition


class _FakeConsumer:
    def __init__(self) -> None:
        self.unassigned = False

    def unassign(self) -> None:
        self.unassigned = True


def test_a_rebalance_drops_revoked_batches_fetched_ahead_and_keeps_their_partition_where_it_was_returned(
        ids_table) -> None:
    from streamfit.sources._kafka_position import PartitionPosition

    source = KafkaSource("127.0.0.1:1", "t", group="g")
    source._returned[1] = PartitionPosition(7)  # the caller has partition 1 up to offset 7 (trained)
    built = []
    for partition, offset in ((0, 5), (1, 7), (0, 6)):  # fetched ahead, not returned yet
        source._live[partition] = PartitionPosition(offset)
        source._flush([(partition, offset, 0, ids_table(0, 3).to_batches()[0])], built)
    source._ahead.extend((1, sb, live) for sb, live in built)
    source._on_revoke(_FakeConsumer(), [_FakeTopicPartition("t", 1)])
    kept = [sb for _, sb, _ in source._ahead]
    assert [sb.meta["partition"] for sb in kept] == [0, 0]
    # partition 1 stays in every position at offset 7 (its batch from 7 on was dropped: never trained)
    assert kept[0].position_at(3) == {"topic": "t", "partitions": {"0": {"offset": 6, "row": 0},
                                                                  "1": {"offset": 7, "row": 0}}}
    assert kept[1].position_at(1) == {"topic": "t", "partitions": {"0": {"offset": 6, "row": 1},
                                                                  "1": {"offset": 7, "row": 0}}}
    assert source._live[1] == PartitionPosition(7)
    # a partition of which nothing was returned (nor sought) leaves the positions: nothing of it was trained
    source._on_revoke(_FakeConsumer(), [_FakeTopicPartition("t", 0)])
    assert 0 not in source._live and source._live[1] == PartitionPosition(7)
