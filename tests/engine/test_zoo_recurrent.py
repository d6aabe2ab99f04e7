"""LSTM and GRU variants that were refused now train (issue 21, item 2 remainder): batch-first nodes
(``layout=1``, which onnxruntime's kernels do not run at all, predict included) as a layout-0 node between
Transposes, checked against a layout-0 twin run by onnxruntime's own kernel; packed sequences (``sequence_lens``,
which onnxruntime-training's kernels refuse) as masked runs over the padded sequence, checked against the author's
node in onnxruntime inference and the gradient against finite differences of it; a forward node without initial
states (before: onnxruntime-training's builder read its output as sequence_lens) trains."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError

H, I, T, N = 3, 2, 5, 4


def _weights(op: str, D: int, seed: int = 0) -> dict[str, np.ndarray]:
    g = 4 if op == "LSTM" else 3
    rng = np.random.default_rng(seed)
    return {"W": (0.5 * rng.standard_normal((D, g * H, I))).astype(np.float32),
            "R": (0.5 * rng.standard_normal((D, g * H, H))).astype(np.float32),
            "B": (0.1 * rng.standard_normal((D, 2 * g * H))).astype(np.float32)}


def _model(nodes, inputs, inits) -> onnx.ModelProto:
    inits = {**inits, "one": np.array([1], np.int64)}
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _head(y_rows: str, h_rows: str) -> list[onnx.NodeProto]:
    """y [N, 1] = the sum of each row's Y and Y_h (rows first)."""
    return [helper.make_node("Flatten", [y_rows], ["F"]), helper.make_node("Flatten", [h_rows], ["Fh"]),
            helper.make_node("Concat", ["F", "Fh"], ["C"], axis=1),
            helper.make_node("ReduceSum", ["C", "one"], ["y"], keepdims=1)]


def _extra(op: str) -> dict:
    return {"linear_before_reset": 1} if op == "GRU" else {}


def _batch_first(op: str, direction: str, layout: int) -> onnx.ModelProto:
    D = 2 if direction == "bidirectional" else 1
    if layout:  # X [N, T, I], Y [N, T, D, H], Y_h [N, D, H]
        nodes = [helper.make_node(op, ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=H, direction=direction,
                                  layout=1, name="rnn", **_extra(op))] + _head("Y", "Yh")
    else:  # the twin: layout 0 between transposes written by hand
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
                 helper.make_node(op, ["xt", "W", "R", "B"], ["Y", "Yh"], hidden_size=H, direction=direction,
                                  name="rnn", **_extra(op)),
                 helper.make_node("Transpose", ["Y"], ["Yn"], perm=[2, 0, 1, 3]),
                 helper.make_node("Transpose", ["Yh"], ["Yhn"], perm=[1, 0, 2])] + _head("Yn", "Yhn")
    return _model(nodes, [("x", TensorProto.FLOAT, ["N", T, I])], _weights(op, D))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_a_batch_first_node_trains_as_its_layout_0_twin(op, direction):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N, T, I)).astype(np.float32)
    target = rng.standard_normal((N, 1)).astype(np.float32)
    first, twin = (Trainer(_batch_first(op, direction, layout), learning_rate=0.01) for layout in (1, 0))
    np.testing.assert_allclose(first.predict(X), twin.predict(X), rtol=1e-6, atol=1e-6)
    for _ in range(3):
        assert first.step(X, target) == pytest.approx(twin.step(X, target), rel=1e-6)
    for name, value in twin.get_weights().items():
        np.testing.assert_allclose(first.get_weights()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    exported = first.to_onnx()  # runs on onnxruntime, which refuses layout 1 itself
    assert not any(a.name == "layout" and a.i == 1 for n in exported.graph.node for a in n.attribute)
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], first.predict(X), rtol=1e-6)


def test_onnxruntime_does_not_run_layout_1_itself():
    """What the rewrite is for (if a later onnxruntime runs it, the rewrite can go)."""
    with pytest.raises(Exception, match="layout == 1"):
        ort.InferenceSession(_batch_first("LSTM", "forward", 1).SerializeToString(),
                             providers=["CPUExecutionProvider"])


def _packed(op: str, direction: str, with_state: bool = True, y_c: bool = False) -> onnx.ModelProto:
    D = 2 if direction == "bidirectional" else 1
    inits = _weights(op, D, seed=2)
    rng = np.random.default_rng(3)
    states = []
    if with_state:
        inits["h0"] = (0.5 * rng.standard_normal((D, N, H))).astype(np.float32)
        states = ["h0"]
        if op == "LSTM":
            inits["c0"] = (0.5 * rng.standard_normal((D, N, H))).astype(np.float32)
            states.append("c0")
    outs = ["Y", "Yh"] + (["Yc"] if y_c else [])
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node(op, ["xt", "W", "R", "B", "lens"] + states, outs, hidden_size=H,
                              direction=direction, name="packed", **_extra(op)),
             helper.make_node("Transpose", ["Y"], ["Yn"], perm=[2, 0, 1, 3]),
             helper.make_node("Transpose", ["Yc" if y_c else "Yh"], ["Yhn"], perm=[1, 0, 2])] + _head("Yn", "Yhn")
    return _model(nodes, [("x", TensorProto.FLOAT, [N, T, I]), ("lens", TensorProto.INT32, [N])], inits)


LENS = np.array([5, 3, 1, 4], np.int32)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_packed_sequences_train_with_the_gradient_of_the_authors_node(op, direction):
    """The training copy's forward equals the author's node (onnxruntime's inference kernel honours
    sequence_lens); its gradient equals central differences of the author's graph, away from nothing (smooth)."""
    model = _packed(op, direction)
    rng = np.random.default_rng(4)
    X = {"x": rng.standard_normal((N, T, I)).astype(np.float32), "lens": LENS}
    trainer = Trainer(model, step="forward_backward")
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(trainer.forward(X), reference.run(None, X)[0], rtol=1e-5, atol=1e-5)
    grads = trainer.backward(np.ones((N, 1), np.float32))
    eps = 1e-2
    for name in ("W", "R"):
        value = trainer.get_weights()[name]
        numeric = np.zeros(value.shape, np.float64)
        for idx in np.ndindex(value.shape):
            for sign in (1, -1):
                w = value.copy()
                w[idx] += sign * eps
                trainer.set_weights({name: w})
                numeric[idx] += sign * float(trainer.predict(X).astype(np.float64).sum()) / (2 * eps)
            trainer.set_weights({name: value})
        np.testing.assert_allclose(grads[name], numeric, rtol=2e-2, atol=2e-3, err_msg=name)
    fused = Trainer(model, optimizer="adam", learning_rate=0.05)
    target = np.zeros((N, 1), np.float32)
    losses = [fused.step(X, target) for _ in range(15)]
    assert fused.fallback is None and losses[-1] < 0.5 * losses[0]


def test_packed_lstm_whose_cell_state_is_read_is_refused_naming_the_node():
    with pytest.raises(ModelError, match="LSTM node 'packed' \\(direction=bidirectional\\).*cell state Y_c"):
        Trainer(_packed("LSTM", "bidirectional", y_c=True))


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_forward_node_without_initial_states_trains(op):
    """X, W, R, B only (before: 'Type tensor(float) of input parameter (Y) of operator (LSTMGrad) ... is
    invalid' from onnxruntime-training's builder)."""
    model = _batch_first(op, "forward", 0)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((N, T, I)).astype(np.float32)
    trainer = Trainer(model, optimizer="adam", learning_rate=0.05)
    losses = [trainer.step(X, np.zeros((N, 1), np.float32)) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
