"""Elastic resume on Kafka (issue 22, part 3): a global checkpoint of 2 learners resumed by 3, on a real broker
(tansu, the LocalKafkaBroker fixture) and a real local Ray cluster (one node on 127.0.0.1, started and stopped
here; ~40 s).

The partitions are re-dealt (``p % 3``) with the positions the checkpoint holds for them: partition 2 moves from
learner 0 to the new learner 2 and continues where learner 0 left it; every row is trained once (the merged
scaler counts every row), and the offsets committed at the end are the partitions' ends.  Partition 0 is filled
only after the first run: a partition without a position in the checkpoint is read from its start.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

ray = pytest.importorskip("ray")

from streamfit import LinearRegressor  # noqa: E402
from streamfit.checkpoint import CheckpointStore  # noqa: E402
from streamfit.distributed import DistributedTrainer, LocalRayCluster  # noqa: E402
from tests.distributed._clusters import driven_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.kafka, pytest.mark.timeout(600)]

D = 8
PARTITIONS = 3
ROWS_PER_PARTITION = 6000
ROWS = PARTITIONS * ROWS_PER_PARTITION
BATCH = 100


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    with driven_cluster(nodes=1, cpus=2) as c:
        yield c


def _batches(partition: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(partition)
    w = np.random.default_rng(99).standard_normal(D)
    X = rng.standard_normal((ROWS_PER_PARTITION, D)).astype(np.float32) + partition  # each partition its own mean
    y = (X @ w + 0.5 * rng.standard_normal(ROWS_PER_PARTITION)).astype(np.float32)
    return pa.table({**{f"x{j}": X[:, j] for j in range(D)}, "y": y}).to_batches(max_chunksize=250)


def _committed(kafka_broker: Any, topic: str, group: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                                       timeout=10)]
    finally:
        consumer.close()


def test_kafka_2_then_3_learners_partitions_re_dealt_with_their_positions(cluster, kafka_broker, tmp_path) -> None:
    topic = kafka_broker.create_topic(partitions=PARTITIONS)
    data = {p: _batches(p) for p in range(PARTITIONS)}
    for p in (1, 2):  # partition 0 gets its messages only after the first run: learner 0 reads partition 2 first
        kafka_broker.produce_batches(topic, data[p], partition=p)
    ends = [len(data[p]) for p in range(PARTITIONS)]
    uri = f"kafka://{kafka_broker.bootstrap}/{topic}?group=elastic"
    ckpt = tmp_path / "ckpt"

    def run(workers: int, stop_after: int | None, resume: bool) -> Any:
        stop = threading.Event()
        rounds: list[int] = []

        def on_round(trainer: DistributedTrainer, stats: Any) -> None:
            rounds.append(stats.round)
            if stop_after is not None and len(rounds) >= stop_after:
                stop.set()

        est = LinearRegressor(optimizer="sgd", learning_rate="constant", eta0=0.05, penalty=None)
        return DistributedTrainer(est, uri, workers=workers, sync_every_batches=5, batch_size=BATCH,
                                  checkpoint_dir=ckpt, resume=resume, learner_cpus=0.5, on_round=on_round,
                                  source_options={"config": dict(kafka_broker.consumer_config)}).run(stop)

    first = run(2, 4, False)
    assert first.ended_by == "stop" and 0 < first.rows < ROWS
    meta = CheckpointStore(ckpt).load_latest().meta
    learners = meta["distributed"]["learners"]
    assert [tuple(e["share"]["partitions"]) for e in learners] == [(0, 2), (1,)]
    at = {int(p): v for e in learners if e["position"] for p, v in e["position"]["partitions"].items()}
    assert set(at) == {1, 2}  # partition 0 was empty: the checkpoint has no position for it
    committed = _committed(kafka_broker, topic, "elastic")
    assert sum(max(c, 0) for c in committed) < sum(ends)  # not all committed yet: the rest is read after the resume

    kafka_broker.produce_batches(topic, data[0], partition=0)
    second = run(3, None, True)
    assert second.ended_by == "end" and second.resumed_from is not None
    assert second.rows == ROWS and sum(second.learner_rows) == ROWS
    latest = CheckpointStore(ckpt).load_latest()
    shares = [tuple(e["share"]["partitions"]) for e in latest.meta["distributed"]["learners"]]
    assert shares == [(0,), (1,), (2,)]  # partition 2 moved from learner 0 to the new learner 2
    # partition 2 continued where learner 0 had left it (not from its start, nor from a committed offset): learner
    # 0 trained done(0) + done(2) rows before the re-deal; the counters of old learner j go to new learner j % 3
    def done(p: int) -> int:  # rows of partition p trained before the re-deal (messages of 250 rows from offset 0)
        return at[p]["offset"] * 250 + at[p]["row"] if p in at else 0

    assert first.learner_rows == [done(2), done(1)] and 0 < done(2) < ROWS_PER_PARTITION
    assert second.learner_rows == [ROWS_PER_PARTITION + done(2), ROWS_PER_PARTITION, ROWS_PER_PARTITION - done(2)]
    counts = {k: int(v) for k, v in latest.arrays.items() if k.endswith("/count") and not k.startswith("learners/")}
    assert counts and set(counts.values()) == {ROWS}, counts  # every row once
    X = np.vstack([np.column_stack([b.column(f"x{j}").to_numpy() for j in range(D)])
                   for p in range(PARTITIONS) for b in data[p]])
    np.testing.assert_allclose(latest.arrays["scaler/mean"], X.mean(axis=0), rtol=1e-4, atol=1e-4)
    assert _committed(kafka_broker, topic, "elastic") == ends
