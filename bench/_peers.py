"""Peers that bench/engine.py measures streamfit against: scikit-learn, ORT's on-device training API, PyTorch.

Each ``make_*`` returns a *stepper*: a callable ``run(n)`` that does ``n`` training steps, cycling over the
pre-generated batches it was given (no data generation, no conversion in the timed loop), or raises
:class:`Unavailable` when the peer cannot run here (a package is missing).  Every peer trains the same
architecture with plain SGD on squared error at the same learning rate; PyTorch's and ORT's ``MSELoss``
are mean((y - t)**2), twice streamfit's and scikit-learn's half squared error, so they get lr / 2 and every
path takes the same update.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import os
import sys
import tempfile
import types
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np

Stepper = Callable[[int], None]


class Unavailable(Exception):
    """The peer cannot run in this environment (a package is missing); reported as n/a, not as an error."""


# -- ORT's on-device training API --------------------------------------------------------------------------
def import_ort_training() -> tuple[Any, Any]:
    """``onnxruntime.training.artifacts`` and ``onnxruntime.training.api`` without running the package's
    ``__init__`` (it imports ``optim``, which needs torch): a bare package module stands in for it."""
    name = "onnxruntime.training"
    if name not in sys.modules:
        spec = importlib.util.find_spec("onnxruntime")
        if spec is None or spec.origin is None:
            raise Unavailable("onnxruntime is not importable")
        path = os.path.join(os.path.dirname(spec.origin), "training")
        if not os.path.isdir(os.path.join(path, "api")):
            raise Unavailable("this onnxruntime build has no training API (install onnxruntime-training-cpu)")
        pkg = types.ModuleType(name)
        pkg.__path__ = [path]  # type: ignore[attr-defined]
        pkg.__package__ = name
        sys.modules[name] = pkg
    artifacts = importlib.import_module("onnxruntime.training.artifacts")
    api = importlib.import_module("onnxruntime.training.api")
    return artifacts, api


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 (C++ logging too) to a temporary file; replay it if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            tmp.seek(0)
            sys.stderr.write(tmp.read().decode(errors="replace")[-4000:])
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class OrtArtifacts:
    """Training, eval and optimizer models + checkpoint from ``generate_artifacts`` (MSE, SGD), IR <= 10."""

    def __init__(self, model: Any, directory: str) -> None:
        import onnx
        import onnxruntime as ort

        artifacts, _ = import_ort_training()
        ort.set_default_logger_severity(3)  # the offline graph passes log one INFO line per transformer
        os.makedirs(directory, exist_ok=True)
        weights = [init.name for init in model.graph.initializer]
        with quiet_stderr():  # the C++ gradient builder logs one INFO line per graph transformer
            artifacts.generate_artifacts(model, requires_grad=weights, frozen_params=[],
                                         loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.SGD,
                                         artifact_directory=directory)
        self.directory = directory
        self.ir_versions: dict[str, int] = {}
        for fname in sorted(os.listdir(directory)):
            if fname.endswith(".onnx"):
                path = os.path.join(directory, fname)
                m = onnx.load(path)
                self.ir_versions[fname] = m.ir_version
                if m.ir_version > 10:  # onnx stamps its own IR version (14 with onnx 1.23); ORT 1.19 takes <= 10
                    m.ir_version = 10
                    onnx.save(m, path)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)


def make_ort_api(art: OrtArtifacts, batches: Sequence[tuple[np.ndarray, np.ndarray]], lr: float,
                 threads: int | None, spinning: bool = True) -> tuple[Stepper, Any]:
    """``Module`` + ``Optimizer`` (SGD); a step is ``module(X, T)`` (train_step), ``optimizer.step()``,
    ``module.lazy_reset_grad()``.  Returns the stepper and the Module (the caller keeps it alive)."""
    import onnxruntime as ort

    _, api = import_ort_training()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = int(threads)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    state = api.CheckpointState.load_checkpoint(art.path("checkpoint"))
    module = api.Module(art.path("training_model.onnx"), state, art.path("eval_model.onnx"), device="cpu",
                        session_options=opts)
    optimizer = api.Optimizer(art.path("optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr / 2)  # MSELoss is mean((y-t)^2): lr/2 gives the update of 0.5*(y-t)^2
    module.train()
    data = [(X, y.reshape(-1, 1)) for X, y in batches]
    it = itertools.cycle(data)

    def run(n: int) -> None:
        for _ in range(n):
            X, T = next(it)
            module(X, T)
            optimizer.step()
            module.lazy_reset_grad()

    return run, (module, optimizer, state)


# -- scikit-learn ------------------------------------------------------------------------------------------
def make_sklearn(kind: str, sizes: Sequence[int], batch: int, batches: Sequence[tuple[np.ndarray, np.ndarray]],
                 lr: float, seed: int = 0) -> Stepper:
    """SGDRegressor (linear) or MLPRegressor(solver="sgd") (MLP), one ``partial_fit`` call per batch."""
    try:
        from sklearn.linear_model import SGDRegressor
        from sklearn.neural_network import MLPRegressor
    except ImportError as exc:  # pragma: no cover - scikit-learn is a test dependency
        raise Unavailable(f"scikit-learn is not importable ({exc})") from exc
    if kind == "linear":
        est: Any = SGDRegressor(loss="squared_error", penalty=None, learning_rate="constant", eta0=lr,
                                shuffle=False, average=False, random_state=seed)
    else:
        est = MLPRegressor(hidden_layer_sizes=tuple(sizes[1:-1]), activation="relu", solver="sgd", alpha=0.0,
                           batch_size=batch, learning_rate="constant", learning_rate_init=lr, momentum=0.0,
                           nesterovs_momentum=False, shuffle=False, random_state=seed)
    it = itertools.cycle(batches)

    def run(n: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(n):
                X, y = next(it)
                est.partial_fit(X, y)

    return run


# -- PyTorch -----------------------------------------------------------------------------------------------
def import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise Unavailable("torch is not importable in this interpreter (optional; see bench/README.md)") from exc


def make_torch(kind: str, sizes: Sequence[int], initial: dict[str, np.ndarray],
               batches: Sequence[tuple[np.ndarray, np.ndarray]], lr: float, threads: int | None) -> Stepper:
    """Eager nn.Linear / MLP with the ONNX model's initial weights, torch.optim.SGD, MSELoss (lr / 2)."""
    torch = import_torch()
    nn = torch.nn
    if threads is not None:
        torch.set_num_threads(int(threads))
    layers: list[Any] = []
    n_layers = len(sizes) - 1
    for i in range(n_layers):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        w_name, b_name = ("W", "B") if kind == "linear" else (f"W{i}", f"B{i}")
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.array(initial[w_name].T, order="C")))
            lin.bias.copy_(torch.from_numpy(np.array(initial[b_name])))
        layers.append(lin)
        if i < n_layers - 1:
            layers.append(nn.ReLU())
    net = nn.Sequential(*layers)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr / 2)
    loss_fn = nn.MSELoss()
    data = [(torch.from_numpy(X), torch.from_numpy(y.reshape(-1, 1))) for X, y in batches]
    it = itertools.cycle(data)

    def run(n: int) -> None:
        for _ in range(n):
            X, T = next(it)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(X), T)
            loss.backward()
            opt.step()
            loss.item()  # a streamfit step returns the loss as a Python float too

    run.keep = (net, opt, data)  # type: ignore[attr-defined]
    return run
