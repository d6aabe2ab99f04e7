"""Record step cases on onnxruntime-training 1.19.2, for ``run_new_ort.py`` to replay on the newest onnxruntime.

While a workload trains, every fused step's inputs are captured (weights and optimizer state before the
step, the batch, the row weights, the scalars); each case keeps the *portable* form of the step graphs
(:func:`streamfit._engine.gradient.portable.make_portable`), the steps, and the weights the engine reached with the
original graphs.  No pickle: arrays in ``.npz`` (``allow_pickle=False``), names in ``case.json``.

    python tests/portable/cases.py OUT_DIR [--quick]      # needs onnxruntime-training (Python <= 3.12)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import onnx

from streamfit._engine.common.names import Names
from streamfit._engine.gradient.portable import make_portable, portability_report
from streamfit._engine.gradient.rewrites import ONES
from streamfit._engine.steps.fused import FusedStep

HERE = Path(__file__).resolve().parent
ZOO = HERE.parent / "zoo"
RTOL, ATOL = 2e-4, 2e-5


class _Recording:
    """The steps of one FusedStep: its graphs, the state before the first step, each step's other inputs."""

    def __init__(self, strategy: FusedStep) -> None:
        self.strategy = strategy
        self.initial: dict[str, np.ndarray] | None = None
        self.steps: list[tuple[str, dict[str, np.ndarray]]] = []
        self.losses: list[float] = []

    def before(self, staging: Any) -> None:
        s = self.strategy
        large = staging.n >= s.large_batch_rows
        live = {name: np.array(v.numpy()) for name, v in s.params.live().items()}
        if self.initial is None:
            self.initial = live
        feeds = {spec.name: np.array(x) for spec, x in zip(s.pm.inputs, staging.xs)}
        feeds.update({Names.target: np.array(staging.t), Names.loss_weight: np.array(staging.lw),
                      Names.grad_weight: np.array(staging.gw)})
        feeds.update({name: np.array(a) for name, a in s.scalars.arrays.items()})
        if "ones" in staging.extra:
            feeds[ONES] = np.array(staging.extra["ones"][1])
        model = s.large_model if large else s.model
        inputs = {i.name for i in model.graph.input}
        feeds = {k: v for k, v in feeds.items() if k in inputs}
        self.steps.append(("large" if large else "small", feeds))

    def after(self, loss: float, ok: bool) -> None:
        if not ok:  # a refused step leaves the weights: the replay would apply it, so the case stops here
            self.steps.pop()
            raise RuntimeError("a step was refused while recording; record finite steps only")
        self.losses.append(loss)


@contextmanager
def recording() -> Iterator[list[_Recording]]:
    """Record every FusedStep that runs inside the block (one recording per step strategy)."""
    recs: dict[int, _Recording] = {}
    original = FusedStep.run

    def run(self: FusedStep, staging: Any) -> tuple[float, bool]:
        rec = recs.setdefault(id(self), _Recording(self))
        rec.before(staging)
        loss, ok = original(self, staging)
        rec.after(loss, ok)
        return loss, ok

    FusedStep.run = run  # type: ignore[method-assign]
    out: list[_Recording] = []
    try:
        yield out
    finally:
        FusedStep.run = original  # type: ignore[method-assign]
        out.extend(recs.values())


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> list[str]:
    names = list(arrays)
    np.savez(path, **{f"a{i}": arrays[n] for i, n in enumerate(names)})
    return names


def write_case(rec: _Recording, out: Path, name: str, portable: bool = True) -> Path:
    """Write one recording as a case directory ``out/name`` (the graphs in their portable form; with
    ``portable=False`` as the engine built them, to show what an inference build refuses)."""
    s = rec.strategy
    case = out / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    case.mkdir(parents=True, exist_ok=True)
    roles = sorted({role for role, _ in rec.steps})
    graphs = {}
    for role in roles:
        model = s.model if role == "small" else s.large_model
        graph = make_portable(model) if portable else model
        report = portability_report(graph)
        if portable and not report.portable:
            raise ValueError(f"{name}: the {role} graph is not portable: {report}")
        onnx.save(graph, case / f"{role}.onnx")
        graphs[role] = f"{role}.onnx"
    assert rec.initial is not None
    state = _save_arrays(case / "state.npz", rec.initial)
    final = {n: np.array(v.numpy()) for n, v in s.params.live().items()}
    np.savez(case / "expected.npz", **{f"a{i}": final[n] for i, n in enumerate(state)})
    steps = []
    for i, (role, feeds) in enumerate(rec.steps):
        steps.append({"graph": role, "file": f"step{i}.npz", "names": _save_arrays(case / f"step{i}.npz", feeds)})
    spec = {"name": name, "graphs": graphs, "state": state, "steps": steps, "loss": Names.loss,
            "losses": rec.losses, "rtol": RTOL, "atol": ATOL}
    (case / "case.json").write_text(json.dumps(spec, indent=1))
    return case


def write_split_case(trainer: Any, X: Any, out: Path, name: str) -> Path:
    """A forward/backward case: ``trainer``'s (portable) gradient graph cut at its YieldOp, one batch, a
    dL/dY, and the gradients onnxruntime-training's TrainingAgent gives for them."""
    from streamfit._engine.gradient.portable import split_at_yield

    case = out / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    case.mkdir(parents=True, exist_ok=True)
    split = split_at_yield(trainer.graphs.gradient)
    for role, graph in (("forward", split.forward), ("backward", split.backward)):
        report = portability_report(graph)
        if not report.portable:
            raise ValueError(f"{name}: the {role} graph is not portable: {report}")
        onnx.save(graph, case / f"{role}.onnx")
    y = trainer.forward(X)
    dy = np.random.default_rng(0).standard_normal(y.shape).astype(y.dtype)
    grads = trainer.backward(dy)
    grad_names = [o.name for o in split.backward.graph.output]
    feeds = dict(X) if isinstance(X, dict) else {trainer.prepared.inputs[0].name: X}
    feeds.update(trainer.get_weights())
    feeds.update(trainer.running_statistics())
    feeds.update({g: dy for g in split.grad_inputs})
    names = _save_arrays(case / "feeds.npz", {k: np.asarray(v) for k, v in feeds.items()})
    by_grad = dict(zip(trainer.graphs.grad_names, trainer.weight_names))
    np.savez(case / "expected.npz", **{f"a{i}": grads[by_grad[g]] for i, g in enumerate(grad_names)})
    spec = {"name": name, "kind": "split", "graphs": {"forward": "forward.onnx", "backward": "backward.onnx"},
            "feeds": names, "grad_outputs": grad_names, "rtol": RTOL, "atol": ATOL}
    (case / "case.json").write_text(json.dumps(spec, indent=1))
    return case


def _split_workloads(quick: bool) -> Iterator[tuple[str, Callable[[Path], Path]]]:
    """Forward/backward cases: the zoo models whose two forward runs agree (no dropout draws), not GRU/LSTM."""
    sys.path.insert(0, str(ZOO))
    import test_zoo as zoo

    for model in zoo.MODELS:
        if model.startswith(("gru", "lstm", "batchnorm1d_dropout")) or "_train" in model:
            continue
        if quick and f"zoo.{model}" not in QUICK_ZOO:
            continue
        def make(out: Path, model: str = model) -> Path:
            arch = model.split(".")[0]
            trainer = zoo._trainer(model, step="forward_backward", learning_rate=0.02, portable=True)
            trainer.step(*zoo._batch(arch, 7, seed=1))
            return write_split_case(trainer, zoo._batch(arch, 7, seed=3)[0], out, f"split.{model}")
        yield f"split.{model}", make


# -- the workloads -------------------------------------------------------------------------------------

def _engine_workloads(quick: bool) -> Iterator[tuple[str, Callable[[], None]]]:
    from streamfit._engine.testing import linear_model, mlp_model
    from streamfit._engine.trainer import Trainer

    rng = np.random.default_rng(0)
    X = rng.standard_normal((2048, 100)).astype(np.float32)
    y = X[:, :3].sum(axis=1).astype(np.float32)
    models = {"linear": lambda: linear_model(100), "mlp_relu": lambda: mlp_model([100, 64, 64, 1], "Relu"),
              "mlp_tanh": lambda: mlp_model([100, 32, 1], "Tanh"), "mlp_sigmoid": lambda: mlp_model([100, 32, 1], "Sigmoid")}
    for name, make in models.items():
        for optimizer in (("sgd", "adam") if not quick or name == "mlp_relu" else ("sgd",)):
            def run(make: Callable[[], Any] = make, optimizer: str = optimizer) -> None:
                t = Trainer(make(), optimizer=optimizer, learning_rate=0.01)
                for rows in (1, 32, 1, 32, 2048) if not quick else (1, 32, 64):
                    t.step(X[:rows], y[:rows])
            yield f"engine.{name}.{optimizer}", run


def _ready_made_workloads() -> Iterator[tuple[str, Callable[[], None]]]:
    import streamfit as sf

    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 6)).astype(np.float32)
    y = (X @ rng.standard_normal(6)).astype(np.float32)
    labels = (y > 0).astype(np.int64)
    cases = {"LinearRegressor": (lambda: sf.LinearRegressor(random_state=0), y),
             "LogisticRegression": (lambda: sf.LogisticRegression(random_state=0), labels),
             "MLPRegressor.relu": (lambda: sf.MLPRegressor((16, 8), random_state=0), y),
             "MLPRegressor.tanh": (lambda: sf.MLPRegressor((16,), activation="tanh", random_state=0), y),
             "MLPClassifier.logistic": (lambda: sf.MLPClassifier((16,), activation="logistic", random_state=0), labels)}
    for name, (make, target) in cases.items():
        def run(make: Callable[[], Any] = make, target: np.ndarray = target) -> None:
            est = make()
            kw = {"classes": [0, 1]} if target.dtype.kind == "i" else {}
            # calls of at most one step's rows: a longer call is one chunk (an ONNX Scan over its steps, replayed
            # on the newest onnxruntime by tests/engine/test_chunk_steps.py), and these cases record the step graphs
            est.partial_fit(X[:1], target[:1], **kw)
            for start in range(1, len(X), est.batch_size):
                sl = slice(start, start + est.batch_size)
                est.partial_fit(X[sl], target[sl], **kw)
        yield f"ready.{name}", run


def _zoo_workloads() -> Iterator[tuple[str, Callable[[], None]]]:
    sys.path.insert(0, str(ZOO))
    import test_zoo as zoo

    for model in zoo.MODELS:
        if model.split(".")[0] in ("gru", "lstm"):  # need onnxruntime-training (see portable.CANNOT)
            continue
        def run(model: str = model) -> None:
            arch = model.split(".")[0]
            # SGD: Adam turns the float noise of a zero gradient (a bias before BatchNorm, attention key biases)
            # into lr-sized steps, which no tolerance can compare
            t = zoo._trainer(model, learning_rate=0.02, sparse=False)
            for i, rows in enumerate((7, 7, 64)):
                t.step(*zoo._batch(arch, rows, seed=10 * i + rows))
        yield f"zoo.{model}", run


#: the zoo models the quick set replays (one per family of rewritten kernels)
QUICK_ZOO = ("zoo.mlp_gelu.dynamo", "zoo.conv2d_bn_maxpool.dynamo", "zoo.transformer_encoder.legacy_train",
             "zoo.conv1d_globalpool.dynamo", "zoo.embedding_mlp.legacy", "zoo.mlp_silu.legacy")


def workloads(quick: bool = False) -> list[tuple[str, Callable[[], None]]]:
    out = list(_engine_workloads(quick)) + list(_ready_made_workloads())
    return out + [(n, run) for n, run in _zoo_workloads() if not quick or n in QUICK_ZOO]


def make_cases(out: Path, quick: bool = False, portable: bool = True,
               only: Callable[[str], bool] = lambda name: True) -> list[Path]:
    """Run the workloads on this (training) build and write one case per trained step strategy."""
    written = []
    for name, run in workloads(quick):
        if not only(name):
            continue
        with recording() as recs:
            run()
        for k, rec in enumerate(recs):
            if rec.steps:
                written.append(write_case(rec, out, name if len(recs) == 1 else f"{name}.{k}", portable))
    if portable:
        written += [make(out) for name, make in _split_workloads(quick) if only(name)]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="fewer engine cases, six zoo models")
    args = parser.parse_args()
    written = make_cases(args.out, quick=args.quick)
    print(f"{len(written)} cases written to {args.out}")


if __name__ == "__main__":
    main()
