"""What trains with which gradient builder and in which step strategy (issue 21, item 7): every export of the
second zoo trains in both strategies with onnxruntime-training's builder, to the same losses; streamfit's own
builder (the path of an onnxruntime without training, Python 3.13+) refuses each with a ModelError naming the
nodes it cannot differentiate (before: op types only, and a rule's error named an unnamed node ''); `streamfit
check` says which builder a model needs; a fused step that fails where forward/backward trains is a preflight
warning, not a refusal (before: refused)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.gradient.autodiff import unsupported_nodes
from streamfit._engine.prepare.model import prepare_model
from streamfit._engine.testing import mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError
from tests.zoo2.test_zoo2 import FAST, HERE, MODELS, _ref, _trainer, _x

#: the ops streamfit's own builder cannot differentiate, per export (measured: every export needs
#: onnxruntime-training's builder; docs/concepts/model-coverage.md has the table)
OWN_BUILDER_MISSING = {
    "bert": ["Erf", "LayerNormalization", "Softmax"], "distilbert": ["Erf", "LayerNormalization", "Softmax"],
    "gpt2": ["LayerNormalization", "Pow", "Softmax", "Split"],
    "bigru": ["GRU", "Split"], "bilstm": ["LSTM", "Split"],
    "convnext.dynamo": ["Conv", "Erf", "LayerNormalization", "ReduceMean"],
    "convnext": ["Conv", "Erf", "GlobalAveragePool", "LayerNormalization"],
    "efficientnet.dynamo": ["Conv", "ReduceMean"], "efficientnet": ["Conv", "GlobalAveragePool"],
    "efficientnet.legacy_train": ["Conv", "Dropout", "GlobalAveragePool", "ReduceMean", "Sqrt"],
    "mobilenet_v3.dynamo": ["Clip", "Conv", "ReduceMean"], "mobilenet_v3": ["Clip", "Conv", "GlobalAveragePool"],
    "mobilenet_v3.legacy_train": ["Clip", "Conv", "Dropout", "GlobalAveragePool", "ReduceMean", "Sqrt"],
    "resnet.dynamo": ["Conv", "ReduceMean"], "resnet": ["Conv", "GlobalAveragePool"],
    "resnet.legacy_train": ["Conv", "GlobalAveragePool", "ReduceMean", "Sqrt"],
    "tcn": ["Conv", "Pad"], "tcn.dynamo": ["Conv"],
}


def _missing(model: str) -> list[str]:
    return OWN_BUILDER_MISSING.get(model) or OWN_BUILDER_MISSING[model.split(".")[0]]


def _own_builder_refuses(model: str) -> None:
    bad = unsupported_nodes(prepare_model(HERE / f"{model}.onnx"))
    assert sorted(bad) == _missing(model)
    with pytest.raises(ModelError) as err:
        _trainer(model, gradient="streamfit").step(_x(model.split(".")[0], "train0_"),
                                                   _ref(model.split(".")[0])["train0_y"])
    text = str(err.value)
    assert text.startswith("streamfit's own gradient builder cannot differentiate "), text
    for op, nodes in bad.items():
        assert f"{op} (node{'s' if len(nodes) > 1 else ''} {nodes[0]!r}" in text, (op, text)


@pytest.mark.parametrize("model", ["bert.dynamo", "mobilenet_v3.legacy"])
def test_the_own_builder_refuses_naming_the_nodes(model):
    _own_builder_refuses(model)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_the_own_builder_refuses_naming_the_nodes_full(model):
    _own_builder_refuses(model)


def _strategies_agree(model: str) -> None:
    arch = model.split(".")[0]
    ref = _ref(arch)
    losses = {}
    for step in ("fused", "forward_backward"):
        trainer = _trainer(model, step=step)
        losses[step] = [trainer.step(_x(arch, f"train{k}_"), ref[f"train{k}_y"]) for k in range(3)]
        assert trainer.fallback is None and trainer.step_kind == step
    np.testing.assert_allclose(losses["fused"], losses["forward_backward"], rtol=1e-5)


@pytest.mark.parametrize("model", [FAST[0]])
def test_both_strategies_train_the_zoo_to_the_same_losses(model):
    _strategies_agree(model)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_both_strategies_train_the_zoo_to_the_same_losses_full(model):
    _strategies_agree(model)


def test_a_rules_refusal_names_an_unnamed_node():
    """A 1-D weight of a MatMul (outside the own builder's rules) in a node without a name."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ModelError, match="2-D MatMul only; node 'y' multiplies"):
        Trainer(model, gradient="streamfit").step(np.ones((3, 4), np.float32), np.zeros(3, np.float32))


def test_check_says_which_builder_a_model_needs(tmp_path):
    from streamfit.cli import _weight_report

    lines = _weight_report(str(HERE / "bert.dynamo.onnx"))
    assert re.match(r"gradient: onnxruntime-training's builder only; streamfit's own cannot differentiate "
                    r"Erf \(nodes '[^']+', '[^']+'\), LayerNormalization \(nodes ", lines[0]), lines[0]
    onnx.save(mlp_model([3, 4, 1], activation="Tanh", gemm=True), tmp_path / "mlp.onnx")
    lines = _weight_report(str(tmp_path / "mlp.onnx"))
    assert lines[0].startswith("gradient: streamfit's own builder differentiates this model too"), lines[0]
    # and it does: the same step as onnxruntime-training's builder
    X = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    y = np.zeros((8, 1), np.float32)
    a, b = (Trainer(tmp_path / "mlp.onnx", gradient=g, learning_rate=0.1) for g in ("streamfit", "onnxruntime"))
    assert a.step(X, y) == pytest.approx(b.step(X, y), rel=1e-6)
    for name, value in a.get_weights().items():
        np.testing.assert_allclose(value, b.get_weights()[name], rtol=1e-5, atol=1e-7)


def test_a_fused_step_failing_where_forward_backward_trains_is_said_not_refused(monkeypatch, capsys, tmp_path):
    """The preflight's child, in this process, with the fused large-batch graph broken as in
    tests/engine/test_large_batch.py (a fault no real model here produces: every zoo export trains fused)."""
    import streamfit._engine.steps.fused as fused
    from streamfit._preflight import FALLBACK_NOTE, _lines, _result, _run_child

    real = fused.build_fused

    def broken(*args, large_batch=False, **kwargs):
        model = real(*args, large_batch=large_batch, **kwargs)
        if large_batch:
            node = next(n for n in model.graph.node if n.op_type == "Gemm")
            node.input[0] = node.input[1]
        return model

    monkeypatch.setattr(fused, "build_fused", broken)
    onnx.save(mlp_model([12, 48, 40, 3], "Relu", seed=4), tmp_path / "mlp.onnx")
    _run_child({"model": str(tmp_path / "mlp.onnx"), "loss": "squared_error", "optimizer": "sgd"})
    result = _result("0" * 64, 0, _lines(capsys.readouterr().out), "")
    assert result.ok, result.message()
    assert [n for n in result.notes if n.startswith("WARNING: fused, 64 rows") and FALLBACK_NOTE in n], result.notes
    assert "preflight passed (the forward/backward step: the fused step fails on this model" in result.message()
