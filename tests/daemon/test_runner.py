"""The Runner in process: exact resume, checkpoint contents, rollback on divergence, refusal of bad checkpoints."""

from __future__ import annotations

import json
import logging

import anyio
import numpy as np
import pytest

from streamfit import OnnxRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.daemon.guard import DivergenceGuard
from streamfit.exceptions import CheckpointError, DivergenceError
from tests.daemon.helpers import write_model, write_stream


def _estimator(model, **kw):
    params = dict(optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None, batch_size=64,
                  on_nonfinite="skip", threads=1)
    params.update(kw)
    return OnnxRegressor(str(model), **params)


def _run(runner):
    return anyio.run(runner.run)


def test_resumed_run_equals_uninterrupted(tmp_path):
    data, total = write_stream(tmp_path)
    model = write_model(tmp_path)
    ref = _estimator(model)
    ref_summary = _run(Runner(ref, f"parquet:{data}", batch_size=64))
    assert ref_summary.rows == total

    est = _estimator(model)
    first = _run(Runner(est, f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=5, batch_size=64,
                        max_rows=1280))
    assert first.rows == 1280 and first.checkpoints >= 1
    again = _estimator(model)  # a new process: a fresh estimator from the same configuration
    second = _run(Runner(again, f"parquet:{data}", checkpoint_dir=tmp_path / "ck", resume=True, batch_size=64))
    assert second.resumed_from is not None and second.rows == total and second.batches == total // 64
    for name, w in ref.trainer_.get_weights().items():
        np.testing.assert_allclose(again.trainer_.get_weights()[name], w, rtol=1e-6, atol=1e-7, err_msg=name)
    state = again.trainer_.optimizer_state()
    for name, v in ref.trainer_.optimizer_state().items():
        np.testing.assert_allclose(state[name], v, rtol=1e-6, atol=1e-9)


def test_checkpoint_holds_position_counters_and_plain_model(tmp_path):
    data, total = write_stream(tmp_path, files=2)
    model = write_model(tmp_path)
    publish = tmp_path / "serving" / "model.onnx"
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=8,
                publish_path=publish, batch_size=64))
    ckpt = CheckpointStore(tmp_path / "ck").load_latest()
    assert ckpt.meta["rows"] == total and ckpt.meta["position"] == {"file": "part-001.parquet", "row": 1024}
    assert ckpt.meta["estimator"]["class"] == "OnnxRegressor"
    assert json.loads(json.dumps(ckpt.meta)) == ckpt.meta  # plain JSON
    import onnxruntime as ort

    X = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    a = ort.InferenceSession(ckpt.model_bytes).run(None, {"X": X})[0]
    b = ort.InferenceSession(publish.read_bytes()).run(None, {"X": X})[0]
    np.testing.assert_array_equal(a, b)
    kept = CheckpointStore(tmp_path / "ck").list()
    assert 2 <= len(kept) <= 3 and kept[-1].step == total // 64  # retention: at most the last 3


def test_corrupt_newest_checkpoint_is_skipped_on_resume(tmp_path, caplog):
    data, total = write_stream(tmp_path, files=2)
    model = write_model(tmp_path)
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=8,
                batch_size=64, max_rows=1024))
    infos = CheckpointStore(tmp_path / "ck").list()
    newest = infos[-1].path
    blob = bytearray((newest / "state.npz").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (newest / "state.npz").write_bytes(bytes(blob))
    est = _estimator(model)
    with caplog.at_level(logging.WARNING):
        summary = _run(Runner(est, f"parquet:{data}", checkpoint_dir=tmp_path / "ck", resume=True, batch_size=64))
    assert summary.resumed_from == str(infos[-2].path)
    assert summary.rows == total  # resumed from the older checkpoint's position: nothing lost or repeated
    assert any("checksum" in r.getMessage() or "corrupt" in r.getMessage().lower() for r in caplog.records)


def test_fresh_run_refuses_a_directory_with_checkpoints(tmp_path):
    data, _ = write_stream(tmp_path, files=1)
    model = write_model(tmp_path)
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", batch_size=64))
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", batch_size=64))


def test_divergence_is_rolled_back_and_never_written(tmp_path, caplog):
    data, total = write_stream(tmp_path, files=2)
    model = write_model(tmp_path)
    est = _estimator(model, optimizer="sgd", eta0=0.01)
    runner = Runner(est, f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=4, batch_size=64,
                    guard=DivergenceGuard(factor=50, warmup=3, lr_factor=0.001, max_rollbacks=5))
    state = {"raised": False, "calls": 0}
    # at the 11th batch the learning rate becomes absurd: the run must roll back and go on (raised by the
    # training call itself: a task polling runner.batches could be scheduled after the stream's end)
    for name in ("partial_fit", "partial_fit_predict"):
        def bumping(*args, _method=getattr(est, name), **kwargs):
            state["calls"] += 1
            if state["calls"] == 11:
                est.trainer_.lr_scale = 1e6
                state["raised"] = True
            return _method(*args, **kwargs)
        setattr(est, name, bumping)

    with caplog.at_level(logging.INFO, logger="streamfit.daemon"):
        summary = anyio.run(runner.run)
    assert state["raised"] and summary.rollbacks >= 1
    assert summary.rows == total
    assert any(getattr(r, "event", None) == "rollback" for r in caplog.records)
    for info in CheckpointStore(tmp_path / "ck").list():
        ckpt = CheckpointStore(tmp_path / "ck").load(info.path)
        assert all(np.isfinite(a).all() for a in ckpt.arrays.values() if a.dtype.kind == "f")
    assert all(np.isfinite(w).all() for w in est.trainer_.get_weights().values())
    assert est.trainer_.lr_scale == pytest.approx(1e6 * 0.001) or est.trainer_.lr_scale < 1e6


def test_divergence_that_never_ends_stops_with_a_clear_error(tmp_path):
    data, _ = write_stream(tmp_path, files=1)
    model = write_model(tmp_path)
    est = _estimator(model, optimizer="sgd", learning_rate="constant", eta0=1e30)
    runner = Runner(est, f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=4, batch_size=64,
                    guard=DivergenceGuard(factor=10, warmup=1, lr_factor=0.5, max_rollbacks=2), on_bad="skip")
    # every row diverges: quarantining them one after the other would skip the whole stream
    with pytest.raises(DivergenceError, match="4 rows or messages in a row .* the model diverges, not the data"):
        _run(runner)


def test_resume_on_a_source_that_cannot_seek_says_why(tmp_path):
    from streamfit.exceptions import SourceError
    from streamfit.sources import IpcTcpSource

    data, _ = write_stream(tmp_path, files=1, rows=256)
    model = write_model(tmp_path)
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", batch_size=64))
    runner = Runner(_estimator(model), lambda: IpcTcpSource(port=0), checkpoint_dir=tmp_path / "ck", resume=True,
                    batch_size=64)
    with pytest.raises(SourceError, match="cannot restart at a saved position"):
        _run(runner)


def test_checkpoint_on_demand(tmp_path):
    data, total = write_stream(tmp_path, files=2)
    model = write_model(tmp_path)
    runner = Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", batch_size=64)
    requested = []

    async def main():
        async def ask():
            while runner.batches < 5:
                await anyio.sleep(0.001)
            requested.append(runner.batches)
            runner.request_checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            return await runner.run()

    summary = anyio.run(main)
    steps = [info.step for info in CheckpointStore(tmp_path / "ck").list()]
    assert summary.checkpoints == 2 and steps[-1] == total // 64  # the requested one and the final one
    assert requested and requested[0] <= steps[0] < total // 64


def test_skipped_rows_are_counted_across_resume(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, total = write_stream(tmp_path, files=2, rows=512)
    bad = pa.table({**{f"x{j}": pa.array([1.0, None, 2.0], pa.float32()) for j in range(6)},
                    "y": pa.array([1.0, 2.0, 3.0], pa.float32())})
    pq.write_table(bad, data / "part-000b.parquet")  # between the two good files
    model = write_model(tmp_path)
    first = _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=2,
                        batch_size=64, on_bad="skip", max_rows=640))
    second = _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", resume=True,
                         batch_size=64, on_bad="skip"))
    assert first.skipped_rows == {"null": 1} and second.skipped_rows == {"null": 1}
    assert second.rows == total + 2


def test_resume_past_a_truncated_newest_checkpoint_sets_it_aside_and_saves_on(tmp_path, caplog):
    """Issue 9, defect 1: the skipped newest checkpoint used to block every later save ("steps must increase")."""
    data, total = write_stream(tmp_path, files=2)
    model = write_model(tmp_path)
    ck = tmp_path / "ck"
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=ck, every_batches=8, batch_size=64,
                max_rows=1024))
    infos = CheckpointStore(ck).list()
    assert [i.step for i in infos] == [8, 16]
    newest = infos[-1].path
    blob = (newest / "state.npz").read_bytes()
    (newest / "state.npz").write_bytes(blob[: len(blob) // 2])
    with caplog.at_level(logging.WARNING):
        summary = _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=ck, resume=True, every_batches=2,
                              batch_size=64))
    assert summary.resumed_from == str(infos[0].path)
    assert summary.rows == total and summary.checkpoints >= 2  # saves of steps < 16 went through
    aside = ck / f"{newest.name}.corrupt"
    assert aside.is_dir()
    if newest.exists():  # the resumed run saved step 16 again (its saves depend on timing): a whole one now
        with np.load(newest / "state.npz", allow_pickle=False) as state:
            assert len(state.files) > 0
    assert any(newest.name in r.getMessage() and "state.npz is" in r.getMessage() and "set aside" in r.getMessage()
               for r in caplog.records)
    store = CheckpointStore(ck)
    assert store.list()[-1].step == total // 64 and store.load_latest().meta["rows"] == total


def test_a_bit_flip_in_the_saved_source_position_never_resumes_silently(tmp_path, caplog, capsys):
    """Issue 9, defect 2: 'part-001' -> 'part-000' (one bit) in the newest manifest resumed silently and lost rows."""
    data, total = write_stream(tmp_path, files=3, rows=512)
    model = write_model(tmp_path)
    ck = tmp_path / "ck"
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=ck, every_batches=6, batch_size=64,
                max_rows=832))  # checkpoints at batches 6 (part-000) and 12, 13 (inside part-001)
    newest = CheckpointStore(ck).list()[-1].path
    raw = (newest / "manifest.json").read_bytes()
    assert raw.count(b'"part-001.parquet"') == 1
    flipped = raw.replace(b'"part-001.parquet"', b'"part-000.parquet"')  # '1' ^ 0x01 == '0'
    assert sum(bin(a ^ b).count("1") for a, b in zip(raw, flipped)) == 1
    (newest / "manifest.json").write_bytes(flipped)
    with caplog.at_level(logging.WARNING):
        summary = _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=ck, resume=True, batch_size=64))
    assert summary.resumed_from != str(newest) and summary.rows == total  # nothing lost, nothing repeated
    assert any("manifest.json fails its SHA-256 check" in r.getMessage() for r in caplog.records)
    assert (ck / f"{newest.name}.corrupt").is_dir()
    from streamfit.cli import main

    capsys.readouterr()
    try:
        assert main(["inspect", str(ck)]) == 0
    finally:
        logging.getLogger("streamfit").propagate = True  # main() reset the handlers of "streamfit"
    assert f"set aside as corrupt (kept for a post-mortem): {newest.name}.corrupt" in capsys.readouterr().out
