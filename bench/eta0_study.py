#!/usr/bin/env python
"""Adam's default learning rate (``eta0="auto"``) on more streams than ``bench/perrow.py``'s three.

    python bench/eta0_study.py               # 17 streams (those with numeric features), 5 rates, ~1 min
    python bench/eta0_study.py --quick       # the first 400 rows of 4 streams (smoke run)
    python bench/eta0_study.py --rates 0.005,0.01

The ready-made ``LogisticRegression`` and ``LinearRegressor`` with their defaults (Adam, running
standardization, an L2 penalty of 1e-4) at ``batch_size=1`` (or ``--batch-size``), rows given to ``partial_fit_predict`` in chunks of
256 (each prediction made before its row's step), at each rate of ``--rates``, beside River's defaults
(``StandardScaler() | LogisticRegression()`` / ``LinearRegression()``, ``predict_one`` then ``learn_one``) on
the same rows.  The streams: River's bundled ones that fit a linear model (Bananas, Phishing, Shuttle,
TrumpApproval, ChickWeights, WaterFlow, AirlinePassengers) and its generators (Agrawal, Hyperplane, SEA, Sine,
Mixed, RandomRBF, Friedman, FriedmanDrift, Planes2D, Mv), numeric features only.  A rate meets a stream at
issue 20's tolerance: progressive accuracy >= River's - 0.005, MAE <= 1.05x River's.  The table ends with how
many streams each rate meets: what ``Adam.auto_eta0`` should be chosen from.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from typing import Any, Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")) and ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _cpu import cpu_model  # noqa: E402
from perrow import Stream, chunked_pass, river_pass  # noqa: E402  (the same passes as bench/perrow.py's)

#: issue 20's tolerance against River's metric
ACCURACY_GAP, MAE_FACTOR = 0.005, 1.05
CHUNK = 256


def _streams() -> list[tuple[str, bool, Callable[[], Any], int | None]]:
    """(name, regression?, the River dataset, rows kept) of each stream."""
    from river import datasets
    from river.datasets import synth

    n = 10_000
    return [
        ("Bananas", False, datasets.Bananas, None),
        ("Phishing", False, datasets.Phishing, None),
        ("Shuttle", False, datasets.Shuttle, 20_000),
        ("Agrawal", False, lambda: synth.Agrawal(classification_function=0, seed=42), n),
        ("Hyperplane", False, lambda: synth.Hyperplane(seed=42, n_features=10), n),
        ("SEA", False, lambda: synth.SEA(seed=42), n),
        ("Sine", False, lambda: synth.Sine(seed=42), n),
        ("Mixed", False, lambda: synth.Mixed(seed=42), n),
        ("RandomRBF", False, lambda: synth.RandomRBF(seed_model=42, seed_sample=42, n_classes=2), n),
        ("TrumpApproval", True, datasets.TrumpApproval, None),
        ("ChickWeights", True, datasets.ChickWeights, None),
        ("WaterFlow", True, datasets.WaterFlow, None),
        ("AirlinePassengers", True, datasets.AirlinePassengers, None),
        ("Friedman", True, lambda: synth.Friedman(seed=42), n),
        ("FriedmanDrift", True, lambda: synth.FriedmanDrift(drift_type="gra", position=(3000, 7000), seed=42), n),
        ("Planes2D", True, lambda: synth.Planes2D(seed=42), n),
        ("Mv", True, lambda: synth.Mv(seed=42), n),
    ]


def load(name: str, regression: bool, make: Callable[[], Any], limit: int | None) -> Stream:
    """The stream's rows with their numeric features only (the same dicts for River), in River's order."""
    raw = list(itertools.islice(make(), limit))
    keys = [k for k, v in raw[0][0].items() if isinstance(v, (int, float, bool, np.number))]
    rows = [({k: float(x[k]) for k in keys}, float(t) if regression else bool(t)) for x, t in raw]
    X = np.array([[x[k] for k in keys] for x, _ in rows], np.float32)
    y = np.array([t for _, t in rows], np.float64 if regression else bool)
    return Stream(name, regression, rows, X, y)


def ours_metric(s: Stream, eta0: float, batch_size: int = 1) -> float:
    """The ready-made model's defaults but ``eta0`` and ``batch_size``, predict then learn (chunks of 256 rows)."""
    import streamfit as sf

    def make() -> Any:
        return (sf.LinearRegressor(batch_size=batch_size, eta0=eta0) if s.regression
                else sf.LogisticRegression(batch_size=batch_size, eta0=eta0))

    return chunked_pass(s, make, CHUNK)[0]


def meets(s: Stream, ours: float, river: float) -> bool:
    return ours <= MAE_FACTOR * river if s.regression else ours >= river - ACCURACY_GAP


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 400 rows of 4 streams")
    parser.add_argument("--rates", default="0.001,0.002,0.005,0.01,0.02")
    parser.add_argument("--batch-size", type=int, default=1, help="streamfit's batch_size (River learns row by row)")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    specs = _streams()
    if args.quick:
        specs = [sp[:3] + (400,) for sp in specs if sp[0] in ("Bananas", "SEA", "TrumpApproval", "Friedman")]
    import streamfit as sf

    auto = sf.LogisticRegression(batch_size=args.batch_size)._auto_eta0()
    print(f"# bench/eta0_study.py: CPU {cpu_model()}; batch_size={args.batch_size} (eta0='auto' is {auto:.4g} there), "
          f"chunks of {CHUNK} rows; met: accuracy >= River's - {ACCURACY_GAP}, MAE <= {MAE_FACTOR}x River's")
    head = f"{'stream':<18}{'rows':>7}{'metric':>9}{'River':>9}" + "".join(f"{r:>12g}" for r in rates)
    print(head)
    met = dict.fromkeys(rates, 0)
    used = 0
    t0 = time.perf_counter()
    for name, regression, make, limit in specs:
        s = load(name, regression, make, limit)
        if not s.X.shape[1]:
            print(f"{name:<18}{len(s.rows):>7}  skipped: no numeric feature")
            continue
        river = river_pass(s)
        used += 1
        cells = []
        for r in rates:
            value = ours_metric(s, r, args.batch_size)
            ok = meets(s, value, river)
            met[r] += ok
            cells.append(f"{value:>10.4f}{' ' if ok else '!'} ")
        print(f"{name:<18}{len(s.rows):>7}{'MAE' if regression else 'accuracy':>9}{river:>9.4f}" + "".join(cells))
    print(f"{'streams met':<43}" + "".join(f"{met[r]:>9d}/{used:<2d}" for r in rates))
    print(f"('!': missed; {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
