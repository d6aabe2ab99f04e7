"""The synthetic click stream: seeded, Zipf-distributed values, labels from the known model, Parquet and Kafka."""

from __future__ import annotations

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit.testing.clicks import ClickStream


def _log_loss(p, y):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_seeded_and_batches_independent():
    a, b = ClickStream(seed=3), ClickStream(seed=3)
    assert a.batch(5, 500).equals(b.batch(5, 500))
    assert not a.batch(5, 500).equals(a.batch(6, 500))
    assert not a.batch(5, 500).equals(ClickStream(seed=4).batch(5, 500))
    assert a.table(1000, batch_rows=300).slice(600, 300).equals(pa.Table.from_batches([a.batch(2, 300)]))


def test_fields_cardinalities_and_zipf():
    stream = ClickStream(seed=1)
    t = stream.table(40000)
    assert t.schema.field("c0").type == pa.int64() and t.schema.field("d0").type == pa.float32()
    assert len(stream.pairs) == 10 and all(f < g for f, g in stream.pairs)
    for f, card in enumerate(stream.cardinalities):
        v = t.column(f"c{f}").to_numpy()
        assert v.min() >= 0 and v.max() < card
    assert stream.cardinalities == tuple(sorted(stream.cardinalities))
    # the largest field (10^6 values): a heavy head and a long tail, rank 1 / rank 2 about 2**s
    counts = np.bincount(t.column("c19").to_numpy())
    top = np.sort(counts)[::-1]
    assert top[0] > 200 * 40000 / 1e6 and 1.5 < top[0] / top[1] < 3.0
    assert len(np.unique(t.column("c19").to_numpy())) > 5000


def test_labels_follow_the_known_logistic_model_with_interactions():
    stream = ClickStream(seed=2)
    t = stream.table(50000)
    y = t.column("label").to_numpy()
    z = stream.true_logit(t)
    p = 1 / (1 + np.exp(-z))
    assert abs(p.mean() - y.mean()) < 0.01  # calibrated
    without_pairs = ClickStream(seed=2, n_pairs=0).true_logit(t)  # same effects, no interaction terms
    assert _log_loss(p, y) < _log_loss(1 / (1 + np.exp(-without_pairs)), y) - 0.01
    assert _log_loss(p, y) < _log_loss(np.full(len(y), y.mean()), y) - 0.1


def test_string_values_and_parquet(tmp_path):
    stream = ClickStream(seed=0, strings=True)
    paths = stream.write_parquet(tmp_path, rows=2500, rows_per_file=1000, batch_rows=500)
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    t = pa.concat_tables([pq.read_table(p) for p in paths])
    assert t.num_rows == 2500 and t.schema.field("c3").type == pa.string()
    assert t.equals(stream.table(2500, batch_rows=500))
    np.testing.assert_allclose(stream.true_logit(t), ClickStream(seed=0).true_logit(ClickStream(seed=0).table(
        2500, batch_rows=500)))


@pytest.mark.kafka
def test_kafka_messages_through_a_real_broker(kafka_broker):
    from streamfit.sources import KafkaSource

    stream = ClickStream(seed=5)
    topic = kafka_broker.create_topic()
    kafka_broker.produce(topic, stream.kafka_messages(3000, rows_per_message=1000))

    async def read() -> pa.Table:
        batches = []
        async with KafkaSource(kafka_broker.bootstrap, topic, group="g-clicks",
                               config=kafka_broker.consumer_config) as source:
            with anyio.fail_after(30):
                while sum(b.num_rows for b in batches) < 3000:
                    item = await source.__anext__()
                    if item.batch is not None:
                        batches.append(item.batch)
        return pa.Table.from_batches(batches)

    assert anyio.run(read).equals(stream.table(3000, batch_rows=1000))
