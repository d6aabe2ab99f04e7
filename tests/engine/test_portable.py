"""Portable step graphs on the zoo and the ready-made models: same weights as the original graphs, no training op left.

On onnxruntime-training, ``Trainer(portable=True)`` (the training-only kernels rewritten, see
:mod:`streamfit._engine.gradient.portable`) must train every zoo model to the weights the original graphs give (float
noise), with both step strategies and both fused graphs (small and large batches); every graph it runs must
hold only ops of inference builds, except the recurrent models listed in ``CANNOT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from streamfit._engine.gradient.portable import make_portable, portability_report, split_at_yield
from streamfit._engine.steps import fused_adam
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer

pytestmark = pytest.mark.needs_ort_training  # records/compares against onnxruntime-training 1.19.2

ZOO = Path(__file__).resolve().parents[1] / "zoo"
sys.path.insert(0, str(ZOO))
import test_zoo as zoo  # noqa: E402  (the zoo's batch maker and trainer factory)

#: zoo models whose gradient needs kernels with no rewrite (onnxruntime-training at train time)
RECURRENT = {"gru": {"com.microsoft:GRUTraining", "com.microsoft:GRUGrad", "com.microsoft:GatherGrad"},
             "lstm": {"com.microsoft:LSTMTraining", "com.microsoft:LSTMGrad", "com.microsoft:GatherGrad"}}


def _train(model: str, step: str, portable: bool, sizes: tuple[int, ...]) -> Trainer:
    arch = model.split(".")[0]
    trainer = zoo._trainer(model, step=step, learning_rate=0.02, portable=portable)
    for i, rows in enumerate(sizes):
        trainer.step(*zoo._batch(arch, rows, seed=10 * i + rows))
    assert trainer.fallback is None
    return trainer


def _same_weights(a: Trainer, b: Trainer) -> None:
    for kind in ("get_weights", "running_statistics", "optimizer_state"):
        want, got = getattr(a, kind)(), getattr(b, kind)()
        assert want.keys() == got.keys()
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=2e-6, err_msg=f"{kind} {name}")


def _check_portable(trainer: Trainer, arch: str, roles: set[str]) -> None:
    graphs = trainer.step_graphs()
    assert roles <= set(graphs)
    for role, graph in graphs.items():
        if role == "gradient":  # the TrainingAgent's graph keeps its YieldOp hand-off (CANNOT)
            continue
        left = set(portability_report(graph).training_only)
        assert left == (RECURRENT.get(arch, set()) if role.startswith("fused") else set()), (role, left)


@pytest.mark.parametrize("model", zoo.MODELS)
def test_portable_fused_step_equals_the_original(model):
    """Two small batches (the small-batch graph) then a large one (the large-batch graph)."""
    sizes = (7, 7, 64)
    original, portable = (_train(model, "fused", p, sizes) for p in (False, True))
    _same_weights(original, portable)
    _check_portable(portable, model.split(".")[0], {"fused", "fused_large"})


#: one model per rewritten kernel family (the rest of the zoo runs with -m slow)
FB_DEFAULT = ["transformer_encoder.legacy_train", "conv2d_bn_maxpool.dynamo", "conv1d_globalpool.dynamo",
              "layernorm_gelu.dynamo", "mlp_silu.dynamo", "gru.dynamo", "mlp_leakyrelu.legacy"]


@pytest.mark.parametrize("model", [m if m in FB_DEFAULT else pytest.param(m, marks=pytest.mark.slow)
                                   for m in zoo.MODELS])
def test_portable_forward_backward_step_equals_the_original(model):
    original, portable = (_train(model, "forward_backward", p, (7, 7)) for p in (False, True))
    _same_weights(original, portable)
    left = set(portability_report(portable.step_graphs()["gradient"]).training_only)
    assert left == {"com.microsoft:YieldOp"} | RECURRENT.get(model.split(".")[0], set())


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "ftrl"])
@pytest.mark.parametrize("activation", ["Relu", "Tanh", "Sigmoid", "LeakyRelu"])
def test_engine_models_portable_both_dtypes(activation, optimizer):
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        if dtype == np.float64 and activation == "LeakyRelu":
            continue  # LeakyReluGrad has no float64 kernel in 1.19.2: the original cannot train it
        X = rng.standard_normal((80, 6)).astype(dtype)
        y = rng.standard_normal(80).astype(dtype)
        trainers = [Trainer(mlp_model([6, 8, 1], activation, dtype=dtype), optimizer=optimizer, portable=p)
                    for p in (False, True)]
        for t in trainers:
            for rows in (3, 3, 80):
                t.step(X[:rows], y[:rows])
        _same_weights(*trainers)
        for role, graph in trainers[1].step_graphs().items():
            assert portability_report(graph).portable, (role, str(portability_report(graph)))


def test_ready_made_models_are_portable():
    """The ready-made models' own graphs: linear ones already are, MLPs after the rewrite."""
    import streamfit as sf

    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 5)).astype(np.float32)
    y = X @ rng.standard_normal(5).astype(np.float32)
    t = Trainer(linear_model(5), optimizer="adam")
    t.step(X, y)
    graphs = t.step_graphs()
    assert "fused_row" in graphs
    # the lean one-row step runs onnxruntime-training's Adam kernel where this build has it (steps/fused_adam.py)
    for role in ("fused_row", "fused_batch"):  # and so does the lean step of a small batch
        assert portability_report(graphs.pop(role)).portable is not fused_adam.kernel_available()
    assert all(portability_report(g).portable for g in graphs.values())
    p = Trainer(linear_model(5), optimizer="adam", portable=True)  # a portable trainer's lean steps are not
    p.step(X, y)
    assert {"fused_row", "fused_batch"} <= set(p.step_graphs())
    assert all(portability_report(g).portable for g in p.step_graphs().values())
    for act in ("relu", "tanh", "logistic"):
        est = sf.MLPRegressor((16,), activation=act, random_state=0).partial_fit(X, y)
        graphs = est.trainer_.step_graphs()
        assert not all(portability_report(g).portable for g in graphs.values())  # ReluGrad/TanhGrad/SigmoidGrad
        assert all(portability_report(make_portable(g)).portable for g in graphs.values())


def _split_gradients(trainer: Trainer, X, dy):  # type: ignore[no-untyped-def]
    """Gradients from the gradient graph cut at its YieldOp, run as two plain sessions."""
    import onnxruntime as ort

    split = split_at_yield(trainer.graphs.gradient)
    for piece in (split.forward, split.backward):
        assert portability_report(piece).portable, str(portability_report(piece))
    sessions = [ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"])
                for p in (split.forward, split.backward)]
    feeds = dict(X) if isinstance(X, dict) else {trainer.prepared.inputs[0].name: X}
    feeds.update(trainer.get_weights())
    feeds.update(trainer.running_statistics())
    fw, bw = sessions
    outs = dict(zip([o.name for o in fw.get_outputs()],
                    fw.run(None, {i.name: feeds[i.name] for i in fw.get_inputs()})))
    feeds.update(outs)
    feeds.update({g: dy.reshape(outs[o].shape) for o, g in zip(split.outputs, split.grad_inputs)})
    grads = bw.run(None, {i.name: feeds[i.name] for i in bw.get_inputs()})
    return dict(zip(trainer.weight_names, grads))


#: dropout draws differ between two forward runs; GRU/LSTM keep training kernels
_SPLITTABLE = [m for m in zoo.MODELS if not m.startswith(("gru", "lstm", "batchnorm1d_dropout")) and "_train" not in m]


@pytest.mark.parametrize("model", [m if m in FB_DEFAULT + ["mlp_relu.dynamo", "two_tower.legacy",
                                                          "transformer_encoder.legacy", "conv1d_maxpool.legacy"]
                                   else pytest.param(m, marks=pytest.mark.slow) for m in _SPLITTABLE])
def test_forward_backward_cut_at_the_yield_equals_the_training_agent(model):
    """The forward/backward pieces as two plain graphs (what the TrainingAgent runs in one session)."""
    arch = model.split(".")[0]
    trainer = _train(model, "forward_backward", True, (7,))
    X, _ = zoo._batch(arch, 7, seed=3)
    y = trainer.forward(X)
    dy = np.random.default_rng(0).standard_normal(y.shape).astype(y.dtype)
    want = trainer.backward(dy)
    got = _split_gradients(trainer, X, dy)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=2e-6, err_msg=name)
