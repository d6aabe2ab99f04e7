"""Each rewrite of :mod:`streamfit._engine.gradient.portable` against onnxruntime-training's own kernel, one node at a time.

A one-node graph holding the training kernel runs on onnxruntime-training 1.19.2; its portable twin (no
training-only op left) must give the same outputs up to float rounding, on awkward cases: broadcasting,
duplicate and negative ids, strides that leave inputs uncovered, overlapping pooling windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.gradient.portable import CANNOT, REWRITTEN, make_portable, portability_report

pytestmark = pytest.mark.needs_ort_training  # records/compares against onnxruntime-training 1.19.2

MS = "com.microsoft"
F = TensorProto.FLOAT
rng = np.random.default_rng(0)


def _model(nodes: list[Any], feeds: dict[str, np.ndarray], outputs: list[str], inits: dict[str, np.ndarray] = {},
           shapes: dict[str, tuple[int, ...]] = {}, opset: int = 17) -> Any:
    elem = {np.dtype(np.float32): F, np.dtype(np.int64): TensorProto.INT64, np.dtype(bool): TensorProto.BOOL,
            np.dtype(np.int32): TensorProto.INT32, np.dtype(np.float64): TensorProto.DOUBLE}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, elem[v.dtype], list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, F, shapes.get(o)) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def _run(model: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _same(model: Any, feeds: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> Any:
    portable = make_portable(model)
    report = portability_report(portable)
    assert report.portable, str(report)
    assert not portability_report(model).portable  # the case does hold a training kernel
    for i, (want, got) in enumerate(zip(_run(model, feeds), _run(portable, feeds))):
        assert want.shape == got.shape, (i, want.shape, got.shape)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return portable


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


CASES: dict[str, Any] = {}


def case(op: str):  # type: ignore[no-untyped-def]
    def register(fn):  # type: ignore[no-untyped-def]
        CASES.setdefault(op, []).append(fn)
        return fn
    return register


@case("ReluGrad")
def relu_grad():  # type: ignore[no-untyped-def]
    y = np.maximum(f32(8, 5), 0)
    return [helper.make_node("ReluGrad", ["dy", "y"], ["dx"], domain=MS)], {"dy": f32(8, 5), "y": y}, ["dx"]


@case("TanhGrad")
def tanh_grad():  # type: ignore[no-untyped-def]
    return [helper.make_node("TanhGrad", ["dy", "y"], ["dx"], domain=MS)], {"dy": f32(4, 3), "y": np.tanh(f32(4, 3))}, ["dx"]


@case("SigmoidGrad")
def sigmoid_grad():  # type: ignore[no-untyped-def]
    y = 1 / (1 + np.exp(-f32(4, 3)))
    return [helper.make_node("SigmoidGrad", ["dy", "y"], ["dx"], domain=MS)], {"dy": f32(4, 3), "y": y}, ["dx"]


@case("LeakyReluGrad")
def leaky_relu_grad():  # type: ignore[no-untyped-def]
    x = f32(6, 4)
    y = np.where(x > 0, x, 0.1 * x).astype(np.float32)
    return ([helper.make_node("LeakyReluGrad", ["dy", "y"], ["dx"], domain=MS, alpha=0.1)], {"dy": f32(6, 4), "y": y},
            ["dx"])


@case("GeluGrad")
def gelu_grad():  # type: ignore[no-untyped-def]
    return [helper.make_node("GeluGrad", ["dy", "x"], ["dx"], domain=MS)], {"dy": f32(5, 7), "x": 3 * f32(5, 7)}, ["dx"]


@case("FastGeluGrad")
def fast_gelu_grad():  # type: ignore[no-untyped-def]
    return [helper.make_node("FastGeluGrad", ["dy", "x"], ["dx"], domain=MS)], {"dy": f32(5, 7), "x": 3 * f32(5, 7)}, ["dx"]


@case("BiasGeluGrad_dX")
def bias_gelu_grad():  # type: ignore[no-untyped-def]
    return ([helper.make_node("BiasGeluGrad_dX", ["dy", "x", "b"], ["dx"], domain=MS)],
            {"dy": f32(5, 7), "x": f32(5, 7), "b": f32(7)}, ["dx"])


@case("BiasFastGeluGrad_dX")
def bias_fast_gelu_grad():  # type: ignore[no-untyped-def]
    return ([helper.make_node("BiasFastGeluGrad_dX", ["dy", "x", "b"], ["dx"], domain=MS)],
            {"dy": f32(5, 7), "x": f32(5, 7), "b": f32(7)}, ["dx"])


@case("QuickGeluGrad")
def quick_gelu_grad():  # type: ignore[no-untyped-def]
    return ([helper.make_node("QuickGeluGrad", ["dy", "x"], ["dx"], domain=MS, alpha=1.702)],
            {"dy": f32(5, 7), "x": 3 * f32(5, 7)}, ["dx"])


@case("SoftmaxGrad_13")
def softmax_grad_13():  # type: ignore[no-untyped-def]
    z = f32(2, 3, 5)
    y = (np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)).astype(np.float32)
    return [helper.make_node("SoftmaxGrad_13", ["dy", "y"], ["dx"], domain=MS, axis=1)], {"dy": f32(2, 3, 5), "y": y}, ["dx"]


@case("SoftmaxGrad")
def softmax_grad_coerced():  # type: ignore[no-untyped-def]
    z = f32(2, 3, 5).reshape(2, 15)
    y = (np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)).astype(np.float32).reshape(2, 3, 5)
    return [helper.make_node("SoftmaxGrad", ["dy", "y"], ["dx"], domain=MS, axis=1)], {"dy": f32(2, 3, 5), "y": y}, ["dx"]


@case("LogSoftmaxGrad_13")
def log_softmax_grad():  # type: ignore[no-untyped-def]
    z = f32(4, 6)
    y = (z - np.log(np.exp(z).sum(axis=-1, keepdims=True))).astype(np.float32)
    return [helper.make_node("LogSoftmaxGrad_13", ["dy", "y"], ["dx"], domain=MS, axis=-1)], {"dy": f32(4, 6), "y": y}, ["dx"]


@case("LogSoftmaxGrad")
def log_softmax_grad_coerced():  # type: ignore[no-untyped-def]
    z = f32(2, 3, 4).reshape(2, 12)
    y = (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(np.float32).reshape(2, 3, 4)
    return [helper.make_node("LogSoftmaxGrad", ["dy", "y"], ["dx"], domain=MS, axis=1)], {"dy": f32(2, 3, 4), "y": y}, ["dx"]


@case("SplitTraining")
def split_training():  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("SplitTraining", ["x", "sizes"], ["a", "b"], domain=MS, axis=1)]
    return nodes, {"x": f32(3, 7)}, ["a", "b"], {"sizes": np.array([2, 5], np.int64)}


@case("DivGrad")
def div_grad_broadcast():  # type: ignore[no-untyped-def]
    b = np.abs(f32(1, 3, 1)) + 0.5
    return ([helper.make_node("DivGrad", ["dy", "a", "b"], ["da", "db"], domain=MS)],
            {"dy": f32(2, 3, 4), "a": f32(2, 3, 4), "b": b}, ["da", "db"])


@case("DivGrad")
def div_grad_rank():  # type: ignore[no-untyped-def]
    b = np.abs(f32(4)) + 0.5
    return ([helper.make_node("DivGrad", ["dy", "a", "b"], ["da", "db"], domain=MS)],
            {"dy": f32(2, 3, 4), "a": f32(2, 3, 4), "b": b}, ["da", "db"])


@case("BroadcastGradientArgs")
def broadcast_gradient_args():  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("Shape", ["a"], ["sa"]), helper.make_node("Shape", ["b"], ["sb"]),
             helper.make_node("BroadcastGradientArgs", ["sa", "sb"], ["ra", "rb"], domain=MS),
             helper.make_node("ReduceSum", ["dy", "ra"], ["ga0"], keepdims=1, noop_with_empty_axes=1),
             helper.make_node("Reshape", ["ga0", "sa"], ["ga"]),
             helper.make_node("ReduceSum", ["dy", "rb"], ["gb0"], keepdims=1, noop_with_empty_axes=1),
             helper.make_node("Reshape", ["gb0", "sb"], ["gb"])]
    return nodes, {"a": f32(3, 1, 5), "b": f32(4, 1), "dy": f32(3, 4, 5)}, ["ga", "gb"]


@case("Scale")
def scale():  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("Scale", ["x", "s"], ["y"], domain=MS, scale_down=1),
             helper.make_node("Scale", ["x", "s"], ["z"], domain=MS, scale_down=0)]
    return nodes, {"x": f32(3, 4), "s": np.array(4.0, np.float32)}, ["y", "z"]


@case("ConcatTraining")
def concat_training():  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("ConcatTraining", ["a", "b"], ["c", "lengths"], domain=MS, axis=1),
             helper.make_node("Cast", ["lengths"], ["lf"], to=F)]
    return nodes, {"a": f32(2, 3), "b": f32(2, 5)}, ["c", "lf"]


@case("GatherGrad")
def gather_grad():  # type: ignore[no-untyped-def]
    ids = np.array([[0, 2, -1], [2, 2, 1]], np.int64)  # duplicates and a negative id
    nodes = [helper.make_node("GatherGrad", ["shape", "ids", "dy"], ["dt"], domain=MS, axis=0)]
    return nodes, {"ids": ids, "dy": f32(2, 3, 4)}, ["dt"], {"shape": np.array([5, 4], np.int64)}


@case("GatherGrad")
def gather_grad_scalar_id():  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("GatherGrad", ["shape", "ids", "dy"], ["dt"], domain=MS, axis=0)]
    return nodes, {"ids": np.array(-2, np.int64), "dy": f32(4, 2)}, ["dt"], {"shape": np.array([3, 4, 2], np.int64)}


@case("GatherElementsGrad")
def gather_elements_grad():  # type: ignore[no-untyped-def]
    ids = np.array([[0, 2, -1, 0], [1, 1, 1, 2]], np.int64)
    nodes = [helper.make_node("GatherElementsGrad", ["dy", "shape", "ids"], ["dx"], domain=MS, axis=1)]
    return nodes, {"dy": f32(2, 4), "ids": ids}, ["dx"], {"shape": np.array([2, 3], np.int64)}


@case("SliceGrad")
def slice_grad():  # type: ignore[no-untyped-def]
    x = f32(6, 7)
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"]), helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("SliceGrad", ["dy", "shape", "st", "en", "ax", "sp"], ["dx"], domain=MS)]
    inits = {"st": np.array([1, -6], np.int64), "en": np.array([5, 7], np.int64), "ax": np.array([0, 1], np.int64),
             "sp": np.array([2, 3], np.int64)}
    return nodes, {"x": x, "dy": f32(2, 2)}, ["dx"], inits


def _pool_case(kernel: list[int], strides: list[int], shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": [0] * (2 * len(kernel))}
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "idx"], **attrs),
             helper.make_node("Identity", ["y"], ["yy"]),
             helper.make_node("MaxPoolGrad", ["dy", "idx"], ["dx"], **attrs)]
    x = f32(*shape)
    out = [(s - k) // st + 1 for s, k, st in zip(shape[2:], kernel, strides)]
    # ORT's MaxPoolGrad kernel takes dX's shape from the graph (a static output shape), else it crashes
    return nodes, {"x": x, "dy": f32(*shape[:2], *out)}, ["dx", "yy"], {}, {"dx": shape}


@case("MaxPoolGrad")
def max_pool_grad_2d():  # type: ignore[no-untyped-def]
    return _pool_case([2, 2], [2, 2], (2, 3, 5, 6))


@case("MaxPoolGrad")
def max_pool_grad_overlapping():  # type: ignore[no-untyped-def]
    return _pool_case([3], [1], (2, 2, 9))


@case("DropoutGrad")
def dropout_grad():  # type: ignore[no-untyped-def]
    mask = rng.random((4, 6)) > 0.3
    nodes = [helper.make_node("DropoutGrad", ["dy", "mask", "ratio", "training"], ["dx"], domain=MS)]
    return nodes, {"dy": f32(4, 6), "mask": mask, "training": np.array(True)}, ["dx"], {"ratio": np.array(0.3, np.float32)}


@case("DropoutGrad")
def dropout_grad_eval():  # type: ignore[no-untyped-def]
    mask = rng.random((4, 6)) > 0.3
    nodes = [helper.make_node("DropoutGrad", ["dy", "mask", "ratio", "training"], ["dx"], domain=MS)]
    return nodes, {"dy": f32(4, 6), "mask": mask, "training": np.array(False)}, ["dx"], {"ratio": np.array(0.3, np.float32)}


def _layer_norm(axis: int, shape: tuple[int, ...]):  # type: ignore[no-untyped-def]
    norm = shape[axis:]
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y", "mean", "inv"], axis=axis,
                              epsilon=1e-5),
             helper.make_node("LayerNormalizationGrad", ["dy", "x", "scale", "mean", "inv"], ["dx", "dscale", "dbias"],
                              domain=MS, axis=axis, epsilon=1e-5)]
    return nodes, {"x": f32(*shape), "dy": f32(*shape)}, ["dx", "dscale", "dbias"], {"scale": f32(*norm), "bias": f32(*norm)}


@case("LayerNormalizationGrad")
def layer_norm_last():  # type: ignore[no-untyped-def]
    return _layer_norm(-1, (3, 4, 8))


@case("LayerNormalizationGrad")
def layer_norm_two_axes():  # type: ignore[no-untyped-def]
    return _layer_norm(1, (5, 3, 4))


def _conv(shape: tuple[int, ...], w_shape: tuple[int, ...], outputs: tuple[bool, bool, bool], **attrs: Any):  # type: ignore[no-untyped-def]
    k = len(w_shape) - 2
    attrs.setdefault("kernel_shape", list(w_shape[2:]))
    attrs.setdefault("pads", [0] * (2 * k))
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)]
    probe = _run(_model(nodes, {"x": f32(*shape)}, ["y"], {"w": f32(*w_shape)}), {"x": f32(*shape)})[0]
    names = [n if want else "" for n, want in zip(("dx", "dw", "db"), outputs)]
    nodes.append(helper.make_node("ConvGrad", ["dy", "x", "w"], names, domain=MS, **attrs))
    return nodes, {"x": f32(*shape), "dy": f32(*probe.shape)}, [n for n in names if n], {"w": f32(*w_shape)}


@case("ConvGrad")
def conv_grad_2d_padded():  # type: ignore[no-untyped-def]
    return _conv((2, 3, 7, 6), (4, 3, 3, 3), (True, True, True), pads=[1, 1, 1, 1], strides=[1, 1])


@case("ConvGrad")
def conv_grad_strided_odd():  # type: ignore[no-untyped-def]
    return _conv((2, 2, 11), (3, 2, 3), (True, True, True), strides=[2], dilations=[2], pads=[1, 0])


@case("ConvGrad")
def conv_grad_depthwise_input_only():  # type: ignore[no-untyped-def]
    return _conv((2, 4, 5, 5), (4, 1, 2, 2), (True, False, False), strides=[2, 2], group=4)


@pytest.mark.parametrize("fn", [fn for fns in CASES.values() for fn in fns], ids=lambda fn: fn.__name__)
def test_rewrite_equals_the_training_kernel(fn):
    nodes, feeds, outputs, *inits = fn()
    model = _model(nodes, feeds, outputs, *inits)
    portable = _same(model, feeds, rtol=2e-5, atol=2e-6)
    assert make_portable(portable).SerializeToString() == portable.SerializeToString()  # nothing left to do


def test_every_rewritten_op_has_a_case():
    assert set(REWRITTEN) <= set(CASES), sorted(set(REWRITTEN) - set(CASES))


def test_what_cannot_be_rewritten_is_reported():
    nodes = [helper.make_node("ConvGrad", ["dy", "x", "w"], ["", "dw"], domain=MS, kernel_shape=[2, 2], group=2)]
    model = _model(nodes, {"dy": f32(1, 2, 2, 2), "x": f32(1, 2, 3, 3)}, ["dw"], {"w": f32(2, 1, 2, 2)})
    report = portability_report(make_portable(model))
    assert report.training_only == ("com.microsoft:ConvGrad",)
    assert "grouped" in str(report) and "needs onnxruntime-training" in str(report)
    assert set(CANNOT) >= {"YieldOp", "LSTMGrad", "GRUGrad"}
