"""A model with a row-sparse table under the Runner: delta checkpoints, exact resume, fallback, publishing."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import anyio
import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import streamfit
from streamfit._engine.testing import two_input_model
from streamfit.checkpoint import CheckpointStore, apply_published_delta, delta_path
from streamfit.daemon.runner import Runner
from streamfit.sources import Source, open_source

VOCAB, FILES, ROWS, BATCH = 8192, 4, 1024, 64  # 64 batches; a batch touches < 1 % of the table


def write_table_stream(root: Path, files: int = FILES, rows: int = ROWS, seed: int = 0) -> Path:
    """Parquet files of dense ``x0..x2``, Zipf-distributed ``ids`` < VOCAB and a target ``y``."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    effect = rng.standard_normal(VOCAB).astype(np.float32)
    for i in range(files):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        ids = (rng.zipf(1.3, rows) - 1) % VOCAB
        y = (x.sum(axis=1) + effect[ids]).astype(np.float32)
        pq.write_table(pa.table({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2], "ids": ids.astype(np.int64), "y": y}),
                       data / f"part-{i:03d}.parquet")
    return data


def write_table_model(root: Path) -> Path:
    path = root / "table.onnx"
    onnx.save(two_input_model(3, VOCAB, dim=4, seed=1), path)
    return path


def _estimator(model: Path) -> streamfit.OnnxRegressor:
    return streamfit.OnnxRegressor(str(model), optimizer="adagrad", learning_rate="constant", eta0=0.05,
                                   penalty=None, threads=1, inputs={"x": ["x0", "x1", "x2"], "ids": "ids"})


class _Paced(Source):
    """A Parquet source that hands out a batch every few ms, so the checkpoint writer keeps up (checkpoints
    are skipped while a write is in flight, which would make their count depend on the disk's speed)."""

    def __init__(self, data: Path) -> None:
        self.inner = open_source(f"parquet:{data}?batch_size={BATCH}")

    async def __anext__(self):
        await anyio.sleep(0.01)
        return await self.inner.__anext__()

    def seek(self, position) -> None:
        self.inner.seek(position)

    async def commit(self, position) -> None:
        await self.inner.commit(position)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _run(root: Path, data: Path, model: Path, **kw) -> Runner:
    kw = {"every_batches": 4, "full_every": 3, "keep": 40, **kw}
    runner = Runner(_estimator(model), lambda: _Paced(data), checkpoint_dir=root / "ck", label="y",
                    batch_size=BATCH, **kw)
    anyio.run(runner.run)
    return runner


def _weights(ck: Path) -> tuple[dict, dict]:
    ckpt = CheckpointStore(ck).load_latest()
    return {k: v for k, v in ckpt.arrays.items() if k.startswith("trainer/")}, ckpt.meta


def _kinds(ck: Path) -> dict[str, str]:
    return {p.name: json.loads((p / "manifest.json").read_text())["tables"]["kind"]
            for p in sorted(ck.glob("ckpt-*")) if not p.name.count(".")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("table-ref")
    data, model = write_table_stream(root), write_table_model(root)
    runner = _run(root, data, model)
    weights, meta = _weights(root / "ck")
    assert meta["rows"] == FILES * ROWS
    return weights, runner


def _assert_same(weights: dict, reference: dict) -> None:
    assert sorted(weights) == sorted(reference)
    for name, w in reference.items():
        np.testing.assert_allclose(weights[name], w, rtol=1e-6, atol=1e-7, err_msg=name)


def test_checkpoints_are_a_chain_of_small_deltas_between_fulls(tmp_path, reference):
    data, model = write_table_stream(tmp_path), write_table_model(tmp_path)
    _run(tmp_path, data, model)
    ck = tmp_path / "ck"
    kinds = _kinds(ck)
    runs = "".join("F" if k == "full" else "d" for k in kinds.values())
    assert runs.startswith("F") and "ddd" not in runs and runs.count("d") >= 4, runs  # a full every 3
    full = ck / next(name for name, k in kinds.items() if k == "full")
    delta = ck / next(name for name, k in kinds.items() if k == "delta")
    full_bytes = sum(f.stat().st_size for f in full.iterdir())
    delta_bytes = sum(f.stat().st_size for f in delta.iterdir())
    assert delta_bytes < 0.25 * full_bytes  # 4 batches of 64 Zipf ids touch a few % of 8192 rows
    manifest = json.loads((delta / "manifest.json").read_text())
    assert set(manifest["tables"]["tables"]) == {"trainer/weights/E", "trainer/optimizer/E__sum_sq"}
    assert (full / "model.onnx").stat().st_size < 4096  # the table is not in the model file
    # what a reader gets is the whole state, the model filled in
    ckpt = CheckpointStore(ck).load(delta.name)
    assert ckpt.arrays["trainer/weights/E"].shape == (VOCAB, 4)
    inits = {i.name: i for i in onnx.load_from_string(ckpt.model_bytes).graph.initializer}
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(inits["E"]), ckpt.arrays["trainer/weights/E"])
    _assert_same(_weights(ck)[0], reference[0])


def test_resume_from_a_chain_equals_the_uninterrupted_run(tmp_path, reference):
    data, model = write_table_stream(tmp_path), write_table_model(tmp_path)
    _run(tmp_path, data, model, max_rows=FILES * ROWS // 2 + 3 * BATCH, full_every=100)  # ends on a delta
    assert list(_kinds(tmp_path / "ck").values())[-1] == "delta"
    runner = _run(tmp_path, data, model, resume=True, full_every=100)
    weights, meta = _weights(tmp_path / "ck")
    assert meta["rows"] == FILES * ROWS and meta["batches"] == FILES * ROWS // BATCH
    assert runner.rows == FILES * ROWS
    _assert_same(weights, reference[0])


def test_a_corrupt_delta_resumes_from_the_previous_chain_exactly_once(tmp_path, reference):
    data, model = write_table_stream(tmp_path), write_table_model(tmp_path)
    _run(tmp_path, data, model, max_rows=FILES * ROWS // 2, full_every=100)
    ck = tmp_path / "ck"
    newest = sorted(p for p in ck.glob("ckpt-*"))[-1]
    assert _kinds(ck)[newest.name] == "delta"
    blob = bytearray((newest / "delta.npz").read_bytes())
    blob[-100] ^= 0x55
    (newest / "delta.npz").write_bytes(bytes(blob))
    runner = _run(tmp_path, data, model, resume=True)
    assert runner._resumed_from is not None and not runner._resumed_from.endswith(newest.name)
    assert [p.name for p in CheckpointStore(ck).list_corrupt()] == [newest.name + ".corrupt"]
    weights, meta = _weights(ck)
    assert meta["rows"] == FILES * ROWS
    _assert_same(weights, reference[0])


def test_published_delta_patches_the_previous_model_into_the_new_one(tmp_path, monkeypatch, reference):
    """Every publication keeps a copy; each patchable delta turns the copy before it into the new model."""
    import streamfit.daemon.runner as runner_module
    from streamfit.checkpoint import BackgroundPublisher

    copies: list[tuple[bytes, Path | None]] = []

    class Keeping(BackgroundPublisher):
        def _publish(self) -> None:
            super()._publish()
            kept = tmp_path / f"delta-{len(copies)}.npz"
            shutil.copy(self.delta_path, kept)
            copies.append((self.path.read_bytes(), kept))

    monkeypatch.setattr(runner_module, "BackgroundPublisher", Keeping)
    data, model = write_table_stream(tmp_path), write_table_model(tmp_path)
    pub = tmp_path / "pub" / "model.onnx"
    runner = _run(tmp_path, data, model, publish_path=pub, publish_every=0.0)
    assert len(copies) >= 10
    patched = 0
    for (before, _), (after, delta) in zip(copies, copies[1:]):
        with np.load(delta, allow_pickle=False) as npz:
            if not str(npz["from_sha256"]):
                continue
            assert str(npz["from_sha256"]) == hashlib.sha256(before).hexdigest()
            assert str(npz["to_sha256"]) == hashlib.sha256(after).hexdigest()
            assert 0 < npz["rows/E"].size < VOCAB // 4
        served = apply_published_delta(onnx.load_from_string(before), delta)
        want = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load_from_string(after).graph.initializer}
        got = {i.name: onnx.numpy_helper.to_array(i) for i in served.graph.initializer}
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        patched += 1
    assert patched == len(copies) - 1  # only the first publication says "reload"; fulls are patched across
    # the last publication is the final checkpoint's model
    final = onnx.load(pub)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in final.graph.initializer}
    np.testing.assert_array_equal(inits["E"], runner.estimator.trainer_.get_weights()["E"])
    assert delta_path(pub).is_file()
    import onnxruntime as ort  # plain onnxruntime runs the published file (its tables written raw, not by protobuf)

    rng = np.random.default_rng(5)
    x, ids = rng.standard_normal((32, 3)).astype(np.float32), rng.integers(0, VOCAB, 32)
    got = ort.InferenceSession(str(pub)).run(None, {"x": x, "ids": ids})[0]
    want = runner.estimator.predict(pa.table({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2], "ids": ids}))
    np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-5, atol=1e-6)


def test_a_poison_message_rolls_a_table_model_back_from_its_chain_on_disk(tmp_path, monkeypatch):
    """Rollbacks restore the tables from the chain's newest checkpoint (they are never copied in memory): the
    quarantine of a poison message leaves the weights of a run on the stream without it."""
    from streamfit.daemon.guard import DivergenceGuard

    def tables_of(data: Path) -> list[pa.Table]:
        return [pq.read_table(p) for p in sorted(data.glob("*.parquet"))]

    def write(root: Path, tables: list[pa.Table]) -> Path:
        root.mkdir(parents=True)
        for i, t in enumerate(tables):
            pq.write_table(t, root / f"part-{i:03d}.parquet", row_group_size=BATCH)
        return root

    model = write_table_model(tmp_path)
    clean = tables_of(write_table_stream(tmp_path / "src", files=2, rows=512))
    f, start = 1, 192  # the poison record batch: rows 192..255 of the second file
    y = clean[f].column("y").to_numpy().copy()
    y[start + 5] = 1e30
    poisoned = list(clean)
    poisoned[f] = clean[f].set_column(clean[f].schema.get_field_index("y"), "y", pa.array(y, pa.float32()))
    without = list(clean)
    without[f] = pa.concat_tables([clean[f].slice(0, start), clean[f].slice(start + BATCH)])

    def run(data: Path, **kw) -> Runner:
        est = streamfit.OnnxRegressor(str(model), optimizer="adagrad", learning_rate="constant", eta0=0.05,
                                      penalty=None, threads=1, on_nonfinite="skip",
                                      inputs={"x": ["x0", "x1", "x2"], "ids": "ids"})
        runner = Runner(est, f"parquet:{data}", label="y", batch_size=BATCH, on_bad="skip",
                        source_options={"batch_size": BATCH}, **kw)
        anyio.run(runner.run)
        return runner

    ref = run(write(tmp_path / "clean", without), guard=False)
    restored = []
    load = CheckpointStore.load

    def counting_load(self, path):
        restored.append(Path(path).name)
        return load(self, path)

    monkeypatch.setattr(CheckpointStore, "load", counting_load)
    runner = run(write(tmp_path / "poisoned", poisoned), checkpoint_dir=tmp_path / "ck", every_batches=1,
                 full_every=4, keep=3, guard=DivergenceGuard(max_rollbacks=3, lr_factor=0.1, poison_rows=0))
    assert runner.rollbacks == 3 and runner._quarantine.skip == {'{"file": "part-001.parquet", "row": 256}'}
    assert runner.rows == ref.rows == 1024 - BATCH
    assert restored, "no rollback read its tables back from the chain"
    for name, w in ref.estimator.trainer_.get_weights().items():
        np.testing.assert_allclose(runner.estimator.trainer_.get_weights()[name], w, rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_a_full_checkpoint_is_the_state_at_its_step_while_training_goes_on(tmp_path, monkeypatch, reference):
    """A full is a copy-on-write snapshot streamed while later batches train: each one holds exactly the state
    captured by stopping training at its step, and the run ends where the uninterrupted reference does."""
    from streamfit._engine.steps import row_snapshot as cow
    from streamfit.daemon.state import snapshot_tables

    monkeypatch.setattr(cow, "BLOCK_BYTES", 4096)  # 32 blocks per array
    blocks = cow.CowSnapshot.blocks
    snaps: list[cow.CowSnapshot] = []

    def slow_blocks(self, name):  # a slow disk: batches train between the blocks of one write
        if self not in snaps:
            snaps.append(self)
        for block in blocks(self, name):
            yield block
            time.sleep(0.004)

    monkeypatch.setattr(cow.CowSnapshot, "blocks", slow_blocks)
    captured: dict[int, dict[str, np.ndarray]] = {}
    snapshot = Runner._snapshot

    def capturing(self, checkpoint=False):
        snap = snapshot(self, checkpoint)
        if checkpoint and snap.tables is not None and not snap.tables.is_delta:  # stop here: copy the state
            captured[snap.step] = dict(snapshot_tables(self.estimator, None, copy=True).tables.arrays)
        return snap

    monkeypatch.setattr(Runner, "_snapshot", capturing)
    data, model = write_table_stream(tmp_path), write_table_model(tmp_path)
    runner = _run(tmp_path, data, model)
    store = CheckpointStore(tmp_path / "ck")
    fulls = [name for name, kind in _kinds(tmp_path / "ck").items() if kind == "full"]
    assert len(fulls) >= 2 and sum(s.saved_rows > 0 for s in snaps) >= 2  # batches overwrote unread rows
    assert runner.estimator.trainer_.tables.open_snapshots == 0
    for name in fulls:
        ckpt = store.load(name)
        want = captured[ckpt.step]
        assert set(want) <= set(ckpt.arrays)
        for key, value in want.items():
            np.testing.assert_array_equal(ckpt.arrays[key], value, err_msg=f"{name} {key}")
    _assert_same(_weights(tmp_path / "ck")[0], reference[0])


def test_a_resumed_publisher_starts_from_the_chain_on_disk(tmp_path, reference):
    """After a resume the publisher reads the tables from the chain's full checkpoint and its deltas (it holds
    no copy): its last publication is the final model, and every later delta file patches the one before."""
    data, model = write_table_stream(tmp_path), write_table_model(tmp_path)
    pub = tmp_path / "pub" / "model.onnx"
    _run(tmp_path, data, model, max_rows=FILES * ROWS // 2 + 3 * BATCH, full_every=100, publish_path=pub,
         publish_every=0.0)
    assert list(_kinds(tmp_path / "ck").values())[-1] == "delta"  # the resumed checkpoint is a chain's delta
    runner = _run(tmp_path, data, model, resume=True, full_every=100, publish_path=pub, publish_every=0.0)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(pub).graph.initializer}
    np.testing.assert_array_equal(inits["E"], runner.estimator.trainer_.get_weights()["E"])
    np.testing.assert_allclose(inits["E"], reference[0]["trainer/weights/E"], rtol=1e-6, atol=1e-7)
