"""The Runner on a topic of several partitions: a checkpoint written while a partition is away (another member
of the group holds it) resumes every partition exactly where it was trained.

Seen before the fix: the final checkpoint's position named only the partition the learner held when it
stopped, so the resumed run read the other one from the group's committed offset (none: its earliest) and
trained its rows twice (2560 rows where the topic held 2048: its 512 rows twice).
"""

from __future__ import annotations

import anyio
import pytest

from streamfit import OnnxRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.sources import KafkaSource
from tests.daemon.helpers import record_batches, write_model
from tests.kafka_group import GroupMember

pytestmark = pytest.mark.kafka

MESSAGES = 4  # per partition and round; 128 rows each


def _estimator(model):  # type: ignore[no-untyped-def]
    return OnnxRegressor(str(model), optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None,
                         batch_size=64, threads=1)


async def _until(predicate, runner: Runner, what: str, seconds: float = 60) -> None:  # type: ignore[no-untyped-def]
    with anyio.move_on_after(seconds):
        while not predicate():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"waited {seconds} s for {what}: {runner.rows} rows trained, position {runner.position}")


def test_a_final_checkpoint_while_a_partition_is_away_resumes_exactly_once(tmp_path, kafka_broker):
    topic = kafka_broker.create_topic(partitions=2)
    group = f"g-{topic}"
    batches = record_batches(files=4, rows=512)  # 16 messages of 128 rows: 4 per partition and round
    rounds = [batches[:2 * MESSAGES], batches[2 * MESSAGES:]]
    for p in (0, 1):
        kafka_broker.produce_batches(topic, rounds[0][p::2], partition=p)
    model = write_model(tmp_path)
    member = GroupMember(kafka_broker, topic, group)

    def source(until_eof: bool = False) -> KafkaSource:
        return KafkaSource(kafka_broker.bootstrap, topic, group=group, config=kafka_broker.consumer_config,
                           until_eof=until_eof)

    # checkpoints only when stopped: nothing is committed before, the group's offsets lag behind everything
    first = Runner(_estimator(model), source, checkpoint_dir=tmp_path / "ck", every_batches=10_000,
                   batch_size=64)

    async def run_first():  # type: ignore[no-untyped-def]
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            async def drive() -> None:
                await _until(lambda: first.rows >= 2 * MESSAGES * 128, first, "both partitions' first round")
                member.start()  # takes one partition away
                await _until(member.is_assigned.is_set, first, "the other member's assignment")
                await anyio.sleep(1.5)  # the learner's assignment settles
                (away,) = member.assigned
                kafka_broker.produce_batches(topic, rounds[1][1 - away::2], partition=1 - away)
                await _until(lambda: first.rows >= 3 * MESSAGES * 128, first, "the kept partition's second round")
                stop.set()  # the final checkpoint: written while the other partition is away
            tg.start_soon(drive)
            return await first.run(stop)

    try:
        summary = anyio.run(run_first)
    finally:
        member.stop.set()
        member.join(30)
    (away,) = member.assigned
    assert summary.rows == 3 * MESSAGES * 128
    kafka_broker.produce_batches(topic, rounds[1][away::2], partition=away)  # its second round, read by no one
    saved = CheckpointStore(tmp_path / "ck").load_latest().meta["position"]["partitions"]
    assert saved == {str(1 - away): {"offset": 2 * MESSAGES, "row": 0}, str(away): {"offset": MESSAGES, "row": 0}}

    again = Runner(_estimator(model), lambda: source(until_eof=True), checkpoint_dir=tmp_path / "ck",
                   resume=True, batch_size=64)
    async def run_again():  # type: ignore[no-untyped-def]
        with anyio.fail_after(60):  # ends at both partitions' ends
            return await again.run()

    second = anyio.run(run_again)
    assert second.rows_this_run == MESSAGES * 128, (
        f"resumed: {second.rows_this_run} rows trained, {MESSAGES * 128} left in partition {away}")
    assert second.rows == len(batches) * 128
    assert second.position["partitions"] == {str(p): {"offset": 2 * MESSAGES, "row": 0} for p in (0, 1)}
