"""Training artifacts (``streamfit compile``): the compiled step graphs train exactly as the trainer that built them,
with no onnxruntime-training on the loading path; damaged or mismatched artifacts are refused clearly."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnxruntime.capi import _pybind_state as C

from streamfit import OnnxRegressor
from streamfit._engine.artifact import KEY, read_artifact, save_artifact
from streamfit._engine.compile import compile_artifact
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.cli import main
from streamfit.exceptions import ModelError
from streamfit.penalties import Penalty

pytestmark = pytest.mark.needs_ort_training  # compiling a raw model needs onnxruntime-training's gradient builder


def _batches(n_features: int, sizes: tuple[int, ...], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, n_features)).astype(np.float32), rng.normal(size=n).astype(np.float32)) for n in sizes]


def _train(trainer: Trainer, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    for X, y in batches:
        trainer.step(X, y)
    return trainer.get_weights()


@pytest.mark.parametrize("optimizer, penalty", [("adam", None), ("sgd", Penalty(0.01, 0.0)), ("momentum", Penalty(0.01, 0.5))])
def test_artifact_trains_as_the_trainer_that_compiled_it(tmp_path, optimizer, penalty) -> None:
    model = mlp_model([5, 16, 1], seed=3)
    path = tmp_path / "mlp.train.onnx"
    save_artifact(compile_artifact(model, optimizer=optimizer, penalty=penalty), path)
    batches = _batches(5, (1, 3, 100, 2, 70, 1))  # both batch classes
    reference = _train(Trainer(model, optimizer=optimizer, penalty=penalty, learning_rate=0.05), batches)
    trained = _train(Trainer(str(path), learning_rate=0.05), batches)
    assert trained.keys() == reference.keys()
    for name in reference:
        np.testing.assert_array_equal(trained[name], reference[name])


def test_loading_an_artifact_needs_no_gradient_builder(tmp_path, monkeypatch) -> None:
    path = tmp_path / "lin.train.onnx"
    save_artifact(compile_artifact(linear_model(4, seed=1), optimizer="adagrad"), path)
    for name in ("OrtModuleGraphBuilder", "OrtModuleGraphBuilderConfiguration", "TrainingAgent", "GradientGraphBuilder"):
        monkeypatch.delattr(C, name, raising=False)
    trainer = Trainer(path, learning_rate=0.1)
    X, y = _batches(4, (8,))[0]
    first = trainer.step(X, y)
    for _ in range(50):
        last = trainer.step(X, y)
    assert last < first
    assert trainer.graphs is None and trainer.artifact is not None
    from streamfit._engine.testing import cnn_model

    with pytest.raises(ModelError, match="needs onnxruntime-training at train time"):  # a raw model of other ops does
        Trainer(cnn_model())


def test_artifact_file_is_onnx_with_typed_json_metadata(tmp_path) -> None:
    model = mlp_model([3, 4, 2], seed=0)
    art = compile_artifact(model, optimizer="adam", batch_classes=("large",))
    info = read_artifact(art).info
    assert [g.batch_class for g in info.graphs] == ["large"]
    assert info.weight_names == Trainer(model).weight_names
    assert [t.name for t in info.state] == [f"{w}__{s}" for w in info.weight_names for s in ("exp_avg", "exp_avg_sq")]
    assert info.optimizer.name == "adam" and info.y_rank == 2 and info.checksum
    json.loads(next(p.value for p in art.metadata_props if p.key == KEY))
    # the file is the author's model: onnxruntime predicts with it as it is
    import onnxruntime as ort

    out = ort.InferenceSession(art.SerializeToString()).run(None, {"X": np.ones((2, 3), np.float32)})[0]
    np.testing.assert_allclose(out, Trainer(model).predict(np.ones((2, 3), np.float32)), rtol=1e-6)
    # one class alone serves every batch size
    trainer = Trainer(art)
    for X, y in _batches(3, (1, 100)):
        trainer.step(X, np.stack([y, y], 1))
    assert trainer.n_steps == 2


def test_artifact_keeps_the_check_plan_of_its_graphs() -> None:
    from streamfit._engine.steps.check_plan import CheckPlan

    art = compile_artifact(mlp_model([64, 80, 1], seed=0))  # SGD: the 64x80 weight is checked by a bound
    a = read_artifact(art)
    small = a.info.graphs[0]
    assert small.batch_class == "small" and small.check_plan.bounded == ("W0",)
    assert CheckPlan.of(a.steps["small"]) == small.check_plan
    assert CheckPlan.of(a.steps["large"]) == a.info.graphs[1].check_plan


def test_damaged_or_mismatched_artifacts_are_refused(tmp_path) -> None:
    art = compile_artifact(linear_model(3, seed=2))
    edited = onnx.ModelProto()
    edited.CopyFrom(art)
    init = edited.graph.initializer[0]
    arr = onnx.numpy_helper.to_array(init).copy()
    arr.flat[0] += 1
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    with pytest.raises(ModelError, match="checksum"):
        Trainer(edited)
    newer = onnx.ModelProto()
    newer.CopyFrom(art)
    for p in newer.metadata_props:
        if p.key == KEY:
            p.value = json.dumps({**json.loads(p.value), "format_version": 99})
    with pytest.raises(ModelError, match="format version 99"):
        Trainer(newer)
    with pytest.raises(ModelError, match="compiled with loss=squared_error.*given loss=Huber"):
        Trainer(art, loss="huber")
    with pytest.raises(ModelError, match="fused step graphs only"):
        Trainer(art, step="forward_backward")
    with pytest.raises(ModelError, match="already a training artifact"):
        compile_artifact(art)


def test_estimator_trains_an_artifact_as_the_model(tmp_path) -> None:
    model = linear_model(4, seed=5)
    path = tmp_path / "lin.train.onnx"
    save_artifact(compile_artifact(model, penalty=Penalty(1e-4, 0.0)), path)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    a = OnnxRegressor(model, penalty="l2", alpha=1e-4, random_state=0).fit(X, y)
    b = OnnxRegressor(str(path), penalty="l2", alpha=1e-4, random_state=0).fit(X, y)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))
    exported = b.to_onnx()
    assert not exported.training_info and all(p.key != KEY for p in exported.metadata_props)


def test_cli_compile(tmp_path, capsys) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "m.train.onnx"
    onnx.save(mlp_model([4, 6, 1], seed=0), src)
    assert main(["compile", str(src), "-o", str(out), "--optimizer", "nesterov", "--momentum", "0.5",
                 "--penalty", "l2", "--alpha", "0.001", "--batch-classes", "small"]) == 0
    assert "wrote" in capsys.readouterr().out
    info = read_artifact(onnx.load(out)).info
    assert info.optimizer.params == (("momentum", 0.5),) and info.penalty == (0.001, 0.0)
    assert [g.batch_class for g in info.graphs] == ["small"]
    assert main(["compile", str(src), "-o", str(out), "--batch-classes", "tiny"]) == 2
    assert main(["compile", str(tmp_path / "missing.onnx"), "-o", str(out)]) == 2


def test_preflight_checks_an_artifacts_own_graphs(tmp_path) -> None:
    from streamfit._preflight import check_model

    path = tmp_path / "m.train.onnx"
    save_artifact(compile_artifact(mlp_model([4, 6, 1], seed=0), optimizer="adam"), path)
    result = check_model(path, use_cache=False)
    assert result.ok, result.message()
    assert "the fused step" in result.message() and any("training artifact" in n for n in result.notes)


def test_a_step_graph_kernel_this_onnxruntime_lacks_is_explained() -> None:
    from streamfit._engine.artifact import _digest, _loads, dumps

    art = compile_artifact(linear_model(3, seed=2), batch_classes=("small",))
    graph = art.training_info[0].algorithm  # as a graph holding an inference build's missing kernel looks there
    first = graph.node[0]
    first.domain, first.op_type = "com.microsoft", "NoSuchGradKernel"
    prop = next(p for p in art.metadata_props if p.key == KEY)
    info = _loads(prop.value)
    prop.value = dumps(type(info)(**{**{f: getattr(info, f) for f in info.__dataclass_fields__},
                                      "checksum": _digest(info, art)}))
    trainer = Trainer(art)
    X, y = _batches(3, (2,))[0]
    with pytest.raises(ModelError, match=r"com.microsoft:NoSuchGradKernel is a kernel this onnxruntime does not "
                                         r"have .*--gradient streamfit"):
        trainer.step(X, y)


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic"])
def test_artifacts_of_onnxruntime_gradients_hold_inference_ops_only(activation) -> None:
    """onnxruntime-training's gradient brings ReluGrad/TanhGrad/SigmoidGrad; compile rewrites them (portable pass),
    so the artifact runs on any inference build, and trains as the trainer with the original graphs does."""
    from streamfit._engine.gradient.portable import portability_report
    from streamfit.models._graphs import dense_model

    rng = np.random.default_rng(4)
    model = dense_model([(rng.normal(size=(5, 8)) * 0.5, rng.normal(size=8) * 0.1),
                         (rng.normal(size=(8, 1)) * 0.5, np.zeros(1))], activation)
    art = compile_artifact(model, optimizer="sgd", gradient="onnxruntime")
    for entry in art.training_info:
        report = portability_report(onnx.helper.make_model(entry.algorithm))
        assert report.portable, f"{entry.algorithm.name}: {report}"
    batches = _batches(5, (1, 3, 100, 2, 70, 1))
    reference = _train(Trainer(model, optimizer="sgd", learning_rate=0.05), batches)
    trained = _train(Trainer(art, learning_rate=0.05), batches)
    for name in reference:
        np.testing.assert_allclose(trained[name], reference[name], rtol=1e-5, atol=1e-6)
