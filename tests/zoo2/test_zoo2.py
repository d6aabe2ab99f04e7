"""The second zoo: torchvision and Hugging Face architectures (tests/zoo2/make_zoo2.py made them), each exported
both ways, trained next to a PyTorch twin.

What each export does (``EXPECT``): ``"twin"`` trains and matches the twin (3 SGD steps on the same weights and
batches: the eval output after them); ``"untied"`` matches the twin whose tied embedding was untied, as the
exporters do; ``"bn_folded"``: the exporter folded BatchNorm into the convolutions (an eval-mode export), so the
model trains as plain convolutions and no twin follows it exactly; ``"random"``: a training-mode export whose
Dropout / stochastic depth is active (seeded) in training, so no twin draws the same masks.  Every export:
predict before training equals PyTorch's eval output, predicting the same rows twice gives the same output,
training updates every trained weight and makes the loss fall, ``to_onnx()`` equals ``predict``.

The default suite runs a slice (the issue's must-shows); ``-m slow`` runs every export.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from streamfit._engine.trainer import Trainer

HERE = Path(__file__).resolve().parent
MODELS = sorted(p.name[: -len(".onnx")] for p in HERE.glob("*.onnx"))  # "<arch>.<exporter>"
ARCHS = sorted({m.split(".")[0] for m in MODELS})

EXPECT: dict[str, str] = {
    **{f"{a}.{e}": "twin" for a in ("bert", "distilbert", "bilstm", "bigru") for e in ("legacy", "dynamo")},
    "gpt2.legacy": "untied", "gpt2.dynamo": "untied",
    "convnext.legacy": "twin", "convnext.dynamo": "twin", "convnext.legacy_train": "random",
    "resnet.legacy": "bn_folded", "resnet.dynamo": "bn_folded", "resnet.legacy_train": "twin",
    "mobilenet_v3.legacy": "bn_folded", "mobilenet_v3.dynamo": "bn_folded", "mobilenet_v3.legacy_train": "random",
    "efficientnet.legacy": "bn_folded", "efficientnet.dynamo": "bn_folded", "efficientnet.legacy_train": "random",
    "tcn.legacy": "twin", "tcn.dynamo": "twin",
}
#: the default suite's slice: one of each thing the issue must show
FAST = ("bert.dynamo", "bilstm.legacy", "gpt2.dynamo", "efficientnet.legacy_train", "mobilenet_v3.legacy",
        "tcn.dynamo")


@lru_cache(maxsize=None)
def _ref(arch: str) -> dict[str, Any]:
    with np.load(HERE / f"{arch}.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["meta"] = json.loads(str(arrays["meta"]))
    return arrays


def _x(arch: str, prefix: str) -> Any:
    ref = _ref(arch)
    names = ref["meta"]["inputs"]
    return ref[prefix + names[0]] if len(names) == 1 else {n: ref[prefix + n] for n in names}


def _trainer(model: str, **kwargs: Any) -> Trainer:
    ref = _ref(model.split(".")[0])
    loss = "softmax_cross_entropy" if ref["meta"]["task"] == "classification" else "squared_error"
    kwargs.setdefault("learning_rate", ref["meta"]["lr"])
    return Trainer(HERE / f"{model}.onnx", loss=loss, **kwargs)


def test_the_second_zoo_has_every_architecture_both_ways():
    assert set(MODELS) == set(EXPECT), set(MODELS) ^ set(EXPECT)
    assert len(ARCHS) == 10
    for arch in ARCHS:
        assert {f"{arch}.legacy", f"{arch}.dynamo"} <= set(MODELS), arch
    sizes = [p.stat().st_size for p in HERE.glob("*.onnx")]
    assert max(sizes) < 1 << 20 and sum(sizes) < 4 << 20


def _matches_twin(model: str) -> None:
    """3 SGD steps on the twin's batches: the same losses and the same eval output afterwards."""
    arch = model.split(".")[0]
    ref = _ref(arch)
    trainer = _trainer(model)
    np.testing.assert_allclose(trainer.predict(_x(arch, "in_")), ref["out"], rtol=1e-4, atol=1e-6)
    losses = [trainer.step(_x(arch, f"train{k}_"), ref[f"train{k}_y"]) for k in range(3)]
    assert trainer.fallback is None
    key = "untied" if EXPECT[model] == "untied" else ""
    twin_out, twin_losses = ref["twin_out" + (f"_{key}" if key else "")], ref["twin_losses" + (f"_{key}" if key else "")]
    np.testing.assert_allclose(losses, twin_losses, rtol=1e-5, atol=1e-6)
    moved = float(np.abs(twin_out - ref["out"]).max())
    assert moved > 1e-3  # the twin's output moved: matching it is no accident
    np.testing.assert_allclose(trainer.predict(_x(arch, "in_")), twin_out, rtol=1e-4, atol=1e-3 * moved)


@pytest.mark.parametrize("model", [m for m in FAST if EXPECT[m] in ("twin", "untied")])
def test_trains_and_matches_pytorch(model):
    """bert.dynamo: the exporter's scalars (attention scale, GELU's coefficients, the mask's fill values) stay
    constants (before: trained, raw 'Invalid rank for output'); bilstm.legacy: two bidirectional layers train
    (before: 'LSTM and LSTMGrad kernel only supports the forward direction'); gpt2.dynamo: causal attention with
    a padding mask, its untied output embedding trained on its own."""
    _matches_twin(model)


@pytest.mark.slow
@pytest.mark.parametrize("model", [m for m in MODELS if EXPECT[m] in ("twin", "untied")])
def test_trains_and_matches_pytorch_full(model):
    _matches_twin(model)


def _trains_deterministically(model: str) -> None:
    """Predict equals PyTorch's eval output before training and is the same twice; Adam steps make the loss
    fall and update every trained weight; to_onnx() predicts what predict does."""
    arch = model.split(".")[0]
    ref = _ref(arch)
    X = _x(arch, "in_")
    trainer = _trainer(model, optimizer="adam", learning_rate=0.01)
    first = trainer.predict(X)
    np.testing.assert_allclose(first, ref["out"], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(trainer.predict(X), first)
    before = trainer.get_weights()
    Xt, yt = _x(arch, "train0_"), ref["train0_y"]
    losses = [trainer.step(Xt, yt) for _ in range(15)]
    assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses
    after = trainer.get_weights()
    assert [w for w in before if np.array_equal(before[w], after[w])] == []
    p = trainer.predict(X)
    np.testing.assert_array_equal(trainer.predict(X), p)
    sess = ort.InferenceSession(trainer.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, X if isinstance(X, dict) else {"x": X})[0], p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", [m for m in FAST if EXPECT[m] in ("bn_folded", "random")])
def test_trains_and_predicts_deterministically(model):
    """efficientnet.legacy_train: stochastic depth spelled RandomUniformLike/Less/Cast/Div/Mul (before: active
    in predict, the same rows predicted twice differed); mobilenet_v3.legacy: HardSwish and HardSigmoid (before:
    'The gradient builder has not been registered: HardSwish')."""
    _trains_deterministically(model)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_trains_and_predicts_deterministically_full(model):
    _trains_deterministically(model)


def test_progressive_validation_of_a_training_mode_export_is_its_eval_output():
    """The output a step reports (progressive validation) is the eval form's, before the step: no dropout or
    stochastic depth, running statistics."""
    arch = "efficientnet"
    trainer = _trainer(f"{arch}.legacy_train")
    X, y = _x(arch, "train0_"), _ref(arch)["train0_y"]
    expected = trainer.predict(X)
    trainer.step(X, y)
    np.testing.assert_allclose(trainer.last_output, expected, rtol=1e-6, atol=1e-7)


def test_exporter_scalars_are_constants_and_the_rule_can_be_overridden():
    """bert.dynamo's rank-0 initializers are constants by the stated rule; weights= trains one anyway (its
    gradient, left of the mask's shape by onnxruntime's builder, is summed to the scalar's shape), freeze=
    keeps a parameter out."""
    from streamfit._engine.prepare.constants import RULE

    assert "scalar" in RULE and "weights=" in RULE and "freeze=" in RULE
    trainer = _trainer("bert.dynamo")
    constants = trainer.prepared.constants
    assert {"zeros", "val_69"} <= set(constants)  # the Where's fill values of the attention mask
    assert all(trainer.prepared.initial[w].size > 1 or trainer.prepared.initial[w].ndim for w in trainer.weight_names)
    assert set(constants).isdisjoint(trainer.weight_names)
    arch, ref = "bert", _ref("bert")
    fill = "val_69"  # -3.4e38
    scale = "val_94"  # the attention scale, 1 / sqrt(8)
    assert constants[scale] == "a scalar (rank 0)" and constants[fill] == "a scalar (rank 0)"
    opted = _trainer("bert.dynamo", weights=trainer.weight_names + [scale], learning_rate=0.5)
    before = opted.get_weights()[scale]
    for k in range(2):
        opted.step(_x(arch, f"train{k}_"), ref[f"train{k}_y"])
    after = opted.get_weights()[scale]
    assert after.size == 1 and np.isfinite(after).all() and (after != before).all()
    head = "model.classifier.bias"
    frozen = _trainer("bert.dynamo", freeze=[head])
    assert head not in frozen.weight_names and frozen.prepared.constants[head] == "freeze="
    frozen.step(_x(arch, "train0_"), ref["train0_y"])
    assert frozen.predict(_x(arch, "in_")).shape == ref["out"].shape


def test_freeze_names_unknown_initializers():
    from streamfit.exceptions import ModelError

    with pytest.raises(ModelError, match="freeze names unknown initializers \\['nope'\\]"):
        _trainer("bert.legacy", freeze=["nope"])
