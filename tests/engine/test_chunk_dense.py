"""The lean one-row step of a linear model (streamfit._engine.steps.scan_dense): its chunks give what one step per
call gives -- outputs, losses, weights, optimizer state -- within float32 rounding, in fewer body nodes; models and
rules it does not write keep the generic body."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamfit import LinearRegressor, LogisticRegression
from streamfit._engine.common.names import Names
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan import ChunkSteps, train_chunk
from streamfit._engine.testing import linear_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import NonFiniteError
from streamfit.penalties import Penalty
from streamfit.schedules import InvScaling
from tests.engine.test_chunk_steps import _by_steps, assert_same_state

#: a few float32 ulps a step apart (a Gemm rounds its two products once where the step graph rounds each)
RTOL, ATOL = 1e-6, 1e-6


def _data(n: int, logistic: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4)).astype(np.float32)
    if logistic:
        return X, (X[:, 0] + 0.5 * rng.standard_normal(n) > 0).astype(np.float32)
    return X, (X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _trainer(logistic: bool, optimizer: str, penalty: Any = None, **kw: Any) -> Trainer:
    return Trainer(linear_model(4, seed=1), loss="log_loss" if logistic else "squared_error", optimizer=optimizer,
                   learning_rate=0.05, penalty=penalty, **kw)


def _chunks(tr: Trainer) -> ChunkSteps:
    return tr.__dict__["_chunk_steps"]


def _body_nodes(tr: Trainer) -> int:
    (model,) = _chunks(tr).models.values()
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    return len(next(a.g for a in scan.attribute if a.name == "body").node)


def _same(a: Trainer, b: Trainer) -> None:
    assert_same_state(a, b, ATOL)


#: the lean body's nodes (after onnxruntime's fusions), sigmoid aside: one row a step, then several (the loss
#: gradient a difference and a product instead of one Gemm)
_NODES = {("sgd", False): (3, 4), ("adam", False): (10, 11), ("adam", True): (11, 12)}
if fused_adam.kernel_available():  # Adam's seven update nodes are onnxruntime-training's one kernel node
    _NODES.update({("adam", False): (4, 5), ("adam", True): (5, 6)})


@pytest.mark.parametrize("weighted", [True, False], ids=["sample-weights", "uniform"])
@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("logistic", [True, False], ids=["logistic", "linear"])
@pytest.mark.parametrize("optimizer, penalty", [("sgd", None), ("adam", None), ("adam", Penalty(1e-2, 0.0))])
def test_lean_chunks_equal_step_by_step(logistic: bool, optimizer: str, penalty: Any, batch_size: int,
                                        weighted: bool) -> None:
    n = 10 * batch_size + batch_size // 2 + 1  # a short last step, taken by the step path
    X, y = _data(n, logistic)
    sw = np.random.default_rng(4).uniform(0, 2, n).astype(np.float32) if weighted else None
    a, b = _trainer(logistic, optimizer, penalty), _trainer(logistic, optimizer, penalty)
    outs, losses = two_chunks(a, X, y, sw, batch_size)
    layout = next(iter(_chunks(a).layouts.values()))
    assert layout.column  # the lean step's parameter column, not the generic vector
    assert _body_nodes(a) == _NODES[optimizer, penalty is not None][batch_size > 1] + logistic  # the sigmoid
    # without sample weights (a constant rate), the row weights are given once, not scanned per step
    assert _uniform(a) is (not weighted)
    ref_out, ref_loss = _by_steps(b, X, y, batch_size, sw)
    np.testing.assert_allclose(outs, ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(losses, ref_loss, rtol=RTOL, atol=ATOL)
    _same(a, b)


def _uniform(tr: Trainer) -> bool:
    """Whether ``tr``'s one chunk graph takes its row weights once: its key says so, and its Scan scans none."""
    ((key, model),) = _chunks(tr).models.items()
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    scanned_weights = [i for i in scan.input if i.endswith(Names.grad_weight) or i.endswith(Names.loss_weight)]
    given_once = {Names.grad_weight, Names.loss_weight} <= {i.name for i in model.graph.input}
    assert key[4] is given_once and given_once is not bool(scanned_weights)
    return bool(key[4])


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_schedule_folded_into_the_row_weights_keeps_them_per_step(batch_size: int) -> None:
    """SGD folds its rate into the gradient's row weights: a rate that changes per step keeps them scanned, and
    the chunk still equals step by step across its boundary."""
    X, y = _data(10 * batch_size + 1, True)
    a, b = (Trainer(linear_model(4, seed=1), loss="log_loss", optimizer="sgd",
                    learning_rate=InvScaling(0.5, power_t=0.5)) for _ in range(2))
    outs, losses = two_chunks(a, X, y, None, batch_size)
    assert not _uniform(a)
    ref_out, ref_loss = _by_steps(b, X, y, batch_size)
    np.testing.assert_allclose(outs, ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(losses, ref_loss, rtol=RTOL, atol=ATOL)
    _same(a, b)


def two_chunks(tr: Trainer, X: np.ndarray, y: np.ndarray, sw: np.ndarray | None, batch_size: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """The outputs and losses of ``tr`` trained on two chunks (the second starts from the first one's state; 4 steps,
    then the rest), each one Scan."""
    outs, losses = [], []
    cut = 4 * batch_size
    for lo, hi in ((0, cut), (cut, len(X))):
        r = train_chunk(tr, X[lo:hi], y[lo:hi], None if sw is None else sw[lo:hi], batch_size=batch_size)
        assert r.scanned and r.nonfinite is None
        outs.append(r.outputs)
        losses.append(r.losses)
    return np.concatenate(outs), np.concatenate(losses)


def test_the_generic_body_is_kept_where_the_lean_step_does_not_apply() -> None:
    X, y = _data(60, True)
    cases = [_trainer(True, "sgd", Penalty(1e-2, 0.0)),  # SGD's penalty decays the weights: not written here
             _trainer(True, "adagrad"), _trainer(True, "adam", Penalty(1e-2, 0.5))]  # an L1 part
    for tr in cases:
        train_chunk(tr, X, y, batch_size=1)
        assert not any(layout.column for layout in _chunks(tr).layouts.values())


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_nonfinite_row_inside_a_lean_chunk(on_nonfinite: str) -> None:
    X, y = _data(30, False)
    X[17, 2] = 3e38  # its step's loss overflows float32
    a, b = (_trainer(False, "adam", on_nonfinite=on_nonfinite) for _ in range(2))
    check_nonfinite_row(a, b, X, y, ATOL)


def check_nonfinite_row(a: Trainer, b: Trainer, X: np.ndarray, y: np.ndarray, atol: float) -> None:
    """Row 17 of ``X`` makes a non-finite step: trainer ``a``'s one-row chunk stops (``on_nonfinite="raise"``) or
    skips it (``"skip"``) as ``b`` does one step per call, the same step named and the same state after."""
    if a.on_nonfinite == "raise":
        with pytest.raises(NonFiniteError) as got:
            train_chunk(a, X, y, batch_size=1)
        with pytest.raises(NonFiniteError) as ref:
            _by_steps(b, X, y, 1)
        assert got.value.step == ref.value.step == 18
        assert_same_state(a, b, atol)
        return
    r = train_chunk(a, X, y, batch_size=1)
    _by_steps(b, X, y, 1)
    assert r.nonfinite == 17 and r.applied == 29
    assert_same_state(a, b, atol)
    assert all(np.isfinite(w).all() for w in a.get_weights().values())


@pytest.mark.parametrize("make", [lambda: LogisticRegression(batch_size=1),
                                  lambda: LinearRegressor(batch_size=1, optimizer="sgd", penalty=None)],
                         ids=["LogisticRegression", "LinearRegressor-sgd"])
def test_ready_made_one_row_chunks_run_the_lean_step_and_match_one_call_per_row(make: Any) -> None:
    check_ready_made_chunks(make, lambda layout: layout.column, 120, ATOL)


def check_ready_made_chunks(make: Any, lean: Any, n: int, atol: float) -> None:
    """A ready-made estimator's ``partial_fit_predict`` of ``n`` rows at once runs a lean step (``lean(layout)``) and
    gives the predictions and weights of one call per row."""
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((n, 3)) * [1, 10, 0.1] + [0, 5, -2]).astype(np.float32)
    y = X[:, 0] - 0.2 * X[:, 1] + rng.standard_normal(n)
    a, b = make(), make()
    kw = {"classes": [False, True]} if hasattr(a, "predict_proba") else {}
    target = y > 0 if kw else y
    got = a.partial_fit_predict(X, target, **kw)
    ref = np.concatenate([b.partial_fit_predict(X[i:i + 1], target[i:i + 1], **(kw if i == 0 else {}))
                          for i in range(len(X))])
    assert any(lean(layout) for layout in _chunks(a.trainer_).layouts.values())
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=atol)
    for k, v in b.trainer_.get_weights().items():
        np.testing.assert_allclose(a.trainer_.get_weights()[k], v, rtol=RTOL, atol=atol, err_msg=k)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_chunks_of_one_shape_reuse_their_bindings_in_both_directions(optimizer: str) -> None:
    """Three chunks of one shape run on the buffers bound for the first (read from either ping-pong set in turn):
    the results are step by step's, and an earlier chunk's outputs are not overwritten by a later one."""
    X, y = _data(60, True)
    a, b = _trainer(True, optimizer), _trainer(True, optimizer)
    results = [train_chunk(a, X[lo:lo + 20], y[lo:lo + 20]) for lo in (0, 20, 40)]
    assert len(_chunks(a)._bound) == 1  # one shape, bound once
    kept = [r.outputs.copy() for r in results]
    ref_out, ref_loss = _by_steps(b, X, y, 1)
    for r, k in zip(results, kept):
        np.testing.assert_array_equal(r.outputs, k)
    np.testing.assert_allclose(np.concatenate(kept), ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.concatenate([r.losses for r in results]), ref_loss, rtol=RTOL, atol=ATOL)
    _same(a, b)
