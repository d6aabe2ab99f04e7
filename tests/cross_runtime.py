"""One run on two onnxruntimes: training artifacts and ready-made models trained on the same batches.

``python tests/cross_runtime.py make DIR`` (the CI's first leg, onnxruntime-training 1.19.2) compiles the
artifacts into DIR, trains them and the ready-made estimators on seeded batches (saved too, so the second
leg need not regenerate them) and saves the weights.  ``tests/test_cross_runtime.py`` (the second leg,
Python 3.13 with the newest onnxruntime, ``STREAMFIT_CROSS_DIR=DIR``) trains the same on the same batches
and compares: float noise only.  Everything saved is ONNX, JSON or ``.npz`` without pickle.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

#: batch sizes of every case: both batch classes (small < 64 rows <= large), a row at a time too
SIZES = (1, 5, 100, 3, 80, 1, 16)
LR = 0.05


def _dense(activation: str, sizes: tuple[int, ...], seed: int = 0) -> Any:
    from streamfit.models._graphs import dense_model

    rng = np.random.default_rng(seed)
    return dense_model([(rng.normal(size=(a, b)) * 0.5, rng.normal(size=b) * 0.1)
                        for a, b in zip(sizes[:-1], sizes[1:])], activation)


def _fm() -> Any:
    from streamfit.models._fm_graph import fm_model

    return fm_model(3, 2, 40, 4, np.random.default_rng(2), init_scale=0.3)


#: artifacts: name -> (model, compile options); the gradient builder each is compiled with is part of the case
ARTIFACTS: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "linear-adam": (lambda: _dense("identity", (6, 1)), {"optimizer": "adam"}),
    "linear-sgd-l2": (lambda: _dense("identity", (6, 1)), {"penalty": (1e-3, 0.0)}),
    "softmax-momentum": (lambda: _dense("identity", (6, 3)), {"loss": "softmax_cross_entropy", "optimizer": "momentum"}),
    "mlp-relu-own": (lambda: _dense("relu", (6, 16, 8, 1)), {"gradient": "streamfit"}),
    "mlp-tanh-adam-own": (lambda: _dense("tanh", (6, 16, 1)), {"optimizer": "adam", "gradient": "streamfit"}),
    "mlp-logistic-own": (lambda: _dense("logistic", (6, 16, 2)), {"loss": "log_loss", "gradient": "streamfit"}),
    "fm-adagrad-own": (_fm, {"optimizer": "adagrad", "gradient": "streamfit"}),
    # onnxruntime-training's gradient (ReluGrad, TanhGrad, ... rewritten by the portable pass when compiled)
    "mlp-relu-ort": (lambda: _dense("relu", (6, 16, 8, 1)), {"gradient": "onnxruntime"}),
    "mlp-tanh-ort": (lambda: _dense("tanh", (6, 16, 1)), {"optimizer": "momentum", "gradient": "onnxruntime"}),
}

def _estimators() -> dict[str, Callable[[], Any]]:
    """The ready-made estimators: name -> constructor (the task follows from the name)."""
    from streamfit import FMClassifier, FMRegressor, LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor

    return {
        "LinearRegressor": lambda: LinearRegressor(random_state=0, eta0=0.01),
        "LogisticRegression": lambda: LogisticRegression(random_state=0),
        "MLPRegressor": lambda: MLPRegressor(hidden_layer_sizes=(16,), random_state=0),
        "MLPClassifier": lambda: MLPClassifier(hidden_layer_sizes=(8, 8), activation="tanh", random_state=0),
        "FMRegressor": lambda: FMRegressor(["c0", "c1"], dense=["d0", "d1"], buckets=64, n_factors=3, random_state=0),
        "FMClassifier": lambda: FMClassifier(["c0", "c1"], dense=["d0"], buckets=64, n_factors=3, optimizer="adam",
                                             random_state=0),
    }


def _artifact_batches(name: str, trainer: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    out: dict[str, np.ndarray] = {}
    n_out = trainer.prepared.model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
    for k, n in enumerate(SIZES):
        for spec in trainer.model_inputs:
            shape = (n,) + tuple(spec.shape[1:])
            out[f"x{k}_{spec.name}"] = (rng.integers(0, 40, size=shape) if spec.dtype.kind == "i"
                                        else rng.normal(size=shape).astype(spec.dtype))
        if trainer.loss.integer_labels:
            out[f"y{k}"] = rng.integers(0, n_out, size=n)
        elif trainer.loss.name == "log_loss":
            out[f"y{k}"] = rng.integers(0, 2, size=(n, n_out)).astype(np.float32)
        else:
            out[f"y{k}"] = rng.normal(size=(n, n_out)).astype(np.float32)
    return out


def train_artifact(path: "str | Path", batches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights after training the artifact at ``path`` on ``batches`` (as saved by :func:`make`)."""
    from streamfit._engine.trainer import Trainer

    trainer = Trainer(str(path), learning_rate=LR)
    for k in range(len(SIZES)):
        X = {spec.name: batches[f"x{k}_{spec.name}"] for spec in trainer.model_inputs}
        trainer.step(X if len(X) > 1 else next(iter(X.values())), batches[f"y{k}"])
    return trainer.get_weights()


def _estimator_batches(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(len(name))
    out: dict[str, np.ndarray] = {}
    for k, n in enumerate(SIZES):
        X = rng.normal(size=(n, 4)).astype(np.float32)
        score = X @ np.array([1.0, -2.0, 0.5, 1.5], np.float32)
        if name.startswith("FM"):
            out[f"c0_{k}"] = rng.integers(0, 30, size=n).astype(str)
            out[f"c1_{k}"] = rng.integers(0, 30, size=n).astype(str)
        out[f"x{k}"] = X
        if name == "FMClassifier":
            out[f"y{k}"] = (score > 0).astype(np.int64)
        elif "Classifier" in name or "Logistic" in name:
            out[f"y{k}"] = (score > 0).astype(np.int64) + (score > 2)
        else:
            out[f"y{k}"] = score
    return out


def _estimator_X(name: str, batches: dict[str, np.ndarray], k: int) -> Any:
    if not name.startswith("FM"):
        return batches[f"x{k}"]
    import pyarrow as pa

    X = batches[f"x{k}"]
    return pa.table({"c0": batches[f"c0_{k}"], "c1": batches[f"c1_{k}"], "d0": X[:, 0], "d1": X[:, 1]})


def train_estimator(name: str, batches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights (and predictions on the last batch) of ready-made estimator ``name`` after ``partial_fit`` on ``batches``."""
    est = _estimators()[name]()
    classes = np.unique(np.concatenate([batches[f"y{k}"] for k in range(len(SIZES))])) \
        if "Classifier" in name or "Logistic" in name else None
    for k in range(len(SIZES)):
        X = _estimator_X(name, batches, k)
        est.partial_fit(X, batches[f"y{k}"], **({"classes": classes} if classes is not None else {}))
    weights = dict(est.trainer_.get_weights())
    last = _estimator_X(name, batches, len(SIZES) - 1)
    weights["__predict"] = np.asarray(est.predict_proba(last) if classes is not None else est.predict(last), np.float64)
    return weights


def make(directory: "str | Path") -> dict[str, Any]:
    """Compile, train and save every case into ``directory``; returns the manifest (also written as JSON)."""
    import onnxruntime

    from streamfit._engine.artifact import save_artifact
    from streamfit._engine.compile import compile_artifact
    from streamfit._engine.trainer import Trainer
    from streamfit.penalties import Penalty

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name, (build, options) in ARTIFACTS.items():
        options = dict(options)
        if "penalty" in options:
            options["penalty"] = Penalty(*options["penalty"])
        model = build()
        art = compile_artifact(model, **options)
        save_artifact(art, root / f"{name}.train.onnx")
        probe = Trainer(art)
        batches = _artifact_batches(name, probe)
        np.savez(root / f"{name}.batches.npz", **batches)
        np.savez(root / f"{name}.weights.npz", **train_artifact(root / f"{name}.train.onnx", batches))
    for name in _estimators():
        batches = _estimator_batches(name)
        np.savez(root / f"{name}.batches.npz", **batches)
        np.savez(root / f"{name}.weights.npz", **train_estimator(name, batches))
    manifest = {"artifacts": sorted(ARTIFACTS), "estimators": sorted(_estimators()),
                "onnxruntime": onnxruntime.__version__, "python": sys.version.split()[0]}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def load(path: "str | Path") -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit("usage: python tests/cross_runtime.py make DIR")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(json.dumps(make(sys.argv[2])))
