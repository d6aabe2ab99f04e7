"""A ready-made estimator's partial_fit / partial_fit_predict on many rows trains ceil(n / batch_size) steps in one
session run (streamfit.models._chunks) and gives exactly what the same rows give one call per step: the
predictions each step made before its update, weights, optimizer state, input and target statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamfit import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor
from streamfit.exceptions import NonFiniteError

RTOL, ATOL = 1e-6, 1e-7


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((n, 4)) * [1, 5, 0.2, 3] + [3, -1, 10, 0]).astype(np.float32)
    y = (X @ np.array([1, -0.5, 2, 0.1]) + 3 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    labels = np.where(X[:, 0] > 3, "yes", "no")
    multi = np.array(["a", "b", "c"])[np.digitize(X[:, 1], [-3, 1])]
    return X, y, labels, multi


def _same_state(a: Any, b: Any) -> None:
    sa, sb = a.trainer_.state_dict(), b.trainer_.state_dict()
    for part in ("weights", "optimizer"):
        for k in sb[part]:
            np.testing.assert_allclose(sa[part][k], sb[part][k], rtol=RTOL, atol=ATOL, err_msg=f"{part} {k}")
    assert (a.t_, a.trainer_.n_steps, a.trainer_.schedule.t) == (b.t_, b.trainer_.n_steps, b.trainer_.schedule.t)
    for name in ("scaler_", "target_scaler_"):
        if getattr(b, name, None) is not None:
            for k, v in getattr(b, name).state_dict().items():
                np.testing.assert_array_equal(getattr(a, name).state_dict()[k], v, err_msg=f"{name} {k}")


CASES = [(LinearRegressor, {}), (LinearRegressor, {"optimizer": "sgd", "learning_rate": "invscaling"}),
         (MLPRegressor, {"hidden_layer_sizes": (8,)}), (LogisticRegression, {}),
         (LogisticRegression, {"optimizer": "sgd", "learning_rate": "constant", "eta0": 0.05}),
         (MLPClassifier, {"hidden_layer_sizes": (8,)})]


@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("cls, params", CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_many_rows_per_call_equal_one_call_per_step(cls: Any, params: dict[str, Any], batch_size: int) -> None:
    X, y, labels, multi = _data(200 if batch_size == 32 else 91)
    target = y if "Regressor" in cls.__name__ else (multi if cls is MLPClassifier else labels)
    kw = {} if "Regressor" in cls.__name__ else {"classes": np.unique(target)}
    a, b = cls(batch_size=batch_size, random_state=0, **params), cls(batch_size=batch_size, random_state=0, **params)
    cut = 2 * batch_size + 1  # the second call starts inside a step's rows: its own steps, as a call would
    got = np.concatenate([a.partial_fit_predict(X[:cut], target[:cut], **kw),
                          a.partial_fit_predict(X[cut:], target[cut:])])
    ref = []
    for s in list(range(0, cut, batch_size)) + list(range(cut, len(X), batch_size)):
        e = min(s + batch_size, cut if s < cut else len(X))
        ref.append(b.partial_fit_predict(X[s:e], target[s:e], **(kw if s == 0 else {})))
    np.testing.assert_allclose(got, np.concatenate(ref), rtol=RTOL, atol=ATOL)
    _same_state(a, b)
    chunks = a.trainer_.__dict__.get("_chunk_steps")
    assert chunks is not None and chunks.models  # the steps ran as a Scan, not one call each


def test_partial_fit_many_rows_equals_partial_fit_predict() -> None:
    X, y, _, _ = _data(64)
    a, b = LinearRegressor(batch_size=1), LinearRegressor(batch_size=1)
    a.partial_fit(X, y)
    b.partial_fit_predict(X, y)
    _same_state(a, b)


def test_a_nonfinite_step_inside_a_call_stops_there_with_the_statistics_of_step_by_step() -> None:
    X, y, _, _ = _data(40)
    y[22] = 3e38  # its squared error overflows float32
    a, b = LinearRegressor(batch_size=2, standardize_target=False), LinearRegressor(batch_size=2,
                                                                                   standardize_target=False)
    with pytest.raises(NonFiniteError):
        a.partial_fit(X, y)
    with pytest.raises(NonFiniteError):
        for s in range(0, 40, 2):
            b.partial_fit(X[s:s + 2], y[s:s + 2])
    _same_state(a, b)


def test_the_loop_keeps_only_what_depends_on_the_weights() -> None:
    """The standardization (rows and per-step statistics only) runs before the Scan, the log loss (outputs and
    targets only) after it: the body is the forward pass, the gradient and the update."""
    X, _, labels, _ = _data(64)
    est = LogisticRegression(batch_size=1, optimizer="sgd", learning_rate="constant", eta0=0.05, penalty=None)
    est.partial_fit(X, labels, classes=["no", "yes"])
    (model,) = est.trainer_.__dict__["_chunk_steps"].models.values()
    ops = [n.op_type for n in model.graph.node]
    scan = model.graph.node[ops.index("Scan")]
    body = [n.op_type for n in next(a.g for a in scan.attribute if a.name == "body").node]
    assert ops[:ops.index("Scan")].count("Div") == 1 and "Div" not in body  # (X - mean) / scale, once
    assert {"Log", "Exp"} <= set(ops[ops.index("Scan"):]) and not {"Log", "Exp"} & set(body)
    assert len(body) <= 8  # MatMul, Add, Sigmoid, Sub, Mul (the gradient weight), Gemm, ReduceSum, Sub
    assert np.isfinite(est.loss_)


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("cls, params", CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_many_rows_per_call_equal_one_call_per_step_bit_for_bit(cls: Any, params: dict[str, Any], batch_size: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU (onnxruntime-training 1.19 and the newest onnxruntime) the generic chunk body gives the bits of one call
    per step (what runs outside the loop is exact arithmetic, and the loop body is the step's own nodes).  A linear
    model's steps run a leaner step by default (steps/scan_dense.py, within rounding: the test above); turned off
    here, they run the generic graphs."""
    from streamfit._engine.trainer import Trainer

    monkeypatch.setattr(Trainer, "lean_steps", False)
    X, y, labels, multi = _data(60)
    target = y if "Regressor" in cls.__name__ else (multi if cls is MLPClassifier else labels)
    kw = {} if "Regressor" in cls.__name__ else {"classes": np.unique(target)}
    a, b = cls(batch_size=batch_size, random_state=0, **params), cls(batch_size=batch_size, random_state=0, **params)
    got = a.partial_fit_predict(X, target, **kw)
    ref = np.concatenate([b.partial_fit_predict(X[s:s + batch_size], target[s:s + batch_size], **(kw if s == 0 else {}))
                          for s in range(0, len(X), batch_size)])
    np.testing.assert_array_equal(got, ref)
    for part in ("weights", "optimizer"):
        for k, v in b.trainer_.state_dict()[part].items():
            np.testing.assert_array_equal(a.trainer_.state_dict()[part][k], v, err_msg=f"{part} {k}")


@pytest.mark.parametrize("batch_size", [3, 32])
@pytest.mark.parametrize("cls, params", [(LinearRegressor, {}), (LogisticRegression, {}),
                                         (LogisticRegression, {"optimizer": "sgd", "learning_rate": "constant",
                                                               "eta0": 0.05, "penalty": None})],
                         ids=lambda c: getattr(c, "__name__", str(c)))
def test_a_linear_models_lean_chunks_equal_one_call_per_step_bit_for_bit(cls: Any, params: dict[str, Any],
                                                                          batch_size: int) -> None:
    """A linear model's steps of several rows run the same lean nodes in a chunk's body and one call each
    (steps/scan_dense.py: batch_step_graph), so a chunk gives the bits of one call per step, the last short step
    included.  Adam without onnxruntime-training's kernel (the newest plain onnxruntime) folds its bias
    corrections into the rate before the loop in float32 where a call gets them from the host: within rounding."""
    from streamfit._engine.steps import fused_adam

    exact = params.get("optimizer") == "sgd" or fused_adam.kernel_available()
    same = np.testing.assert_array_equal if exact else lambda a, b, err_msg="": np.testing.assert_allclose(
        a, b, rtol=RTOL, atol=ATOL, err_msg=err_msg)
    X, y, labels, _ = _data(200)
    target = y if cls is LinearRegressor else labels
    kw = {} if cls is LinearRegressor else {"classes": np.unique(target)}
    a, b = cls(batch_size=batch_size, random_state=0, **params), cls(batch_size=batch_size, random_state=0, **params)
    got = a.partial_fit_predict(X, target, **kw)
    ref = np.concatenate([b.partial_fit_predict(X[s:s + batch_size], target[s:s + batch_size], **(kw if s == 0 else {}))
                          for s in range(0, len(X), batch_size)])
    assert a.trainer_._dense is not None and b.trainer_._strategy._batch_session is not None
    same(got, ref)
    for part in ("weights", "optimizer"):
        for k, v in b.trainer_.state_dict()[part].items():
            same(a.trainer_.state_dict()[part][k], v, err_msg=f"{part} {k}")
