"""The rewrites that make a model's gradient buildable (streamfit._engine.prepare.trainable_ops): each computes what the
original op computes, and the rewritten models train in both step strategies."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import ModelProto, helper, numpy_helper

from streamfit._engine.prepare.model import prepare_model
from streamfit._engine.prepare.trainable_ops import make_trainable
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError


def _one_op(op: str, x_shape: list, y_shape: list, extra_inits=(), inputs=None, **attrs) -> ModelProto:
    node = helper.make_node(op, inputs or ["X"] + [i.name for i in extra_inits], ["Y"], **attrs)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("X", 1, x_shape)],
                              [helper.make_tensor_value_info("Y", 1, y_shape)], list(extra_inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _run(model: ModelProto, X: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["Y"], {"X": X})[0]


CASES = {
    "elu": (_one_op("Elu", [None, 7], [None, 7], alpha=0.7), (5, 7)),
    "selu": (_one_op("Selu", [None, 7], [None, 7]), (5, 7)),
    "celu": (_one_op("Celu", [None, 7], [None, 7], alpha=1.3), (5, 7)),
    "softplus": (_one_op("Softplus", [None, 7], [None, 7]), (5, 7)),
    "mish": (_one_op("Mish", [None, 7], [None, 7]), (5, 7)),
    "avgpool1d": (_one_op("AveragePool", [None, 3, 12], [None, 3, 6], kernel_shape=[2], strides=[2]), (4, 3, 12)),
    "avgpool2d_pad_exclude": (_one_op("AveragePool", [None, 2, 7, 7], [None, 2, 4, 4], kernel_shape=[3, 3],
                                      strides=[2, 2], pads=[1, 1, 1, 1]), (3, 2, 7, 7)),
    "avgpool2d_pad_include": (_one_op("AveragePool", [None, 2, 7, 7], [None, 2, 4, 4], kernel_shape=[3, 3],
                                      strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1), (3, 2, 7, 7)),
    "reducemax": (_one_op("ReduceMax", [None, 3, 5], [None, 3, 1],
                          [numpy_helper.from_array(np.array([-1], np.int64), "ax")], keepdims=1), (4, 3, 5)),
    "reducemin_two_axes": (_one_op("ReduceMin", [None, 3, 1, 5], [None, 3],
                                   [numpy_helper.from_array(np.array([2, 3], np.int64), "ax")], keepdims=0), (4, 3, 1, 5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewrite_computes_what_the_op_computes(case):
    model, shape = CASES[case]
    notes: list[str] = []
    rewritten = make_trainable(model, notes)
    assert notes and model.graph.node[0].op_type not in {n.op_type for n in rewritten.graph.node}
    X = (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)
    X.flat[0] = 40.0  # large values: softplus/mish must not overflow
    np.testing.assert_allclose(_run(rewritten, X), _run(model, X), rtol=1e-5, atol=1e-6)


def _with_weights(op_model: ModelProto, shape) -> ModelProto:
    """Y = op(X * S) @ W: a weight before the op (the gradient flows through it) and after."""
    graph = op_model.graph
    width = int(np.prod([d.dim_value for d in graph.output[0].type.tensor_type.shape.dim[1:]]))
    S = numpy_helper.from_array(np.full(shape[1:], 0.9, np.float32), "S")
    W = numpy_helper.from_array(np.linspace(-1, 1, width).reshape(width, 1).astype(np.float32), "W")
    graph.node[0].input[0] = "XS"
    nodes = [helper.make_node("Mul", ["X", "S"], ["XS"]), graph.node[0],
             helper.make_node("Flatten", ["Y"], ["F"]), helper.make_node("MatMul", ["F", "W"], ["Out"])]
    new = helper.make_graph(nodes, "t", list(graph.input), [helper.make_tensor_value_info("Out", 1, [None, 1])],
                            list(graph.initializer) + [S, W])
    return helper.make_model(new, opset_imports=list(op_model.opset_import), ir_version=8)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewritten_models_train_in_both_strategies(case):
    """AveragePool's own gradient kernel kills the process (SIGFPE): the rewritten Conv trains."""
    op_model, shape = CASES[case]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((7,) + shape[1:]).astype(np.float32)
    y = rng.standard_normal(7).astype(np.float32)
    results = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(_with_weights(op_model, shape), step=step, learning_rate=0.05)
        losses = [trainer.step(X, y) for _ in range(5)]
        assert losses[-1] < losses[0]
        results[step] = trainer.get_weights()
    for name, value in results["fused"].items():
        np.testing.assert_allclose(value, results["forward_backward"][name], rtol=1e-4, atol=1e-6)


def _layernorm_model() -> ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 8)).astype(np.float32) * 0.4, "W"),
             numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
             numpy_helper.from_array(rng.standard_normal((8, 1)).astype(np.float32) * 0.4, "V")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"]),
             helper.make_node("LayerNormalization", ["H", "gamma", "beta"], ["L"], axis=-1, epsilon=1e-5),
             helper.make_node("Tanh", ["L"], ["A"]), helper.make_node("MatMul", ["A", "V"], ["Y"])]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("X", 1, [None, 6])],
                              [helper.make_tensor_value_info("Y", 1, [None, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_layernorm_trains_and_both_strategies_agree():
    """Without its optional outputs, LayerNormalization's gradient build asserts (gradient_builder_base.h)."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((32, 6)).astype(np.float32)
    y = X[:, :1].ravel().astype(np.float32)
    out = {}
    for step in ("fused", "forward_backward"):
        trainer = Trainer(_layernorm_model(), step=step, learning_rate=0.1)
        losses = [trainer.step(X, y) for _ in range(30)]
        assert losses[-1] < 0.5 * losses[0]
        out[step] = trainer.predict(X)
        assert "gamma" in trainer.weight_names and "beta" in trainer.weight_names
    np.testing.assert_allclose(out["fused"], out["forward_backward"], rtol=1e-4, atol=1e-5)
    # the exported model keeps the author's LayerNormalization (one output)
    exported = Trainer(_layernorm_model()).to_onnx()
    assert [len(n.output) for n in exported.graph.node if n.op_type == "LayerNormalization"] == [1]


def test_initializers_that_cannot_reach_the_output_are_not_weights():
    """A threshold feeding a comparison, and the weights of another output's head, stay frozen."""
    inits = [numpy_helper.from_array(np.array(20.0, np.float32), "threshold"),
             numpy_helper.from_array(np.ones((3, 1), np.float32), "W"),
             numpy_helper.from_array(np.ones((3, 2), np.float32), "W_other")]
    nodes = [helper.make_node("Greater", ["X", "threshold"], ["big"]),
             helper.make_node("Where", ["big", "X", "X"], ["Xw"]),
             helper.make_node("MatMul", ["Xw", "W"], ["Y"]), helper.make_node("MatMul", ["X", "W_other"], ["Z"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("X", 1, [None, 3])],
                              [helper.make_tensor_value_info("Y", 1, [None, 1]),
                               helper.make_tensor_value_info("Z", 1, [None, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert prepare_model(model).weights == ["W"]
    assert prepare_model(model, output_name="Z").weights == ["W_other"]
    with pytest.raises(ModelError, match="do not affect output 'Y'"):
        prepare_model(model, weights=["W", "W_other"])
    trainer = Trainer(model)
    trainer.step(np.ones((2, 3), np.float32), np.zeros(2, np.float32))
    exported = {i.name: numpy_helper.to_array(i) for i in trainer.to_onnx().graph.initializer}
    assert (exported["threshold"] == 20.0) and (exported["W_other"] == 1.0).all()  # frozen, as given


def test_average_pool_with_ceil_mode_is_refused_clearly():
    model = _with_weights(_one_op("AveragePool", [None, 2, 7], [None, 2, 4], kernel_shape=[2], strides=[2],
                                  ceil_mode=1), (1, 2, 7))
    with pytest.raises(ModelError, match="SIGFPE.*ceil_mode=1"):
        prepare_model(model)
