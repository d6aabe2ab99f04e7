"""streamfit's own gradient builder (streamfit/_engine/gradient/autodiff.py): the ready-made models' gradients equal
onnxruntime-training's and finite differences, training with it gives the same weights, and without
onnxruntime-training the ready-made models train while other models are refused with a clear error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pytest
from onnx import helper
from onnxruntime.capi import _pybind_state as C

from streamfit import FMRegressor, LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor
from streamfit._engine.gradient.autodiff import build_own_gradient, unsupported_ops
from streamfit._engine.gradient.builders import build_gradient_graphs
from streamfit._engine.prepare.model import prepare_model
from streamfit._engine.steps.tables import find_tables, training_model
from streamfit._engine.testing import cnn_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError
from streamfit.models._fm_graph import fm_model
from streamfit.models._graphs import dense_model


def _dense(activation: str, dtype=np.float32, sizes=(3, 8, 2), seed=0):
    rng = np.random.default_rng(seed)
    layers = [(rng.normal(size=(a, b)) * 0.5, rng.normal(size=b) * 0.1) for a, b in zip(sizes[:-1], sizes[1:])]
    return dense_model(layers, activation, dtype)


MODELS = {
    "linear": lambda dt=np.float32: _dense("identity", dt, (4, 1)),
    "logistic-3": lambda dt=np.float32: _dense("identity", dt, (4, 3)),
    "mlp-relu": lambda dt=np.float32: _dense("relu", dt, (3, 8, 6, 2)),
    "mlp-tanh": lambda dt=np.float32: _dense("tanh", dt),
    "mlp-logistic": lambda dt=np.float32: _dense("logistic", dt),
    "fm": lambda dt=np.float32: fm_model(3, 2, 20, 4, np.random.default_rng(2), init_scale=0.3, dtype=dt),
    "fm-linear": lambda dt=np.float32: fm_model(2, 0, 20, 0, np.random.default_rng(2), dtype=dt),
}


def _feeds(pm, n: int, rng) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in pm.inputs:
        shape = (n,) + tuple(d for d in spec.shape[1:])
        feeds[spec.name] = (rng.integers(0, 20, size=shape) if spec.dtype.kind == "i"
                            else rng.normal(size=shape).astype(spec.dtype))
    return feeds


def _gradients(graphs, pm, feeds: dict[str, np.ndarray], dy: np.ndarray) -> list[np.ndarray]:
    """Run a gradient graph with dL/dY fed in place of its YieldOp (one InferenceSession run)."""
    model = onnx.ModelProto()
    model.CopyFrom(graphs.gradient)
    (yield_node,) = [n for n in model.graph.node if n.op_type == "YieldOp"]
    idx = list(model.graph.node).index(yield_node)
    model.graph.node.remove(yield_node)
    model.graph.node.insert(idx, helper.make_node("Identity", ["sf_test_dy"], [yield_node.output[0]]))
    elem = helper.np_dtype_to_tensor_dtype(dy.dtype)
    model.graph.input.append(helper.make_tensor_value_info("sf_test_dy", elem, list(dy.shape)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    run = {**{k: v for k, v in feeds.items() if k in names}, "sf_test_dy": dy,
           **{w: pm.initial[w] for w in pm.weights}}
    return session.run(graphs.grad_names + graphs.input_grad_names, run)


def _prepared(name: str, dtype=np.float32):
    pm = prepare_model(MODELS[name](dtype))
    tables = find_tables(pm) if name.startswith("fm") else ()
    return (training_model(pm, tables) if tables else pm), [u.rows for t in tables for u in t.uses]


@pytest.mark.needs_ort_training
@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_equal_onnxruntime_trainings(name) -> None:
    pm, rows = _prepared(name)
    ours, theirs = build_own_gradient(pm, rows), build_gradient_graphs(pm, rows, "onnxruntime")
    assert ours.grad_names == theirs.grad_names and ours.input_grad_names == theirs.input_grad_names
    rng = np.random.default_rng(5)
    for n in (1, 7):
        feeds = _feeds(pm, n, rng)
        for r in rows:  # the rows of the cut-out tables are inputs here
            spec = next(i for i in ours.gradient.graph.input if i.name == r)
            shape = [n] + [d.dim_value for d in spec.type.tensor_type.shape.dim[1:]]
            feeds[r] = rng.normal(size=shape).astype(np.float32)
        out_dims = len(pm.model.graph.output[0].type.tensor_type.shape.dim)
        y_cols = pm.model.graph.output[0].type.tensor_type.shape.dim[1].dim_value if out_dims > 1 else None
        dy = rng.normal(size=(n, y_cols) if y_cols else (n,)).astype(np.float32)
        for a, b in zip(_gradients(ours, pm, feeds, dy), _gradients(theirs, pm, feeds, dy)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_equal_finite_differences(name) -> None:
    pm, rows = _prepared(name, np.float64)
    graphs = build_own_gradient(pm, rows)
    rng = np.random.default_rng(7)
    n = 4
    feeds = _feeds(pm, n, rng)
    feeds = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in feeds.items()}
    for r in rows:
        spec = next(i for i in graphs.gradient.graph.input if i.name == r)
        feeds[r] = rng.normal(size=[n] + [d.dim_value for d in spec.type.tensor_type.shape.dim[1:]])
    forward = onnx.ModelProto()
    forward.CopyFrom(graphs.forward)
    session = ort.InferenceSession(forward.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def f(values: dict[str, np.ndarray]) -> np.ndarray:
        return session.run([pm.output_name], {**{k: v for k, v in feeds.items() if k in names}, **values})[0]

    params = {**{w: pm.initial[w].astype(np.float64) for w in pm.weights}, **{r: feeds[r] for r in rows}}
    y = f(params)
    dy = rng.normal(size=y.shape)
    grads = _gradients(graphs, pm, feeds, dy)
    eps = 1e-6
    for name_, g in zip(pm.weights + rows, grads):
        base = params[name_]
        numeric = np.zeros_like(base)
        for i in range(base.size):
            plus, minus = base.copy(), base.copy()
            plus.flat[i] += eps
            minus.flat[i] -= eps
            numeric.flat[i] = np.sum(dy * (f({**params, name_: plus}) - f({**params, name_: minus}))) / (2 * eps)
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-7, err_msg=name_)


@pytest.mark.needs_ort_training
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", ["linear", "mlp-relu", "mlp-tanh", "mlp-logistic", "fm"])
def test_training_with_either_builder_gives_the_same_weights(name, optimizer) -> None:
    model = MODELS[name]()
    ta = Trainer(model, optimizer=optimizer, gradient="onnxruntime", learning_rate=0.05)
    tb = Trainer(model, optimizer=optimizer, gradient="streamfit", learning_rate=0.05)
    assert (ta._sparse is None) == (tb._sparse is None)
    rng = np.random.default_rng(1)
    pm = ta.prepared
    n_out = pm.model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    for n in (1, 5, 100, 3, 80, 1):  # both batch classes
        X = _feeds(pm, n, rng)
        X = X[pm.inputs[0].name] if len(X) == 1 else X
        y = rng.normal(size=(n, n_out)).astype(np.float32)
        assert ta.step(X, y) == pytest.approx(tb.step(X, y), rel=1e-5)
    wa, wb = ta.get_weights(), tb.get_weights()
    for w in wa:
        np.testing.assert_allclose(wb[w], wa[w], rtol=1e-5, atol=1e-6, err_msg=w)


def test_own_step_graphs_use_standard_ops_only() -> None:
    trainer = Trainer(MODELS["mlp-relu"](), gradient="streamfit")
    rng = np.random.default_rng(0)
    for n in (2, 100):
        trainer.step(rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32))
    for model in (trainer._strategy.model, trainer._strategy.large_model):
        domains = {(n.domain, n.op_type) for n in model.graph.node if n.domain not in ("", "ai.onnx")}
        assert domains == set(), domains


def test_without_onnxruntime_training_ready_made_models_train(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    y = X @ np.array([1.0, -1.0, 0.5, 2.0], np.float32)
    classes = (y > 0).astype(int)
    ids = rng.integers(0, 1000, size=(300, 2)).astype(str)
    expected = [LinearRegressor(random_state=0).fit(X, y).predict(X),
                MLPRegressor(hidden_layer_sizes=(8,), random_state=0, max_iter=2).fit(X, y).predict(X),
                LogisticRegression(random_state=0).fit(X, classes).predict_proba(X),
                MLPClassifier(hidden_layer_sizes=(8,), activation="tanh", random_state=0, max_iter=2).fit(X, classes).predict_proba(X)]
    for name in ("OrtModuleGraphBuilder", "OrtModuleGraphBuilderConfiguration", "TrainingAgent"):
        monkeypatch.delattr(C, name, raising=False)
    got = [LinearRegressor(random_state=0).fit(X, y).predict(X),
           MLPRegressor(hidden_layer_sizes=(8,), random_state=0, max_iter=2).fit(X, y).predict(X),
           LogisticRegression(random_state=0).fit(X, classes).predict_proba(X),
           MLPClassifier(hidden_layer_sizes=(8,), activation="tanh", random_state=0, max_iter=2).fit(X, classes).predict_proba(X)]
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    table = pa.table({"c": ids[:, 0], "d": ids[:, 1], "x": X[:, 0]})
    fms = [FMRegressor(["c", "d"], dense=["x"], buckets=64, n_factors=4, random_state=0, optimizer=opt).fit(table, y)
           for opt in ("sgd", "adam")]  # row-sparse tables, and dense ones (Adam)
    for fm in fms:
        assert np.isfinite(fm.predict(table)).all()
    with pytest.raises(ModelError, match=r"needs onnxruntime-training at train time \(Python <= 3.12\)"):
        Trainer(cnn_model())


def test_unsupported_ops_are_named() -> None:
    pm = prepare_model(cnn_model())
    assert "Conv" in unsupported_ops(pm)
    assert unsupported_ops(prepare_model(mlp_model([3, 4, 1], activation="Tanh", gemm=True))) == []
