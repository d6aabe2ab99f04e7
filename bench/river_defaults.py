#!/usr/bin/env python
"""Defaults out of the box: streamfit's ready-made models, default parameters, against River's on River's streams.

    python bench/river_defaults.py            # the three streams in full, about 15 s on 2 cores
    python bench/river_defaults.py --quick    # the first 300 rows of each (smoke run)

Each bundled stream of River (TrumpApproval: regression, an uncentered target near 43 and features such
as a date ordinal near 736000; Phishing and Bananas: binary classification) is read row by row, batch 1,
predict then learn (progressive validation).  River's reference is its own default pipeline,
``StandardScaler() | LinearRegression()`` (MAE) or ``StandardScaler() | LogisticRegression()``
(accuracy), run by River's ``predict_one``/``learn_one``.  streamfit's models are built with default
parameters only (``batch_size=32`` among them: its Adam rate is 0.01) and fed each row through its own
``partial_fit_predict`` call, a step of that one row (the prediction its training step makes before
updating).  ``bench/perrow.py`` and ``bench/eta0_study.py`` set ``batch_size=1`` instead.  Target: within 5 % of River's metric (MAE <= 1.05 x River's, accuracy >= 0.95 x River's);
the table says met/MISSED per stream and model.  The "no scaling" rows are the former defaults
(``standardize=False, standardize_target=False``), to show what the scalers are for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, also when imported as a module
from _cpu import cpu_model  # noqa: E402

TOLERANCE = 0.05


@dataclass(frozen=True)
class Stream:
    """One of River's bundled streams as arrays, in River's row order."""

    name: str
    task: str  # "regression" or "classification"
    rows: list[tuple[dict[str, Any], Any]]
    X: np.ndarray
    y: np.ndarray


def load(name: str, limit: int | None = None) -> Stream:
    from river import datasets

    rows = list(getattr(datasets, name)())[:limit]
    keys = list(rows[0][0])
    X = np.array([[float(x[k]) for k in keys] for x, _ in rows])
    y = np.array([t for _, t in rows])
    task = "regression" if name == "TrumpApproval" else "classification"
    return Stream(name, task, rows, X, y.astype(np.float64) if task == "regression" else y)


def river_metric(stream: Stream) -> float:
    """River's default pipeline, progressive MAE or accuracy."""
    from river import linear_model, metrics, preprocessing

    if stream.task == "regression":
        model, metric = preprocessing.StandardScaler() | linear_model.LinearRegression(), metrics.MAE()
    else:
        model, metric = preprocessing.StandardScaler() | linear_model.LogisticRegression(), metrics.Accuracy()
    for x, y in stream.rows:
        metric.update(y, model.predict_one(x))
        model.learn_one(x, y)
    return float(metric.get())


def streamfit_metric(make: Callable[[], Any], stream: Stream) -> float:
    """A streamfit estimator, batch 1, predict then learn: progressive MAE or accuracy."""
    est = make()
    X, y = stream.X, stream.y
    if stream.task == "regression":
        pred = np.array([est.partial_fit_predict(X[i:i + 1], y[i:i + 1])[0] for i in range(len(X))])
        return float(np.mean(np.abs(pred - y)))
    classes = np.unique(y)
    hits = 0
    for i in range(len(X)):
        proba = est.partial_fit_predict(X[i:i + 1], y[i:i + 1], classes=classes)
        hits += int(classes[int(np.argmax(proba[0]))] == y[i])
    return hits / len(X)


def met(task: str, ours: float, river: float) -> bool:
    return ours <= (1 + TOLERANCE) * river if task == "regression" else ours >= (1 - TOLERANCE) * river


def models(task: str) -> dict[str, Callable[[], Any]]:
    import streamfit as sf

    if task == "regression":
        return {"LinearRegressor()": sf.LinearRegressor, "MLPRegressor()": sf.MLPRegressor,
                "LinearRegressor (no scaling)": lambda: sf.LinearRegressor(standardize=False,
                                                                           standardize_target=False)}
    return {"LogisticRegression()": sf.LogisticRegression, "MLPClassifier()": sf.MLPClassifier,
            "LogisticRegression (no scaling)": lambda: sf.LogisticRegression(standardize=False)}




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 300 rows of each stream")
    parser.add_argument("--json", metavar="PATH", help="also write every figure here (bench/plots.py draws it)")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    limit = 300 if args.quick else None
    print(f"# CPU: {cpu_model()}, Python {sys.version.split()[0]}; batch 1, "
          f"predict then learn; target: within {TOLERANCE:.0%} of River's default pipeline")
    print(f"{'stream':<14} {'rows':>5} {'metric':<9} {'model':<32} {'streamfit':>9} {'River':>8} {'ratio':>6}  "
          f"{'verdict':<7} {'s':>5}")
    for name in ("TrumpApproval", "Phishing", "Bananas"):
        stream = load(name, limit)
        reference = river_metric(stream)
        metric = "MAE" if stream.task == "regression" else "accuracy"
        for label, make in models(stream.task).items():
            t0 = time.perf_counter()
            ours = streamfit_metric(make, stream)
            verdict = "met" if met(stream.task, ours, reference) else "MISSED"
            seconds = time.perf_counter() - t0
            print(f"{name:<14} {len(stream.X):>5} {metric:<9} {label:<32} {ours:>9.4f} {reference:>8.4f} "
                  f"{ours / reference:>6.3f}  {verdict:<7} {seconds:>5.1f}")
            rows.append({"stream": name, "rows": len(stream.X), "metric": metric, "model": label,
                         "streamfit": ours, "river": reference, "verdict": verdict, "seconds": seconds})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": {"cpu_model": cpu_model(), "python": sys.version.split()[0],
                               "loadavg_end": list(os.getloadavg())},
                       "config": {"quick": args.quick, "tolerance": TOLERANCE}, "results": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
