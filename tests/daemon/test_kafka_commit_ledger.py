"""A resume from an older checkpoint than the newest committed one (that one lost) trains every row after it.

Seen before the commit ledger: a run checkpoints A, then B, and commits B's offsets to the group; B is then
found corrupt and set aside, so the run resumes from A.  The group's committed offset (B's) is ahead of A's
position and won, as if another member had trained the rows in between: the resumed model lacked them (0 rows
trained where 512 were left after A).  With the ledger the learner knows the offset is its own: it trains
them again.  An offset another member committed (not in the ledger) still wins.
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from streamfit import OnnxRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.sources import KafkaSource
from tests.daemon.helpers import record_batches, write_model
from tests.kafka_group import committed_offset

pytestmark = pytest.mark.kafka

MESSAGES = 16  # of 128 rows: 2048 rows, 32 batches of 64; checkpoints every 8 batches = every 4 messages


def _estimator(model):  # type: ignore[no-untyped-def]
    return OnnxRegressor(str(model), optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None,
                         batch_size=64, threads=1)


def _commit_as_another_member(broker, topic: str, group: str, offset: int) -> None:  # type: ignore[no-untyped-def]
    """Another member of the group (none is active now) trained partition 0 up to ``offset`` and committed it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


@pytest.mark.parametrize("other_member", [False, True], ids=["own-commit", "another-members-commit"])
def test_resuming_from_an_older_checkpoint_than_the_lost_committed_one(tmp_path, kafka_broker, other_member):
    topic = kafka_broker.create_topic(partitions=1)
    group = f"g-{topic}"
    kafka_broker.produce_batches(topic, record_batches(files=4, rows=512), partition=0)
    model = write_model(tmp_path)
    ck = tmp_path / "ck"

    def source() -> KafkaSource:
        return KafkaSource(kafka_broker.bootstrap, topic, group=group, config=kafka_broker.consumer_config,
                           until_eof=True)

    async def run(runner: Runner):  # type: ignore[no-untyped-def]
        with anyio.fail_after(60):  # ends at the partition's end
            return await runner.run()

    first = anyio.run(run, Runner(_estimator(model), source, checkpoint_dir=ck, every_batches=8, batch_size=64))
    assert first.rows == MESSAGES * 128
    store = CheckpointStore(ck)
    infos = store.list()
    b = infos[-1]  # B: the final one
    offsets = {i.path.name: store.load(i.path.name).meta["position"]["partitions"]["0"]["offset"] for i in infos}
    # A: the newest checkpoint with room for another member's offset between it and B (checkpoints are due
    # every 8 batches, but one in flight delays the next, so where they fall depends on the machine's speed)
    earlier = [i for i in infos[:-1] if offsets[i.path.name] <= MESSAGES - 2]
    assert earlier, f"no checkpoint at least 2 messages before the end: {offsets}"
    a = earlier[-1]
    a_rows, a_offset = store.load(a.path.name).meta["rows"], offsets[a.path.name]
    assert b.step == 32 and 0 < a_rows < MESSAGES * 128
    uninterrupted = store.load(b.path.name).arrays
    assert committed_offset(kafka_broker, topic, group) == MESSAGES  # B's offsets are the group's
    for lost in infos[infos.index(a) + 1:]:  # B (and any after A) is lost: the resume falls back to A
        blob = bytearray((lost.path / "state.npz").read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        (lost.path / "state.npz").write_bytes(bytes(blob))
    theirs = (a_offset + 1 + MESSAGES) // 2  # after A, before B
    assert a_offset < theirs < MESSAGES
    if other_member:  # the group's offset is now another member's (it trained the messages before it)
        _commit_as_another_member(kafka_broker, topic, group, theirs)

    est = _estimator(model)
    again = anyio.run(run, Runner(est, source, checkpoint_dir=ck, resume=True, batch_size=64))
    assert again.resumed_from == str(a.path)
    if other_member:  # the other member's commit wins: its rows are not trained again
        assert again.rows_this_run == (MESSAGES - theirs) * 128, (
            f"{again.rows_this_run} rows trained after A, {(MESSAGES - theirs) * 128} after the other member's")
        return
    assert again.rows_this_run == MESSAGES * 128 - a_rows, (
        f"resumed from A (row {a_rows}) with B's offsets committed: {again.rows_this_run} rows trained, "
        f"{MESSAGES * 128 - a_rows} left after A")
    assert again.rows == first.rows and again.position == {"topic": topic,
                                                          "partitions": {"0": {"offset": MESSAGES, "row": 0}}}
    resumed = CheckpointStore(ck).load_latest().arrays  # the rows after A trained once more, in the same order
    for name, value in uninterrupted.items():
        np.testing.assert_allclose(resumed[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_an_unreadable_ledger_is_set_aside_and_counts_nothing_as_own(tmp_path, caplog):
    from streamfit.daemon.commit_ledger import RunCommitLedger
    from streamfit.sources._commits import GroupCommit

    ledger = RunCommitLedger(tmp_path)
    ledger.record(GroupCommit("t", "g", {0: 8}))
    path = tmp_path / "kafka-commits.json"
    path.write_bytes(path.read_bytes()[:-3])  # a torn write (it is written atomically: a disk fault, an edit)
    with caplog.at_level("WARNING"):
        assert RunCommitLedger(tmp_path).own_offsets("t", "g", 0) == frozenset()
    assert (tmp_path / "kafka-commits.json.corrupt").is_file() and not path.exists()
    assert any("kafka-commits.json unreadable" in r.getMessage() and "set aside" in r.getMessage()
               for r in caplog.records)
