"""Several partitions: a checkpoint written while one of them is away must still say where it was trained.

Seen before the fix: learner A trains both partitions of a topic; a second member joins and takes one of them
(q); A keeps training its other partition and checkpoints there.  That checkpoint's position named only the
partition A held at that moment, so A, restarted from it, read q from the group's committed offset, an older
checkpoint's, and trained q's rows a second time.  Here "trained" is every row a source returned, a
checkpoint is the position after the last one (committed to the group as the daemon does once it is durable),
and a crash is the source closed without anything more.
"""

from __future__ import annotations

import anyio
import numpy as np
import pyarrow as pa
import pytest

from streamfit.sources import KafkaSource
from tests.kafka_group import GroupMember

pytestmark = pytest.mark.kafka

ROWS = 16  # rows per message; message k of partition p holds ids p * 10_000 + k * ROWS + 0..ROWS-1


def _messages(partition: int, first: int, stop: int) -> list[pa.RecordBatch]:
    return [pa.record_batch({"i": np.arange(ROWS, dtype=np.int64) + partition * 10_000 + k * ROWS})
            for k in range(first, stop)]


def _ids(partition: int, first: int, stop: int) -> list[int]:
    return [i for b in _messages(partition, first, stop) for i in b.column("i").to_pylist()]


async def _drain(source: KafkaSource, seconds: float) -> list[tuple[int, list[int]]]:
    """Whatever the source returns within ``seconds`` (its fetch thread keeps polling meanwhile)."""
    got: list[tuple[int, list[int]]] = []
    with anyio.move_on_after(seconds):
        while True:
            sb = await source.__anext__()
            got.append((sb.meta["partition"], sb.batch.column("i").to_pylist()))
    return got


@pytest.mark.parametrize("other_commits", [False, True], ids=["other-member-idle", "other-member-commits"])
def test_a_checkpoint_while_a_partition_is_away_resumes_it_exactly_once(kafka_broker, other_commits, caplog):
    topic = kafka_broker.create_topic(partitions=2)
    group = f"g-{topic}"
    for p in (0, 1):
        kafka_broker.produce_batches(topic, _messages(p, 0, 6), partition=p)
    config = dict(kafka_broker.consumer_config)
    member = GroupMember(kafka_broker, topic, group)

    async def main() -> tuple[list[int], list[int], int, dict]:
        trained: list[int] = []
        source = KafkaSource(kafka_broker.bootstrap, topic, group=group, config=config, coalesce_rows=0,
                             max_messages=1)
        try:
            with anyio.fail_after(20):
                for k in range(12):  # messages 0-5 of both partitions
                    sb = await source.__anext__()
                    trained += sb.batch.column("i").to_pylist()
                    if k == 3:  # an older checkpoint, durable: committed (both partitions behind offset 6)
                        await source.commit(sb.position_at(sb.num_rows))
            member.start()  # takes one partition (q) away from the source
            with anyio.fail_after(20):
                while not member.is_assigned.is_set():
                    trained += [i for _, ids in await _drain(source, 0.2) for i in ids]
            trained += [i for _, ids in await _drain(source, 1.5) for i in ids]  # the source's assignment settles
            (away,) = member.assigned
            kept = 1 - away
            for p in (0, 1):
                kafka_broker.produce_batches(topic, _messages(p, 6, 12), partition=p)
            if other_commits:  # the other member read q up to offset 8 (and trained it): it commits 9
                member.commit_offset = 9
            member.commit_now.set()
            await anyio.to_thread.run_sync(lambda: member.committed.wait(20))
            last = None
            with anyio.fail_after(20):
                while len(trained) < 12 * ROWS + 6 * ROWS:  # messages 6-11 of the partition it kept
                    last = await source.__anext__()
                    assert last.meta["partition"] == kept, "a batch of the partition taken away"
                    trained += last.batch.column("i").to_pylist()
            assert last is not None
            checkpoint = last.position_at(last.num_rows)  # written while q is away
            await source.commit(checkpoint)  # it is durable: the daemon commits it
        finally:
            await source.aclose()  # the learner dies here
            member.stop.set()
            await anyio.to_thread.run_sync(member.join)

        resumed = KafkaSource(kafka_broker.bootstrap, topic, group=group, config=config, coalesce_rows=0,
                              until_eof=True)
        resumed.seek(checkpoint)
        after: list[int] = []
        async with resumed:
            # joining the group again waits for its rebalance: under load (a 2-core CI machine running the suite
            # beside a benchmark) that took over 30 s once; 12 s is the usual whole test
            with anyio.fail_after(90):
                async for sb in resumed:
                    after += sb.batch.column("i").to_pylist()
        return trained, after, away, checkpoint

    trained, after, away, checkpoint = anyio.run(main)
    kept = 1 - away
    expected = _ids(kept, 0, 12) + _ids(away, 0, 6)  # trained before the crash
    assert sorted(trained) == sorted(expected)
    # after it: what the topic holds of q from where q was trained (offset 6), or from where the other member
    # committed it had trained it (offset 9): the later of the two
    rest = _ids(away, 9 if other_commits else 6, 12)
    both = trained + after
    repeated = sorted({i for i in both if both.count(i) > 1})
    theirs = set(_ids(away, 6, 9)) & set(after) if other_commits else set()
    assert sorted(after) == sorted(rest), (
        f"partition {away} (taken away before the checkpoint {checkpoint}): resumed with {len(after)} rows, "
        f"expected {len(rest)}; rows trained twice: {len(repeated)} ({repeated[:3]}...), rows the other member "
        f"had trained: {len(theirs)}, missing: {len(set(rest) - set(after))}")
    said = [r.getMessage() for r in caplog.records if "the group committed offset" in r.getMessage()]
    assert len(said) == other_commits and all(f"[{away}]" in m and "offset 9" in m for m in said)
