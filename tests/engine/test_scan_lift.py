"""What a chunk's Scan keeps in its loop (streamfit/_engine/steps/scan_lift.py): state-free nodes hoisted before
it, the loss sunk after it, the results those of the body run step by step."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamfit._engine.common.names import Names
from streamfit._engine.steps.scan import build_chunk_model
from streamfit._engine.steps.scan_lift import _EXACT

F = TensorProto.FLOAT


def _step_model():
    """w <- w - lr * x^T (x w - t) with x = (X - m) * 2 (per-step m of rank 1: broadcast against [1, 3]); the
    loss a mean of squares over a softmax of the output (a reduction and a softmax to move)."""
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Sub", ["X", "m"], ["c"]),
        helper.make_node("Mul", ["c", "two"], ["x"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Sub", ["y", "t"], ["e"]),
        helper.make_node("Gemm", ["x", "e", "w"], [Names.new("w")], transA=1, alpha=-0.01, beta=1.0),
        helper.make_node("Softmax", ["y"], ["p"], axis=-1),
        helper.make_node("Mul", ["p", "p"], ["p2"]),
        helper.make_node("ReduceMean", ["p2"], ["l1"], keepdims=0, axes=[1]),
        helper.make_node("ReduceSum", ["l1"], [Names.loss], keepdims=0),
    ]
    graph = helper.make_graph(nodes, "step", [vi("w", F, [3, 2]), vi("X", F, [1, 3]), vi("t", F, [1, 2]), vi("m", F, [3])],
                              [vi(Names.new("w"), F, [3, 2]), vi(Names.loss, F, []), vi("y", F, [1, 2])],
                              initializer=[helper.make_tensor("two", F, [], [2.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_hoisted_and_sunk_nodes_give_the_step_by_step_results() -> None:
    rng = np.random.default_rng(0)
    steps = 40
    X = rng.standard_normal((steps, 1, 3)).astype(np.float32)
    T = rng.standard_normal((steps, 1, 2)).astype(np.float32)
    M = rng.standard_normal((steps, 3)).astype(np.float32)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    step = _step_model()
    one = ort.InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
    w, ref_loss, ref_y = w0, [], []
    for k in range(steps):
        w_new, loss, y = one.run(None, {"w": w, "X": X[k], "t": T[k], "m": M[k]})
        ref_loss.append(loss)
        ref_y.append(y)
        w = w_new
    chunk = build_chunk_model(step, ["w"], ["X", "t"], ["m"], "y")
    ops = [n.op_type for n in chunk.graph.node]
    scan = chunk.graph.node[ops.index("Scan")]
    body = [n.op_type for n in next(a.g for a in scan.attribute if a.name == "body").node]
    # the centering before the loop, the loss after it; the scale by a constant stays with the MatMul it feeds
    # (onnxruntime folds it into the product, which it can only do in one graph: hoisted, the bits would differ)
    assert body == ["Mul", "MatMul", "Sub", "Gemm"]
    assert ops[:ops.index("Scan")] == ["Unsqueeze", "Sub"]
    assert {"Softmax", "ReduceMean", "ReduceSum"} <= set(ops[ops.index("Scan"):])
    sess = ort.InferenceSession(chunk.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, {"sfc_in_w": w0, "sfc_x_X": X, "sfc_x_t": T, "sfc_x_m": M})))
    np.testing.assert_array_equal(got["sfc_out_w"], w)  # what the weights see: the same bits
    np.testing.assert_array_equal(got["sfc_y"], np.stack(ref_y))
    np.testing.assert_allclose(got["sfc_losses"], np.array(ref_loss), rtol=1e-6)  # a reported value


def test_the_ops_hoisted_are_exact_on_any_tensor_size() -> None:
    """The premise of hoisting: onnxruntime's float arithmetic gives the same bits on a [4096, 1, 9] tensor as on
    each [1, 9] slice (true of the basic arithmetic, not of Sqrt, which is kept in the loop)."""
    rng = np.random.default_rng(1)
    A = (rng.standard_normal((4096, 1, 9)) * 100).astype(np.float32)
    B = rng.uniform(0.01, 100, (4096, 1, 9)).astype(np.float32)
    assert "Sqrt" not in _EXACT
    for op in ("Add", "Sub", "Mul", "Div"):
        assert op in _EXACT
        g = helper.make_graph([helper.make_node(op, ["a", "b"], ["c"])], "g",
                              [helper.make_tensor_value_info("a", F, None), helper.make_tensor_value_info("b", F, None)],
                              [helper.make_tensor_value_info("c", F, None)])
        s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                                 .SerializeToString(), providers=["CPUExecutionProvider"])
        big = s.run(None, {"a": A, "b": B})[0]
        small = np.stack([s.run(None, {"a": A[i], "b": B[i]})[0] for i in range(0, 4096, 37)])
        np.testing.assert_array_equal(big[::37], small, err_msg=op)


@pytest.mark.parametrize("const", [[1.0], [1.0, 2.0]], ids=["ones-padded", "values-repeated"])
def test_a_row_concatenated_with_a_constant_and_a_per_step_rate_run_before_the_loop(const: list[float]) -> None:
    """The lean linear step's shape (steps/scan_dense.py): ``[x, 1]`` (a Concat with a constant: one Pad outside
    when the constant is one repeated value, else the constant repeated over the steps and a Concat), a per-step
    rate as a [1, 1] tensor (an Unsqueeze, its axes shifted past the steps axis) and a constant divided by a
    per-step value (not a scale of it: hoisted), all before the loop, with the same bits."""
    width = len(const)
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Concat", ["X", "one"], ["xa"], axis=1),
        helper.make_node("MatMul", ["xa", "w"], ["y"]),
        helper.make_node("Sub", ["y", "t"], ["e"]),
        helper.make_node("Div", ["eps", "c"], ["eps_c"]),
        helper.make_node("Add", ["e", "eps_c"], ["e2"]),
        helper.make_node("Unsqueeze", ["lr", "axes"], ["lr2"]),
        helper.make_node("Gemm", ["xa", "e2", "w"], ["g"], transA=1, beta=0.0),
        helper.make_node("Gemm", ["g", "lr2", "w"], [Names.new("w")], alpha=-1.0, beta=1.0),
        helper.make_node("ReduceSum", ["e"], [Names.loss], keepdims=0),
    ]
    inits = [helper.make_tensor("one", F, [1, width], const), helper.make_tensor("eps", F, [], [1e-3]),
             helper.make_tensor("axes", TensorProto.INT64, [2], [0, 1])]
    graph = helper.make_graph(nodes, "step", [vi("w", F, [3 + width, 1]), vi("X", F, [1, 3]), vi("t", F, [1, 1]),
                                              vi("lr", F, []), vi("c", F, [])],
                              [vi(Names.new("w"), F, [3 + width, 1]), vi(Names.loss, F, []), vi("y", F, [1, 1])],
                              initializer=inits)
    step = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rng = np.random.default_rng(2)
    steps = 30
    X = rng.standard_normal((steps, 1, 3)).astype(np.float32)
    T = rng.standard_normal((steps, 1, 1)).astype(np.float32)
    lr = rng.uniform(0.01, 0.1, steps).astype(np.float32)
    c = rng.uniform(0.5, 2, steps).astype(np.float32)
    w0 = rng.standard_normal((3 + width, 1)).astype(np.float32)
    one = ort.InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
    w, ref_y = w0, []
    for k in range(steps):
        w, _, y = one.run(None, {"w": w, "X": X[k], "t": T[k], "lr": np.array(lr[k]), "c": np.array(c[k])})
        ref_y.append(y)
    chunk = build_chunk_model(step, ["w"], ["X", "t"], ["lr", "c"], "y")
    ops = [n.op_type for n in chunk.graph.node]
    scan = chunk.graph.node[ops.index("Scan")]
    body = [n.op_type for n in next(a.g for a in scan.attribute if a.name == "body").node]
    assert body == ["MatMul", "Sub", "Add", "Gemm", "Gemm"]
    before = set(ops[:ops.index("Scan")])
    if width == 1:
        assert {"Pad", "Unsqueeze", "Div"} <= before and not before & {"Concat", "Expand"}
    else:
        assert {"Concat", "Expand", "Unsqueeze", "Div"} <= before and "Pad" not in before
    sess = ort.InferenceSession(chunk.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, {"sfc_in_w": w0, "sfc_x_X": X, "sfc_x_t": T, "sfc_x_lr": lr, "sfc_x_c": c})))
    np.testing.assert_array_equal(got["sfc_out_w"], w)
    np.testing.assert_array_equal(got["sfc_y"], np.stack(ref_y))
