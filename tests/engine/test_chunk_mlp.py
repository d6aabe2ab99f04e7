"""The lean step of an MLP (streamfit._engine.steps.scan_mlp): its chunks give what one step per call gives
-- outputs, losses, weights, Adam's moments -- within float32 rounding, in fewer body nodes than the generic body;
models and rules it does not write keep the generic body."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from streamfit import MLPClassifier, MLPRegressor
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan import train_chunk
from streamfit._engine.testing import mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.penalties import Penalty
from tests.engine.test_chunk_dense import (_body_nodes, _chunks, check_nonfinite_row, check_ready_made_chunks,
                                           two_chunks)
from tests.engine.test_chunk_steps import GRADIENTS, _by_steps, assert_same_state

#: a few float32 ulps a step apart (a Gemm rounds its two products once where the step graph rounds each), which
#: Adam's normalized step lets wander: the largest weight difference 2.4e-7 after 90 one-row steps, 1.4e-6 after
#: 3000 (4-16-8-1 relu/tanh regressor with L2), 1.3e-6 after 53 in the worst case of the tests below
RTOL, ATOL = 1e-6, 5e-6


def _data(n: int, logistic: bool, width: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, width)).astype(np.float32)
    if logistic:
        return X, (X[:, 0] * X[:, 1] + 0.3 * rng.standard_normal(n) > 0).astype(np.float32)
    return X, (X[:, 0] - 2 * np.tanh(X[:, 1]) + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _trainer(sizes: list[int], activation: Any, logistic: bool, gradient: str = "streamfit", optimizer: str = "adam",
             penalty: Any = None, lean: bool = True, **kw: Any) -> Trainer:
    tr = Trainer(mlp_model(sizes, activation=activation, seed=2), loss="log_loss" if logistic else "squared_error",
                 optimizer=optimizer, learning_rate=0.02, penalty=penalty, gradient=gradient, **kw)
    tr.lean_steps = lean
    return tr


def _lean(tr: Trainer) -> bool:
    return any(layout.row for layout in _chunks(tr).layouts.values())


@pytest.mark.parametrize("gradient", GRADIENTS)
@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("sizes, activation", [([4, 16, 1], "Relu"), ([4, 16, 8, 1], ["Relu", "Tanh"]),
                                               ([4, 6, 1], "Sigmoid"), ([4, 5, 3, 1], "Tanh")],
                         ids=["relu", "relu-tanh", "logistic", "tanh-tanh"])
@pytest.mark.parametrize("logistic", [True, False], ids=["log_loss", "squared_error"])
@pytest.mark.parametrize("penalty", [None, Penalty(1e-2, 0.0)], ids=["no-penalty", "l2"])
def test_lean_mlp_chunks_equal_step_by_step(sizes: list[int], activation: Any, logistic: bool, penalty: Any,
                                            batch_size: int, gradient: str) -> None:
    n = 10 * batch_size + batch_size // 2 + 1  # a short last step, taken by the step path
    X, y = _data(n, logistic)
    sw = np.random.default_rng(4).uniform(0, 2, n).astype(np.float32)
    a, b = (_trainer(sizes, activation, logistic, gradient, penalty=penalty) for _ in range(2))
    generic = _trainer(sizes, activation, logistic, gradient, penalty=penalty, lean=False)
    outs, losses = two_chunks(a, X, y, sw, batch_size)
    train_chunk(generic, X, y, sw, batch_size=batch_size)
    assert _lean(a) and not _lean(generic)
    assert _body_nodes(a) < _body_nodes(generic)
    ref_out, ref_loss = _by_steps(b, X, y, batch_size, sw)
    np.testing.assert_allclose(outs.reshape(ref_out.shape), ref_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(losses, ref_loss, rtol=RTOL, atol=ATOL)
    assert_same_state(a, b, ATOL)
    assert_same_state(generic, b, ATOL)


@pytest.mark.parametrize("batch_size, nodes", [(1, 23), (32, 26)])
def test_the_default_mlp_body_is_lean(batch_size: int, nodes: int) -> None:
    """One hidden layer of relu units, Adam with L2: the node counts this step exists for (37 generic); six
    fewer where Adam's update is onnxruntime-training's kernel (steps/fused_adam.py)."""
    if fused_adam.kernel_available():
        nodes -= 6
    X, y = _data(4 * batch_size, True, width=9)
    tr = _trainer([9, 100, 1], "Relu", True, penalty=Penalty(1e-4, 0.0))
    train_chunk(tr, X, y, batch_size=batch_size)
    assert _lean(tr) and _body_nodes(tr) == nodes


@pytest.mark.parametrize("case", ["sgd", "l1", "two-outputs", "no-hidden-layer"])
def test_the_generic_body_is_kept_where_the_lean_mlp_step_does_not_apply(case: str) -> None:
    X, y = _data(60, False)
    batch_size = 1
    if case == "two-outputs":
        tr = _trainer([4, 8, 2], "Relu", False)
        y = np.stack([y, -y], axis=1)
    elif case == "no-hidden-layer":
        tr = _trainer([4, 1], "Relu", False)
    else:
        tr = _trainer([4, 8, 1], "Relu", False, optimizer="sgd" if case == "sgd" else "adam",
                      penalty=Penalty(1e-2, 0.5) if case == "l1" else None)
    r = train_chunk(tr, X, y, batch_size=batch_size)
    assert r.scanned and not _lean(tr)


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_nonfinite_row_inside_a_lean_mlp_chunk(on_nonfinite: str) -> None:
    X, y = _data(30, False)
    X[17, 2] = 3e38  # its step's output overflows float32
    a, b = (_trainer([4, 8, 1], "Relu", False, on_nonfinite=on_nonfinite) for _ in range(2))
    check_nonfinite_row(a, b, X, y, ATOL)
    assert _lean(a)


@pytest.mark.parametrize("make", [lambda: MLPClassifier(hidden_layer_sizes=(32,), batch_size=1, random_state=0),
                                  lambda: MLPRegressor(hidden_layer_sizes=(16, 8), activation="tanh", batch_size=1,
                                                       random_state=0)],
                         ids=["MLPClassifier", "MLPRegressor-tanh"])
def test_ready_made_mlp_one_row_chunks_run_the_lean_step_and_match_one_call_per_row(make: Any) -> None:
    check_ready_made_chunks(make, lambda layout: layout.row, 150, ATOL)
