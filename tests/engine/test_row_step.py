"""A linear model's steps of one row (streamfit._engine.steps.scan_dense.row_step_graph): the lean step run on its
own, its weights and optimizer slots held as columns of the ping-pong sets.  It gives what the generic step graph
gives -- outputs, losses, weights, optimizer state -- within float32 rounding, checks all it writes, and the
columns are the weights: read, written and saved through either."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamfit import LogisticRegression
from streamfit._engine.testing import linear_model
from streamfit._engine.steps import fused_adam
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import NonFiniteError
from streamfit.penalties import Penalty
from tests.engine.test_chunk_dense import _data
from tests.engine.test_chunk_steps import assert_same_state

#: a few float32 ulps a step (a Gemm rounds its two products once where the step graph rounds each)
RTOL, ATOL = 1e-6, 1e-6


def _pair(monkeypatch: pytest.MonkeyPatch, logistic: bool, optimizer: str, penalty: Any = None,
          **kw: Any) -> tuple[Trainer, Trainer]:
    """(the lean trainer, the same one on the generic graphs)."""
    def make() -> Trainer:
        return Trainer(linear_model(4, seed=1), loss="log_loss" if logistic else "squared_error",
                       optimizer=optimizer, learning_rate=0.05, penalty=penalty, **kw)

    lean = make()
    with monkeypatch.context() as m:
        m.setattr(Trainer, "lean_steps", False)
        generic = make()
    return lean, generic


def _steps(tr: Trainer, X: np.ndarray, y: np.ndarray, sw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    outs, losses = [], []
    for i in range(len(X)):
        losses.append(tr.step(X[i:i + 1], y[i:i + 1], None if sw is None else sw[i:i + 1]))
        outs.append(tr.last_output.copy())
    return np.concatenate(outs), np.array(losses)


@pytest.mark.parametrize("logistic", [True, False], ids=["logistic", "linear"])
@pytest.mark.parametrize("optimizer, penalty", [("sgd", None), ("adam", None), ("adam", Penalty(1e-2, 0.0))])
def test_the_lean_row_step_equals_the_generic_one(monkeypatch: pytest.MonkeyPatch, logistic: bool, optimizer: str,
                                                  penalty: Any) -> None:
    X, y = _data(200, logistic)
    sw = np.random.default_rng(3).uniform(0, 2, 200).astype(np.float32)
    lean, generic = _pair(monkeypatch, logistic, optimizer, penalty)
    got_out, got_loss = _steps(lean, X, y, sw)
    ref_out, ref_loss = _steps(generic, X, y, sw)
    assert lean._strategy.row_model is not None and generic._strategy.row_model is None
    np.testing.assert_allclose(got_out, ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got_loss, ref_loss, rtol=RTOL, atol=ATOL)  # the host's loss, the graph's
    assert_same_state(lean, generic, ATOL)
    nodes = len(lean._strategy.row_model.graph.node)
    assert nodes < len(generic._strategy.model.graph.node) and nodes <= 22  # no loss nodes, one update


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_nonfinite_row_is_not_applied(monkeypatch: pytest.MonkeyPatch, on_nonfinite: str) -> None:
    X, y = _data(30, False)
    X[17, 2] = 3e38  # its step's output overflows float32
    lean, generic = _pair(monkeypatch, False, "adam", on_nonfinite=on_nonfinite)
    for tr in (lean, generic):
        if on_nonfinite == "raise":
            with pytest.raises(NonFiniteError) as err:
                _steps(tr, X, y)
            assert err.value.step == 18
        else:
            _steps(tr, X, y)
            assert tr.n_skipped == 1
    assert_same_state(lean, generic, ATOL)
    assert all(np.isfinite(w).all() for w in lean.get_weights().values())


def _batches(tr: Trainer, X: np.ndarray, y: np.ndarray, sizes: list[int], sw: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    outs, losses, at = [], [], 0
    for n in sizes:
        losses.append(tr.step(X[at:at + n], y[at:at + n], None if sw is None else sw[at:at + n]))
        outs.append(tr.last_output.copy())
        at += n
    return np.concatenate(outs), np.array(losses)


@pytest.mark.parametrize("logistic", [True, False], ids=["logistic", "linear"])
@pytest.mark.parametrize("optimizer, penalty", [("sgd", None), ("adam", None), ("adam", Penalty(1e-2, 0.0))])
def test_the_lean_batch_step_equals_the_generic_one(monkeypatch: pytest.MonkeyPatch, logistic: bool, optimizer: str,
                                                    penalty: Any) -> None:
    """Batches of 2 to 63 rows given one per call run the lean batch step (batch_step_graph: one graph for every
    size, its 1s bound per size), within float32 rounding of the generic step graph, sample weights included;
    one row still runs the row step, 64 rows the large-batch graph."""
    sizes = [2, 5, 32, 63, 1, 32, 64, 3, 32, 7]
    X, y = _data(sum(sizes), logistic)
    sw = np.random.default_rng(3).uniform(0, 2, len(X)).astype(np.float32)
    lean, generic = _pair(monkeypatch, logistic, optimizer, penalty)
    got_out, got_loss = _batches(lean, X, y, sizes, sw)
    ref_out, ref_loss = _batches(generic, X, y, sizes, sw)
    assert lean._strategy.batch_model is not None and generic._strategy.batch_model is None
    assert lean._strategy._batch_session is not None and lean._strategy.large_model is not None
    np.testing.assert_allclose(got_out, ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got_loss, ref_loss, rtol=RTOL, atol=ATOL)  # the graph's loss: a batch's mean
    assert_same_state(lean, generic, ATOL)


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_nonfinite_batch_is_not_applied(monkeypatch: pytest.MonkeyPatch, on_nonfinite: str) -> None:
    X, y = _data(40, True)
    X[21, 1] = 3e38  # in the third batch of 8 rows: its step's output overflows float32
    lean, generic = _pair(monkeypatch, True, "adam", on_nonfinite=on_nonfinite)
    for tr in (lean, generic):
        if on_nonfinite == "raise":
            with pytest.raises(NonFiniteError) as err:
                _batches(tr, X, y, [8] * 5)
            assert err.value.step == 3
        else:
            _batches(tr, X, y, [8] * 5)
            assert tr.n_skipped == 1 and tr.n_steps == 4
    assert_same_state(lean, generic, ATOL)
    assert all(np.isfinite(w).all() for w in lean.get_weights().values())


def test_a_huge_but_finite_update_overflowing_the_moments_is_caught() -> None:
    """A step whose loss is finite but whose gradient's square overflows is not applied: the graph checks what it
    writes (the new theta and second moment), not only the loss."""
    tr = Trainer(linear_model(4, seed=1), optimizer="adam", learning_rate=0.05, on_nonfinite="skip")
    tr.step(np.ones((1, 4), np.float32), np.zeros(1, np.float32))
    before = {k: v.copy() for k, v in tr.optimizer_state().items()}
    # output ~1e11: a finite loss (~1e22) and gradient (~1e23), whose square overflows float32
    loss = tr.step(np.full((1, 4), 1e12, np.float32), np.zeros(1, np.float32))
    assert np.isfinite(loss) and tr.n_skipped == 1
    for k, v in tr.optimizer_state().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_the_columns_are_the_weights() -> None:
    tr = Trainer(linear_model(4, seed=1), loss="log_loss", optimizer="adam", learning_rate=0.05)
    assert tr._dense is not None
    columns = tr.params.live_columns()
    theta = columns["sfc_theta"].numpy()
    coef, intercept = tr._dense.coef, tr._dense.intercept
    np.testing.assert_array_equal(theta[:4], tr.get_weights()[coef])
    tr.set_weights({coef: np.arange(4, dtype=np.float32).reshape(4, 1), intercept: np.array([7.0], np.float32)})
    np.testing.assert_array_equal(tr.params.live_columns()["sfc_theta"].numpy().ravel(), [0, 1, 2, 3, 7])
    X, y = _data(20, True)
    _steps(tr, X, y)
    state = tr.state_dict()
    other = Trainer(linear_model(4, seed=2), loss="log_loss", optimizer="adam", learning_rate=0.05)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.params.live_columns()["sfc_theta"].numpy(),
                                  tr.params.live_columns()["sfc_theta"].numpy())
    out_a, _ = _steps(tr, X, y)
    out_b, _ = _steps(other, X, y)
    np.testing.assert_array_equal(out_a, out_b)  # a resumed trainer goes on with the same bits


def test_a_ready_made_model_takes_the_lean_row_step() -> None:
    X, y = _data(50, True)
    est = LogisticRegression()
    for i in range(len(X)):
        est.partial_fit(X[i:i + 1], y[i:i + 1], classes=[0.0, 1.0])
    assert est.trainer_._strategy.row_model is not None
    assert np.isfinite(est.loss_)


@pytest.mark.parametrize("lean_steps", [True, False], ids=["lean", "generic"])
def test_the_per_step_scalars_written_a_block_at_a_time_are_those_of_each_step(monkeypatch: pytest.MonkeyPatch,
                                                                                lean_steps: bool) -> None:
    """Adam's scalars change every step; at a held rate they are computed for many steps at once
    (``Trainer._scalar_table``) and a row written per step.  Every step's block holds what the optimizer's own
    ``scalars`` give for that step (float64, then cast): across the table's end, after a change of rate, and
    when the rate changes every step (no table)."""
    monkeypatch.setattr(Trainer, "lean_steps", lean_steps)
    tr = Trainer(linear_model(4, seed=2), loss="log_loss", optimizer="adam", learning_rate=0.05,
                 penalty=Penalty(1e-2, 0.0))
    X, y = _data(700, True)
    names = tr.scalars.block_names
    kernel = lean_steps and fused_adam.applies(tr)  # the step number, not the folded rate and eps
    assert tr._block_rows and len(names) == (5 if kernel else 6 if lean_steps else 4)
    seen_table = 0
    for i in range(len(X)):
        if i == 300:
            tr.lr_scale = 0.5  # a new rate: the old table no longer applies
        if i >= 600:
            tr.lr_scale = 1.0 / (1 + i)  # a rate that changes every step: the per-step path
        t = tr.n_steps
        tr.step(X[i:i + 1], y[i:i + 1])
        lr = tr.schedule.lr * tr.lr_scale
        values = list(tr.optimizer.scalars(lr, t)) + [1.0 - lr * 1e-2]
        if kernel:
            values.append(fused_adam.step_number(t))
        elif lean_steps:
            values += [values[1] / values[2], tr.optimizer.eps / values[2]]
        want = np.array(values, np.float64).astype(np.float32)
        np.testing.assert_array_equal(tr.scalars.block, want, err_msg=f"step {t}")
        for name, value in zip(names, want):  # the bound arrays are views of the block
            assert tr.scalars.arrays[name].item() == value
        seen_table += tr._scalar_rows is not None and tr._scalar_rows.first <= t
    assert seen_table > 500  # the table served most steps


def test_a_row_step_whose_check_overflows_on_finite_values_is_checked_exactly() -> None:
    """Adam's lean row step checks ``theta . v`` (one node): huge finite weights and second moments overflow
    it.  The step then checks the new values exactly, and applies them when all are finite; a row that makes a
    value non-finite is still refused."""
    tr = Trainer(linear_model(4, seed=1), loss="squared_error", optimizer="adam", learning_rate=0.05)
    tr.step(np.zeros((1, 4), np.float32), np.zeros(1, np.float32))
    assert tr._strategy.row_model is not None
    w = tr.get_weights()
    tr.set_weights({k: np.full_like(v, 1e4) for k, v in w.items()})
    X = np.array([[3e7, 0, 0, 0]], np.float32)  # g = 1e4 x**2 ~ 1e19: v ~ 1e35 (finite), theta . v ~ 1e39 (inf)
    tr.step(X, np.zeros(1, np.float32))
    assert tr.n_steps == 2 and tr.n_skipped == 0
    state = {**tr.get_weights(), **tr.optimizer_state()}
    assert all(np.isfinite(v).all() for v in state.values())
    assert max(float(np.abs(v).max()) * 1e4 for k, v in state.items() if k.endswith("exp_avg_sq")) > 3.4e38
    skipping = Trainer(linear_model(4, seed=1), loss="squared_error", optimizer="adam", learning_rate=0.05,
                       on_nonfinite="skip")
    skipping.step(np.zeros((1, 4), np.float32), np.zeros(1, np.float32))
    skipping.step(np.array([[1e30, 0, 0, 0]], np.float32), np.zeros(1, np.float32))  # g**2 overflows: v inf
    assert skipping.n_skipped == 1
