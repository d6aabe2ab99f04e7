"""Poison messages: a message that makes training diverge again and again is quarantined, not replayed forever."""

from __future__ import annotations

import logging

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit import OnnxRegressor
from streamfit._stream.deadletter import read_dead_letters
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.daemon.guard import DivergenceGuard
from streamfit.exceptions import DivergenceError
from tests.daemon.helpers import N_FEATURES, write_model

ROWS, MESSAGE = 1024, 128  # rows per file, rows per record batch (the unit of quarantine)
POISON = (0, 512)  # file, first row of the poison record batch


def _tables(seed: int = 0) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(2):
        X = rng.standard_normal((ROWS, N_FEATURES)).astype(np.float32)
        y = (X.sum(axis=1) + np.sin(X[:, 0])).astype(np.float32)
        out.append(pa.table({**{f"x{j}": X[:, j] for j in range(N_FEATURES)}, "y": y}))
    return out


def _write(root, tables):
    root.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(tables):
        pq.write_table(t, root / f"part-{i:03d}.parquet", row_group_size=MESSAGE)
    return root


def _poisoned(tables):
    """One finite huge value in one cell of one record batch: the loss becomes inf."""
    f, start = POISON
    y = tables[f].column("y").to_numpy().copy()
    y[start + 18] = 1e30
    out = list(tables)
    out[f] = tables[f].set_column(N_FEATURES, "y", pa.array(y, pa.float32()))
    return out


def _without_poison(tables):
    f, start = POISON
    out = list(tables)
    out[f] = pa.concat_tables([tables[f].slice(0, start), tables[f].slice(start + MESSAGE)])
    return out


def _estimator(model):
    return OnnxRegressor(str(model), optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None,
                         batch_size=64, on_nonfinite="skip", threads=1)


def _runner(est, data, **kw):
    return Runner(est, f"parquet:{data}", batch_size=64, on_bad="skip", source_options={"batch_size": MESSAGE},
                  **kw)


def _reference(model, tables, poison_row: int):
    """The batches the poisoned run trains, fed to ``partial_fit``: the poison record batch in the pieces its
    bisection cuts it into (the rule written out in tests/daemon/test_poison_rows.py), without the poison row."""
    from tests.daemon.test_poison_rows import _expected_pieces

    ref = _estimator(model)
    f, start = POISON

    def fit(t):
        X = np.column_stack([t.column(f"x{j}").to_numpy() for j in range(N_FEATURES)]).astype(np.float32)
        ref.partial_fit(X, t.column("y").to_numpy())

    for i, t in enumerate(tables):
        if i != f:
            for s in range(0, ROWS, 64):
                fit(t.slice(s, 64))
            continue
        for s in range(0, start, 64):
            fit(t.slice(s, 64))
        for a, b in _expected_pieces(MESSAGE, [poison_row], 64):
            fit(t.slice(start + a, b - a))
        for s in range(start + MESSAGE, ROWS, 64):
            fit(t.slice(s, 64))
    return ref


def test_poison_message_is_quarantined_and_training_goes_on(tmp_path, caplog):
    model = write_model(tmp_path)
    tables = _poisoned(_tables())
    est = _estimator(model)
    dead = tmp_path / "dead.jsonl"
    runner = _runner(est, _write(tmp_path / "poisoned", tables), checkpoint_dir=tmp_path / "ck",
                     every_batches=1, dead_letter=str(dead),  # a rollback point after every batch it can
                     guard=DivergenceGuard(max_rollbacks=3, lr_factor=0.1))
    with caplog.at_level(logging.INFO, logger="streamfit.daemon"):
        summary = anyio.run(runner.run)

    # progress past the poison message: every other row trained, the poison row counted under its reason
    assert summary.rows == 2 * ROWS - 1
    # 2 rollbacks lowering the rate, 6 halving the 64 rows of the batch that diverged, 1 quarantining the row
    assert summary.rollbacks == 9 and summary.ended_by == "end"
    assert summary.skipped_rows == {"poison": 1} and summary.skipped_messages == {}
    key = '{"file": "part-000.parquet", "row": 640}'
    row = {"message": key, "row": {"file": "part-000.parquet", "row": POISON[1] + 18}, "from_end": MESSAGE - 19}
    assert summary.quarantined == [] and summary.quarantined_rows == [row]
    assert sum(getattr(r, "event", None) == "quarantine" for r in caplog.records) == 1
    assert sum(getattr(r, "event", None) == "bisect" for r in caplog.records) == 6
    # ... exactly once: the same weights as the same batches without that row
    ref = _reference(model, tables, 18)
    for name, w in ref.trainer_.get_weights().items():
        np.testing.assert_allclose(est.trainer_.get_weights()[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    # the learning rate is back to normal, and so it is in the checkpoint
    assert est.trainer_.lr_scale == 1.0
    ckpt = CheckpointStore(tmp_path / "ck").load_latest()
    assert ckpt.meta["estimator"]["state"]["trainer"]["lr_scale"] == 1.0
    assert ckpt.meta["skipped_rows"] == {"poison": 1}
    assert ckpt.meta["poison"]["quarantined_rows"] == [row]
    # the row is in the dead-letter file, its values and all
    [letter] = read_dead_letters(dead)
    assert (letter.reason, letter.rows, letter.message) == ("poison", 1, False)
    assert letter.position == {"file": "part-000.parquet", "row": POISON[1] + 18}
    rows = letter.table()
    assert rows.num_rows == 1 and rows.column("y").to_numpy()[0] == np.float32(1e30)


def test_poison_rows_zero_quarantines_the_whole_message(tmp_path, caplog):
    """``DivergenceGuard(poison_rows=0)``: no bisection, the message is quarantined whole (the behaviour before
    row-level quarantine), and the run equals one on the stream without that message."""
    model = write_model(tmp_path)
    tables = _tables()
    ref = _estimator(model)
    ref_summary = anyio.run(_runner(ref, _write(tmp_path / "clean", _without_poison(tables))).run)

    est = _estimator(model)
    dead = tmp_path / "dead.jsonl"
    runner = _runner(est, _write(tmp_path / "poisoned", _poisoned(tables)), checkpoint_dir=tmp_path / "ck",
                     every_batches=1, dead_letter=str(dead),
                     guard=DivergenceGuard(max_rollbacks=3, lr_factor=0.1, poison_rows=0))
    with caplog.at_level(logging.INFO, logger="streamfit.daemon"):
        summary = anyio.run(runner.run)
    assert summary.rows == ref_summary.rows == 2 * ROWS - MESSAGE
    assert summary.rollbacks == 3 and summary.ended_by == "end"
    assert summary.skipped_rows == {"poison": MESSAGE} and summary.skipped_messages == {"poison": 1}
    assert summary.quarantined == ['{"file": "part-000.parquet", "row": 640}'] and summary.quarantined_rows == []
    assert sum(getattr(r, "event", None) == "quarantine" for r in caplog.records) == 1
    for name, w in ref.trainer_.get_weights().items():
        np.testing.assert_allclose(est.trainer_.get_weights()[name], w, rtol=1e-6, atol=1e-7, err_msg=name)
    assert est.trainer_.lr_scale == 1.0
    ckpt = CheckpointStore(tmp_path / "ck").load_latest()
    assert ckpt.meta["skipped_messages"] == {"poison": 1}
    assert ckpt.meta["poison"]["quarantined"] == summary.quarantined
    [letter] = read_dead_letters(dead)
    assert (letter.reason, letter.rows, letter.message) == ("poison", MESSAGE, True)
    assert letter.position == {"file": "part-000.parquet", "row": POISON[1]}
    rows = letter.table()
    assert rows.num_rows == MESSAGE and rows.column("y").to_numpy()[18] == np.float32(1e30)


def test_poison_message_under_on_bad_raise_stops_with_its_position(tmp_path):
    model = write_model(tmp_path)
    data = _write(tmp_path / "poisoned", _poisoned(_tables()))
    runner = Runner(_estimator(model), f"parquet:{data}", batch_size=64, on_bad="raise",
                    source_options={"batch_size": MESSAGE}, guard=DivergenceGuard())
    with pytest.raises(DivergenceError, match=r'poison message .*"row": 640.*diverged 3 times'):
        anyio.run(runner.run)


def test_learning_rate_scale_recovers_after_good_batches_and_has_a_floor(tmp_path):
    model = write_model(tmp_path)
    data = _write(tmp_path / "clean", _tables())
    est = _estimator(model)
    runner = _runner(est, data, guard=DivergenceGuard(recover_after=4))
    seen = []  # the scale each batch trains with, recorded by the training call itself (not by polling it)
    for name in ("partial_fit", "partial_fit_predict"):
        def recording(*args, _method=getattr(est, name), **kwargs):
            seen.append(est.trainer_.lr_scale if "trainer_" in est.__dict__ else None)
            return _method(*args, **kwargs)
        setattr(est, name, recording)

    async def main():
        async def lower():  # as after two rollbacks
            while runner.batches < 2:
                await anyio.sleep(0.001)
            est.trainer_.lr_scale = 0.01

        async with anyio.create_task_group() as tg:
            tg.start_soon(lower)
            return await runner.run()

    anyio.run(main)
    assert est.trainer_.lr_scale == 1.0  # 0.01 doubled back after every 4 good batches, capped at 1
    assert 0.02 in seen and 0.04 in seen

    # a divergence the learning rate cannot fix: below the floor the run stops and says why
    est = OnnxRegressor(str(model), optimizer="sgd", learning_rate="constant", eta0=1e30, penalty=None,
                        batch_size=64, on_nonfinite="skip", threads=1)
    runner = _runner(est, data, guard=DivergenceGuard(max_rollbacks=100, min_lr_scale=1e-3))
    with pytest.raises(DivergenceError, match="learning-rate scale would fall to 0.0001, below the floor 0.001"):
        anyio.run(runner.run)
