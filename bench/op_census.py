"""Which operators do the graphs the engine runs hold?  Every session the engine creates, counted by domain.

Trains the zoo (tests/zoo, both step strategies, SGD and Adam, a small and a large batch), the ready-made
models and the engine's test models for two steps each, records every graph handed to an
``InferenceSession``, and prints, for each non-standard operator, how many graphs and how many models hold
it, before and after :func:`streamfit._engine.gradient.portable.make_portable`.  Run with onnxruntime-training:

    .venv/bin/python bench/op_census.py [--zoo-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests" / "zoo"


class _Recorder:
    """Replaces ``ort.InferenceSession`` while a workload runs: keeps (site, model) for every session."""

    def __init__(self) -> None:
        self.graphs: list[tuple[str, onnx.ModelProto]] = []
        self._orig = ort.InferenceSession

    def __enter__(self) -> "_Recorder":
        orig, graphs = self._orig, self.graphs

        def make(model: Any, *args: Any, **kwargs: Any) -> Any:
            proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
            site = next((f"{Path(f.filename).stem}.{f.function}" for f in inspect.stack()[1:]
                         if "streamfit" in f.filename and f.function != "make_session"), "?")
            graphs.append((site, proto))
            return orig(model, *args, **kwargs)

        ort.InferenceSession = make  # type: ignore[misc]
        return self

    def __exit__(self, *exc: Any) -> None:
        ort.InferenceSession = self._orig  # type: ignore[misc]


def _zoo_workloads() -> Iterator[tuple[str, Callable[[], None]]]:
    sys.path.insert(0, str(ZOO))
    import test_zoo as z  # the zoo's own batch maker and trainer factory

    for model in z.MODELS:
        arch = model.split(".")[0]
        for step in ("fused", "forward_backward"):
            for optimizer in ("sgd", "adam"):
                def run(model: str = model, arch: str = arch, step: str = step, optimizer: str = optimizer) -> None:
                    trainer = z._trainer(model, step=step, optimizer=optimizer, learning_rate=0.01)
                    for rows in ((7, 64) if step == "fused" else (7,)):
                        if z._needs_more_than_one_value(model, rows):
                            continue
                        trainer.step(*z._batch(arch, rows, seed=rows))
                yield f"zoo:{model}", run


def _ready_made_workloads() -> Iterator[tuple[str, Callable[[], None]]]:
    import streamfit as sf

    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 5)).astype(np.float32)
    y = X @ rng.standard_normal(5).astype(np.float32)
    labels = (y > 0).astype(np.int64)
    cases: list[tuple[str, Any, np.ndarray]] = [("LinearRegressor", sf.LinearRegressor(optimizer=o), y)
                                                for o in ("sgd", "adam", "adagrad", "ftrl", "momentum")]
    cases += [("LogisticRegression", sf.LogisticRegression(), labels)]
    for act in ("relu", "tanh", "logistic", "identity"):
        cases += [(f"MLPRegressor[{act}]", sf.MLPRegressor((16, 8), activation=act), y),
                  (f"MLPClassifier[{act}]", sf.MLPClassifier((16,), activation=act), labels)]
    for name, est, target in cases:
        def run(est: Any = est, target: np.ndarray = target) -> None:
            est.partial_fit(X[:7], target[:7], **({"classes": [0, 1]} if target.dtype.kind == "i" else {}))
            est.partial_fit(X, target)
        yield f"ready:{name}", run
    import pyarrow as pa

    cats = {f"c{i}": [f"v{j % (i + 3)}" for j in range(100)] for i in range(3)}
    table = pa.table({**cats, "d0": X[:, 0], "y": labels})
    for cls in ("FMClassifier", "FMRegressor"):
        def run_fm(cls: str = cls) -> None:
            est = getattr(sf, cls)(categorical=list(cats), dense=["d0"], buckets=1024)
            X_fm = table.drop(["y"])
            target = labels if cls == "FMClassifier" else labels.astype(np.float32)
            est.partial_fit(X_fm.slice(0, 7), target[:7], **({"classes": [0, 1]} if cls == "FMClassifier" else {}))
            est.partial_fit(X_fm, target)
        yield f"ready:{cls}", run_fm


def _engine_workloads() -> Iterator[tuple[str, Callable[[], None]]]:
    from streamfit._engine import testing as t
    from streamfit._engine.trainer import Trainer

    rng = np.random.default_rng(0)
    for act in ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Elu", "Softplus"):
        for dtype in (np.float32, np.float64):
            def run(act: str = act, dtype: Any = dtype) -> None:
                for step in ("fused", "forward_backward"):
                    tr = Trainer(t.mlp_model([6, 8, 1], act, dtype=dtype), step=step)
                    for rows in (3, 80):
                        tr.step(rng.standard_normal((rows, 6)).astype(dtype), rng.standard_normal(rows).astype(dtype))
            yield f"engine:mlp[{act},{np.dtype(dtype).name}]", run


def _non_standard(node: onnx.NodeProto) -> bool:
    """Not an operator of the ONNX standard (a contrib op, or a training op ORT registers in ONNX's domain)."""
    return node.domain not in ("", "ai.onnx", "ai.onnx.ml") or not onnx.defs.has(node.op_type, node.domain)


def census(zoo_only: bool = False) -> dict[str, Any]:
    from streamfit._engine.gradient.portable import make_portable, portability_report

    workloads = list(_zoo_workloads())
    if not zoo_only:
        workloads += list(_ready_made_workloads()) + list(_engine_workloads())
    before: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    after: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    models_before: dict[str, set] = collections.defaultdict(set)
    models_after: dict[str, set] = collections.defaultdict(set)
    not_portable: dict[str, dict[str, set]] = {}
    failures: dict[str, str] = {}
    n_graphs = 0
    for label, run in workloads:
        with _Recorder() as rec, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                run()
            except Exception as exc:  # a model the engine refuses: say so, keep counting the rest
                failures[label] = f"{type(exc).__name__}: {str(exc)[:160]}"
        for site, model in rec.graphs:
            n_graphs += 1
            for node in model.graph.node:
                if _non_standard(node):
                    key = f"{node.domain or 'ai.onnx'}:{node.op_type}"
                    before[key][site] += 1
                    models_before[key].add(label)
            portable = make_portable(model)
            for node in portable.graph.node:
                if _non_standard(node):
                    key = f"{node.domain or 'ai.onnx'}:{node.op_type}"
                    after[key][site] += 1
                    models_after[key].add(label)
            for op in portability_report(portable).training_only:
                not_portable.setdefault(label, {}).setdefault(op, set()).add(site)
    return {"workloads": len(workloads), "graphs": n_graphs,
            "before": {k: {"models": len(models_before[k]), "graphs_by_site": dict(v)} for k, v in before.items()},
            "after": {k: {"models": len(models_after[k]), "graphs_by_site": dict(v)} for k, v in after.items()},
            "not_portable": {k: {op: sorted(v) for op, v in ops.items()} for k, ops in not_portable.items()},
            "labels": sorted({label for label, _ in workloads}), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo-only", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = census(args.zoo_only)
    print(f"{result['workloads']} workloads, {result['graphs']} graphs, onnxruntime {ort.__version__}")
    for phase in ("before", "after"):
        print(f"\nnon-standard ops {phase} make_portable (models holding it; graphs by build site)")
        for key, v in sorted(result[phase].items(), key=lambda kv: -kv[1]["models"]):
            print(f"  {key:45s} {v['models']:4d}  {v['graphs_by_site']}")
    fused_bad = {k: v for k, v in result["not_portable"].items()
                 if any(not site.startswith("forward_backward") for sites in v.values() for site in sites)}
    labels = result["labels"]
    print(f"\nafter make_portable, models whose fused graphs (and sparse, loss, update graphs) are portable: "
          f"{len(labels) - len(fused_bad)}/{len(labels)}; forward/backward keeps YieldOp (TrainingAgent) in all")
    for label, ops in fused_bad.items():
        print(f"  needs onnxruntime-training: {label}: {sorted(ops)}")
    for label, err in result["failures"].items():
        print(f"  (refused) {label}: {err}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
