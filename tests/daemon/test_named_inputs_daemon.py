"""Named inputs with checkpoints, Kafka and the CLI: exactly-once for vocabularies, raw-column exports."""

from __future__ import annotations

import subprocess
import sys

import anyio
import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit import OnnxRegressor, train_stream_sync
from streamfit._engine.testing import two_input_model
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.daemon.state import unflatten_state
from streamfit.features import Hashed, Vocabulary

COMMON = dict(optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None, threads=1)


def _table(n: int, seed: int, fresh_every: int = 7) -> pa.Table:
    """Floats a, b, a dictionary<float> price, and a string city where a new value appears every few rows."""
    rng = np.random.default_rng(seed)
    city = np.array([f"c{(i // fresh_every) if i % 3 else i % 11}" for i in range(seed * 10_000, seed * 10_000 + n)])
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    price = rng.choice(np.array([0.5, 1.0, 2.5], np.float32), n)
    y = (a - 0.5 * b + price).astype(np.float32)
    return pa.table({"a": a, "b": b, "price": pa.array(price).dictionary_encode(), "city": city, "y": y})


def _estimator(min_count=2):
    return OnnxRegressor(two_input_model(3, 512), inputs={"x": ["a", "b", "price"],
                                                          "ids": Vocabulary("city", min_count=min_count)},
                         batch_size=32, **COMMON)


def _vocabulary_of(rows: pa.Array, min_count: int) -> dict[str, int]:
    """The vocabulary of exactly these rows, computed independently."""
    counts: dict[str, int] = {}
    ids: dict[str, int] = {}
    for v in rows.to_pylist():
        if v in ids:
            continue
        counts[v] = counts.get(v, 0) + 1
        if counts[v] >= min_count:
            ids[v] = 2 + len(ids)
    return ids


def test_checkpoints_hold_the_vocabulary_of_exactly_the_trained_rows(tmp_path):
    tables = [_table(640, 1), _table(640, 2)]
    d = tmp_path / "data"
    d.mkdir()
    for i, t in enumerate(tables):
        pq.write_table(t, d / f"part-{i:03d}.parquet", row_group_size=256)  # read ahead of the checkpoints
    whole = pa.concat_tables([t.cast(tables[0].schema) for t in tables])
    ref = _estimator()
    anyio.run(Runner(ref, f"parquet:{d}", batch_size=32, queue_size=4).run)

    first = Runner(_estimator(), f"parquet:{d}", checkpoint_dir=tmp_path / "ck", every_batches=3, keep=50,
                   batch_size=32, queue_size=4, max_rows=800)
    anyio.run(first.run)
    store = CheckpointStore(tmp_path / "ck")
    checked = 0
    for info in store.list():
        ckpt = store.load(info.path)
        state = unflatten_state(ckpt.meta["estimator"]["state"], ckpt.arrays)
        keys = state["features"]["states"]["ids"]["ids_0_keys"].tolist()
        values = state["features"]["states"]["ids"]["ids_0_values"].tolist()
        assert dict(zip(keys, values)) == _vocabulary_of(whole.column("city")[: ckpt.meta["rows"]], 2), info.path
        checked += 1
    assert checked >= 2
    again = _estimator()
    second = anyio.run(Runner(again, f"parquet:{d}", checkpoint_dir=tmp_path / "ck", resume=True, batch_size=32,
                              queue_size=4).run)
    assert second.rows == 1280
    assert again.encoder_states_["ids"].ids == ref.encoder_states_["ids"].ids
    assert again.encoder_states_["ids"].pending == ref.encoder_states_["ids"].pending
    for k, w in ref.trainer_.get_weights().items():
        np.testing.assert_allclose(again.trainer_.get_weights()[k], w, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.kafka
@pytest.mark.parametrize("step", ["fused", pytest.param("forward_backward", marks=pytest.mark.needs_ort_training)])
def test_two_input_model_from_kafka(kafka_broker, step):
    tables = [_table(300, 3), _table(300, 4)]
    batches = [b for t in tables for b in t.to_batches(max_chunksize=60)]
    topic = kafka_broker.create_topic(partitions=1)
    kafka_broker.produce_batches(topic, batches, partition=0)
    make = lambda: OnnxRegressor(two_input_model(3, 128), inputs={"x": ["a", "b", "price"],  # noqa: E731
                                                                   "ids": Hashed("city", 128)},
                                 batch_size=50, step=step, **COMMON)
    est = make()
    source = f"kafka://{kafka_broker.bootstrap}/{topic}?group=g-{topic}&session.timeout.ms=6000"
    summary = train_stream_sync(est, source, batch_size=50, max_rows=600)
    assert summary.rows == 600
    ref = make()
    whole = pa.concat_tables([t.cast(tables[0].schema) for t in tables])
    for i in range(0, 600, 50):
        sl = whole.slice(i, 50)
        ref.partial_fit(sl.drop_columns(["y"]), sl.column("y").to_numpy())
    for k, w in ref.trainer_.get_weights().items():
        np.testing.assert_array_equal(est.trainer_.get_weights()[k], w, err_msg=k)


def test_cli_input_flags_train_and_export_raw_columns(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    table = _table(400, 5)
    pq.write_table(table, d / "part-000.parquet")
    onnx.save(two_input_model(3, 64), tmp_path / "model.onnx")
    out = tmp_path / "trained.onnx"
    proc = subprocess.run([sys.executable, "-m", "streamfit.cli", "train", "--source", f"parquet:{d}", "--model",
                           str(tmp_path / "model.onnx"), "--input", "x=a,b,price", "--input", "ids=hashed:city:64:3",
                           "--batch-size", "50", "--optimizer", "adam", "--learning-rate", "constant", "--eta0",
                           "0.01", "--penalty", "none", "--no-progress", "--checkpoint-dir", str(tmp_path / "ck"),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "trained 400 rows" in proc.stdout
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in sess.get_inputs()) == ["a", "b", "city", "price"]
    feed = {"a": table.column("a").to_numpy()[:10], "b": table.column("b").to_numpy()[:10],
            "price": np.asarray(table.column("price").to_pylist()[:10], np.float32),
            "city": np.asarray(table.column("city").to_pylist()[:10], dtype=object)}
    est = OnnxRegressor(two_input_model(3, 64), inputs={"x": ["a", "b", "price"], "ids": Hashed("city", 64, 3)},
                        batch_size=50, optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None)
    for i in range(0, 400, 50):
        sl = table.slice(i, 50)
        est.partial_fit(sl.drop_columns(["y"]), sl.column("y").to_numpy())
    np.testing.assert_allclose(sess.run(None, feed)[0].ravel(), est.predict(table.slice(0, 10).drop_columns(["y"])).ravel(),
                               rtol=1e-5, atol=1e-6)
