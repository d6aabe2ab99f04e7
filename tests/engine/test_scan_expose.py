"""A Scan body's intermediates as loop states (streamfit._engine.steps.scan_expose): the same values, a body with no
value left to allocate per iteration, and only bodies whose values are all known and small."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamfit import LinearRegressor, LogisticRegression
from streamfit._engine.steps.scan import ChunkSteps
from streamfit._engine.steps.scan_expose import MAX_ELEMENTS, expose_body_values


def _scan_model(width: int, chain: int = 3) -> onnx.ModelProto:
    """A Scan adding each row to its state through ``chain`` nodes (``chain - 1`` intermediates)."""
    nodes, prev = [], "s_in"
    for i in range(chain):
        out = "s_out" if i == chain - 1 else f"t{i}"
        nodes.append(helper.make_node("Mul" if i % 2 else "Add", [prev, "x"], [out]))
        prev = out
    nodes.append(helper.make_node("Identity", ["s_out"], ["y"]))
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, width]) for n in ("s_in", "x", "s_out", "y")]
    body = helper.make_graph(nodes, "body", vi[:2], vi[2:])
    scan = helper.make_node("Scan", ["s0", "X"], ["sN", "Y"], num_scan_inputs=1, body=body)
    graph = helper.make_graph([scan], "g", [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [1, width]),
                                            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["S", 1, width])],
                              [helper.make_tensor_value_info("sN", TensorProto.FLOAT, [1, width]),
                               helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["S", 1, width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _body(model: onnx.ModelProto) -> onnx.GraphProto:
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    return next(a.g for a in scan.attribute if a.name == "body")


def _intermediates(model: onnx.ModelProto) -> list[str]:
    body = _body(model)
    outputs = {o.name for o in body.output}
    return [v for n in body.node for v in n.output if v not in outputs]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["sN", "Y"], feeds)


def test_an_exposed_body_computes_the_same_values_and_keeps_no_intermediate() -> None:
    model = _scan_model(4)
    exposed, count = expose_body_values(model)
    assert count == 2 and _intermediates(model) == ["t0", "t1"] and _intermediates(exposed) == []
    assert len(exposed.graph.node[0].output) == 4  # the two values, unused outside
    onnx.checker.check_model(exposed, full_check=True)
    rng = np.random.default_rng(0)
    feeds = {"s0": rng.standard_normal((1, 4)).astype(np.float32),
             "X": rng.uniform(0.5, 1.5, (50, 1, 4)).astype(np.float32)}
    for a, b in zip(_run(model, feeds), _run(exposed, feeds)):
        np.testing.assert_array_equal(a, b)


def test_a_body_with_a_large_or_unknown_value_is_left_as_it_is() -> None:
    large = _scan_model(MAX_ELEMENTS + 1)
    assert expose_body_values(large) == (large, 0)
    assert expose_body_values(_scan_model(65), max_elements=64)[1] == 0
    assert expose_body_values(_scan_model(65), max_elements=65)[1] == 2
    unknown = _scan_model(4)
    for vi in list(unknown.graph.input):  # no shapes: nothing inferred inside the body
        vi.type.tensor_type.ClearField("shape")
    for vi in list(_body(unknown).input) + list(_body(unknown).output):
        vi.type.tensor_type.ClearField("shape")
    assert expose_body_values(unknown)[1] == 0
    assert expose_body_values(_scan_model(4, chain=1))[1] == 0  # nothing to expose


@pytest.mark.parametrize("make", [
    lambda: LogisticRegression(batch_size=1, optimizer="sgd", learning_rate="constant", eta0=0.05, penalty=None),
    lambda: LogisticRegression(batch_size=1),
    lambda: LinearRegressor(batch_size=1),
], ids=["logistic-sgd", "logistic-adam", "linear-adam"])
def test_the_one_row_chunks_of_a_linear_model_run_exposed_and_give_the_same_results(make) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 5)).astype(np.float32)
    y = X[:, 0] - X[:, 1] + 0.1 * rng.standard_normal(300)
    logistic = isinstance(make(), LogisticRegression)
    t = (y > 0) if logistic else y
    kw = {"classes": [False, True]} if logistic else {}
    results = []
    for expose in (True, False):
        est = make()
        est.partial_fit(X[:2], t[:2], **kw)
        chunks = ChunkSteps(est.trainer_)
        chunks.expose = expose
        est.trainer_.__dict__["_chunk_steps"] = chunks
        out = est.partial_fit_predict(X[2:], t[2:])
        (model,) = chunks.models.values()
        assert (_intermediates(model) == []) is expose
        results.append((out, est.trainer_.get_weights()))
    (out_a, w_a), (out_b, w_b) = results
    np.testing.assert_allclose(out_a, out_b, rtol=1e-6, atol=1e-6)  # onnxruntime may fuse differently
    for name in w_a:
        np.testing.assert_allclose(w_a[name], w_b[name], rtol=1e-6, atol=1e-6)
