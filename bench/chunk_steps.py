#!/usr/bin/env python
"""Many steps per session run: a chunk trained as one ONNX Scan against one session run per step.

    python bench/chunk_steps.py            # about a minute on 2 cores
    python bench/chunk_steps.py --quick    # smoke run (CI)
    python bench/chunk_steps.py --json docs/benchmarks/data/chunk_steps.json   # the figures as JSON too (plots.py)

For each model (float32, squared error unless said) and rows per step B, the same rows are trained two ways
on two trainers built alike: ``train_chunk(trainer, X, y, batch_size=B)`` over chunks of C rows (C/B steps in
one session run), and ``trainer.step`` on each step's rows (one session run per step, the engine's step path).
A second table does the same at the estimators' face: ``partial_fit_predict`` of the ready-made estimators at
``batch_size=1`` on calls of C rows (C steps per call) against one call per row (the one-row path).
Figures are microseconds per row: the median over interleaved rounds (each round times both paths, starting
from a different one), and the ratio chunk / per-step as the median of the rounds' ratios.  The machine is
shared: only the ratios measured side by side mean much.  Printed with the CPU and whether it has AVX-512.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")):
    sys.path.insert(0, ROOT)  # measure the tree this script lives in
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from _cpu import cpu_model, has_avx512, run_env  # noqa: E402

from streamfit._engine.steps.scan import train_chunk  # noqa: E402
from streamfit._engine.testing import linear_model, mlp_model  # noqa: E402
from streamfit._engine.trainer import Trainer  # noqa: E402

MODELS: dict[str, Callable[[], Trainer]] = {
    "linear d=10 sgd": lambda: Trainer(linear_model(10, seed=0), optimizer="sgd", learning_rate=0.01),
    "logistic d=10 adam": lambda: Trainer(linear_model(10, seed=0), loss="log_loss", optimizer="adam",
                                          learning_rate=0.01),
    "linear d=100 adam": lambda: Trainer(linear_model(100, seed=0), optimizer="adam", learning_rate=0.01),
    "mlp 10-32-1 adam": lambda: Trainer(mlp_model([10, 32, 1], seed=0), optimizer="adam", learning_rate=0.01),
    "mlp 100-256-256-1 sgd": lambda: Trainer(mlp_model([100, 256, 256, 1], seed=0), optimizer="sgd",
                                             learning_rate=0.001),
}


def _data(d: int, n: int, logistic: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = X[:, 0] - X[:, 1]
    return X, ((y > 0) if logistic else y).astype(np.float32)


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(name: str, batch: int, chunk: int, rows: int, rounds: int) -> dict[str, float]:
    make = MODELS[name]
    a, b = make(), make()
    d = a.model_inputs[0].shape[1]
    X, y = _data(int(d), rows, "logistic" in name)
    starts = range(0, rows - chunk + 1, chunk)

    def chunked() -> None:
        for s in starts:
            train_chunk(a, X[s:s + chunk], y[s:s + chunk], batch_size=batch)

    def stepped() -> None:
        for s in range(0, len(starts) * chunk, batch):
            b.step(X[s:s + batch], y[s:s + batch])

    chunked(), stepped()  # warm up: sessions built, buffers bound
    n = len(starts) * chunk
    per: dict[str, list[float]] = {"chunk": [], "step": [], "ratio": []}
    for r in range(rounds):
        order = [("chunk", chunked), ("step", stepped)][:: 1 if r % 2 == 0 else -1]
        got = {k: _time(fn) / n * 1e6 for k, fn in order}
        per["chunk"].append(got["chunk"])
        per["step"].append(got["step"])
        per["ratio"].append(got["chunk"] / got["step"])
    return {k: statistics.median(v) for k, v in per.items()}


ESTIMATORS: dict[str, Callable[[], Any]] = {
    "LogisticRegression()": lambda: _est("LogisticRegression"),
    "LogisticRegression(sgd, 0.01)": lambda: _est("LogisticRegression", optimizer="sgd", learning_rate="constant",
                                                  eta0=0.01),
    "LinearRegressor()": lambda: _est("LinearRegressor"),
    "MLPClassifier((16,))": lambda: _est("MLPClassifier", hidden_layer_sizes=(16,)),
}


def _est(name: str, **params: Any) -> Any:
    import streamfit

    return getattr(streamfit, name)(batch_size=1, random_state=0, **params)


def measure_estimator(name: str, chunk: int, rows: int, rounds: int) -> dict[str, float]:
    a, b = ESTIMATORS[name](), ESTIMATORS[name]()
    X, y = _data(9, rows, "Regressor" not in name)
    kw = {"classes": [0.0, 1.0]} if "Regressor" not in name else {}
    a.partial_fit_predict(X[:chunk], y[:chunk], **kw)
    b.partial_fit_predict(X[:1], y[:1], **kw)
    for i in range(1, chunk):
        b.partial_fit_predict(X[i:i + 1], y[i:i + 1])
    starts = range(0, rows - chunk + 1, chunk)

    def chunked() -> None:
        for s in starts:
            a.partial_fit_predict(X[s:s + chunk], y[s:s + chunk])

    def per_row() -> None:
        for i in range(len(starts) * chunk):
            b.partial_fit_predict(X[i:i + 1], y[i:i + 1])

    n = len(starts) * chunk
    per: dict[str, list[float]] = {"chunk": [], "step": [], "ratio": []}
    for r in range(rounds):
        order = [("chunk", chunked), ("step", per_row)][:: 1 if r % 2 == 0 else -1]
        got = {k: _time(fn) / n * 1e6 for k, fn in order}
        per["chunk"].append(got["chunk"])
        per["step"].append(got["step"])
        per["ratio"].append(got["chunk"] / got["step"])
    return {k: statistics.median(v) for k, v in per.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one small case")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", help="only these models (comma-separated names of MODELS and ESTIMATORS)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON (bench/plots.py draws it)")
    args = parser.parse_args()
    env = run_env()
    print(f"CPU: {cpu_model()} ({'AVX-512' if has_avx512() else 'no AVX-512'}), {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}")
    wanted = None if args.models is None else set(args.models.split(","))
    cases = [("linear d=10 sgd", 1, 256, 512)] if args.quick else [
        (m, bsz, c, rows) for m in MODELS for bsz, c, rows in
        ((1, 16, 2048), (1, 128, 2048), (1, 1024, 4096), (32, 1024, 8192))
        if not (m.startswith("mlp 100") and bsz == 1 and c == 1024) and (wanted is None or m in wanted)]
    rounds = 1 if args.quick else args.rounds
    doc: dict[str, Any] = {"env": env, "config": {"quick": args.quick, "rounds": rounds}, "steps": [],
                           "estimators": []}
    print(f"{'model':24s} {'B':>3s} {'chunk rows':>10s} {'chunk us/row':>13s} {'per-step us/row':>16s} {'ratio':>7s}")
    for name, bsz, chunk, rows in cases:
        m = measure(name, bsz, chunk, rows, rounds)
        print(f"{name:24s} {bsz:3d} {chunk:10d} {m['chunk']:13.2f} {m['step']:16.2f} {m['ratio']:7.2f}")
        doc["steps"].append({"model": name, "batch": bsz, "chunk": chunk, "rows": rows, "chunk_us_per_row": m["chunk"],
                             "step_us_per_row": m["step"], "ratio": m["ratio"]})
    print()
    print("ready-made estimators, batch_size=1: partial_fit_predict of C rows against one call per row")
    print(f"{'estimator':30s} {'C':>5s} {'chunk us/row':>13s} {'per-call us/row':>16s} {'ratio':>7s}")
    est_cases = [("LogisticRegression()", 256, 512)] if args.quick else [
        (name, c, 4096) for name in ESTIMATORS for c in (16, 256, 1024) if wanted is None or name in wanted]
    for name, chunk, rows in est_cases:
        m = measure_estimator(name, chunk, rows, rounds)
        print(f"{name:30s} {chunk:5d} {m['chunk']:13.2f} {m['step']:16.2f} {m['ratio']:7.2f}")
        doc["estimators"].append({"estimator": name, "chunk": chunk, "rows": rows, "chunk_us_per_row": m["chunk"],
                                  "per_call_us_per_row": m["step"], "ratio": m["ratio"]})
    if args.json:
        doc["env"]["loadavg_end"] = list(os.getloadavg())
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
