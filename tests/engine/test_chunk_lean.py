"""The lean body of a hashed linear model (streamfit._engine.steps.scan_lean): a chunk gives what the same steps
give one ``Trainer.step`` each -- outputs, losses, the table, the bias and their
optimizer state, the touched rows -- for the optimizers and penalties it takes; other models keep the generic
body."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamfit._engine.steps.scan import ChunkSteps, train_chunk
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import NonFiniteError
from streamfit.models._fm_graph import fm_model
from streamfit.penalties import Penalty

RTOL, ATOL = 1e-6, 1e-7
#: the body's sums and square roots round as the step path's only within a few ulps (see scan_lean's docstring),
#: and Adam divides each gradient by its running scale: a rounding difference in a small gradient moves its weight
#: by up to lr times the relative difference (1e-7 absolute on weights of ~0.01 seen)
_ADAM_ATOL = 1e-6


def _data(n: int, fields: int, buckets: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(1.4, (n, fields)) % buckets).astype(np.int64)  # skewed: ids repeat within rows and across
    y = ((ids[:, 0] % 3 == 0) ^ (rng.random(n) < 0.2)).astype(np.float32)
    return ids, y


def _trainer(optimizer: Any, penalty: Any = None, loss: str = "log_loss", dense: int = 0, **kw: Any) -> Trainer:
    model = fm_model(5, dense, buckets=32, n_factors=0, rng=np.random.default_rng(1))
    return Trainer(model, loss=loss, optimizer=optimizer, learning_rate=kw.pop("learning_rate", 0.1), sparse=True,
                   penalty=penalty, **kw)


def _steps(tr: Trainer, ids: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    outs, losses = [], []
    for i in range(len(y)):
        losses.append(tr.step(ids[i:i + 1], y[i:i + 1]))
        outs.append(tr.last_output.copy())
    return np.concatenate(outs), np.array(losses)


def _same(a: Trainer, b: Trainer, atol: float = ATOL) -> None:
    for what in ("get_weights", "optimizer_state"):
        sa, sb = getattr(a, what)(), getattr(b, what)()
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_allclose(sa[k], sb[k], rtol=RTOL, atol=atol, err_msg=f"{what} {k}")
    assert (a.n_steps, a.n_skipped, a.schedule.t) == (b.n_steps, b.n_skipped, b.schedule.t)
    ta, tb = a.tables.touched(), b.tables.touched()  # type: ignore[union-attr]
    assert all(np.array_equal(ta.rows[k], tb.rows[k]) for k in tb.rows)


def _lean(tr: Trainer) -> bool:
    chunks: ChunkSteps = tr.__dict__["_chunk_steps"]
    return chunks.lean(1)


@pytest.mark.parametrize("optimizer, penalty", [
    ("ftrl", None), ("ftrl", Penalty(1e-2, 0.0)), ("adagrad", Penalty(1e-2, 0.5)), ("adam", None),
    ("adagrad", Penalty(1e-2, 1.0)), ("rowwise_adagrad", None)])
def test_lean_chunks_equal_step_by_step(optimizer: str, penalty: Any) -> None:
    ids, y = _data(150, 5, 32)
    assert (np.sort(ids, axis=1)[:, 1:] == np.sort(ids, axis=1)[:, :-1]).any()  # rows with an id twice
    a, b = _trainer(optimizer, penalty), _trainer(optimizer, penalty)
    outs, losses = [], []
    for lo, hi in ((0, 70), (70, 150)):  # the second chunk starts from the first one's tables
        r = train_chunk(a, ids[lo:hi], y[lo:hi], batch_size=1)
        assert r.scanned and r.nonfinite is None
        outs.append(r.outputs)
        losses.append(r.losses)
    assert _lean(a) == (optimizer != "rowwise_adagrad")  # a row-shaped rule keeps the generic body
    ref_out, ref_loss = _steps(b, ids, y)
    np.testing.assert_allclose(np.concatenate(outs), ref_out, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(losses), ref_loss, rtol=RTOL, atol=ATOL)
    _same(a, b, atol=_ADAM_ATOL if optimizer == "adam" else ATOL)


def test_ftrl_with_l1_and_l2_and_a_squared_loss() -> None:
    from streamfit.optim import FTRL

    ids, y = _data(120, 5, 32, seed=3)
    make = lambda: _trainer(FTRL(beta=0.5, l1=0.01, l2=0.1), loss="squared_error")  # noqa: E731
    a, b = make(), make()
    r = train_chunk(a, ids, y, batch_size=1)
    assert _lean(a)
    ref_out, ref_loss = _steps(b, ids, y)
    np.testing.assert_allclose(r.outputs, ref_out, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(r.losses, ref_loss, rtol=RTOL, atol=ATOL)
    # onnxruntime's Sqrt is not correctly rounded on 6 values or more (1-4 ulps): the step path (a row's 5 distinct
    # ids) and the body (5 positions and the bias) round differently, and FTRL's z near its l1 threshold carries
    # the difference
    _same(a, b, atol=1e-6)


@pytest.mark.parametrize("batch_size", [2, 3, 32])
@pytest.mark.parametrize("optimizer, penalty", [("ftrl", Penalty(1e-2, 0.0)), ("adagrad", Penalty(1e-2, 0.5)),
                                                ("adam", None)])
def test_lean_chunks_of_several_rows_a_step_equal_step_by_step(optimizer: str, penalty: Any, batch_size: int) -> None:
    """Steps of several rows: an id in several positions of a step (and the bias, in every row) gets the sum of
    their gradients, as the step path's rows update and bias gradient give it."""
    ids, y = _data(200, 5, 32)  # a last short step (200 is no multiple of 3 or 32) runs as a step
    a, b = _trainer(optimizer, penalty), _trainer(optimizer, penalty)
    r = train_chunk(a, ids, y, batch_size=batch_size)
    assert r.scanned and a.__dict__["_chunk_steps"].lean(batch_size)
    outs, losses = [], []
    for i in range(0, len(y), batch_size):
        losses.append(b.step(ids[i:i + batch_size], y[i:i + batch_size]))
        outs.append(b.last_output.copy())
    np.testing.assert_allclose(r.outputs, np.concatenate(outs), rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(r.losses, np.array(losses), rtol=RTOL, atol=ATOL)
    # the body's sums and square roots round as the step path's only within a few ulps (see _ADAM_ATOL), and FTRL's
    # z, which adds (sqrt(n + g^2) - sqrt(n)) / alpha * w at every step, keeps the difference: 3e-7 on a z of -0.1
    # was seen on an AVX-512 EPYC at 32 rows a step (CPU-dependent: it passed on a Xeon)
    _same(a, b, atol={"adam": _ADAM_ATOL, "ftrl": 1e-6}.get(optimizer, ATOL))


def test_dense_columns_keep_the_generic_body() -> None:
    ids, y = _data(60, 5, 32)
    d = _trainer("ftrl", dense=2)
    x = np.random.default_rng(0).standard_normal((60, 2)).astype(np.float32)
    train_chunk(d, {"ids": ids, "x": x}, y, batch_size=1)
    assert not _lean(d)


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_nonfinite_step_inside_a_lean_chunk(on_nonfinite: str) -> None:
    ids, y = _data(40, 5, 32)
    sw = np.ones(40, np.float32)
    sw[23] = np.inf  # its gradient is not finite
    a, b = _trainer("ftrl", on_nonfinite=on_nonfinite), _trainer("ftrl", on_nonfinite=on_nonfinite)
    if on_nonfinite == "raise":
        with pytest.raises(NonFiniteError) as got:
            train_chunk(a, ids, y, sw, batch_size=1)
        with pytest.raises(NonFiniteError) as ref:
            for i in range(40):
                b.step(ids[i:i + 1], y[i:i + 1], sw[i:i + 1])
        assert got.value.step == ref.value.step
        _same(a, b)
        return
    r = train_chunk(a, ids, y, sw, batch_size=1)
    for i in range(40):
        b.step(ids[i:i + 1], y[i:i + 1], sw[i:i + 1])
    assert r.nonfinite == 23 and r.applied == 39
    _same(a, b)
