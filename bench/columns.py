"""The column plan's cost per row: one X from ``features=`` against named inputs (``inputs=``), with a hashed
categorical column (dictionary and plain strings) and a vocabulary, on the same record batches.

    python bench/columns.py [--quick] [--json docs/benchmarks/data/columns.json]

Best of interleaved rounds, ns per row to turn a 65,536-row record batch of 20 float32 columns (+ a
categorical column) into training batches of 2048 rows; ratios against ``features=`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import os
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, also when imported as a module
from _cpu import cpu_model, run_env  # noqa: E402
import pyarrow as pa

from streamfit._engine.prepare.model import ModelInput
from streamfit._stream.batching import Rebatcher
from streamfit._columns.plan import ColumnPlan
from streamfit.features import Hashed, Vocabulary
from streamfit.sources._base import SourceBatch




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smoke run: small batches, few rounds")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/plots.py draws them)")
    args = ap.parse_args()
    env = run_env()
    n, d, rounds = (4096, 20, 2) if args.quick else (65536, 20, 15)
    rng = np.random.default_rng(0)
    cols = {f"x{j}": rng.standard_normal(n).astype(np.float32) for j in range(d)}
    cols["y"] = rng.standard_normal(n).astype(np.float32)
    cities = np.array([f"city-{i}" for i in range(500)])[rng.integers(0, 500, n)]
    feats = [f"x{j}" for j in range(d)]
    plain = pa.record_batch({**cols, "city": pa.array(cities)})
    dictionary = pa.record_batch({**cols, "city": pa.array(cities).dictionary_encode()})
    x = [ModelInput("X", np.dtype(np.float32), ("N", d))]
    xi = x + [ModelInput("ids", np.dtype(np.int64), ("N",))]
    cases = {
        "features= (one X)": (plain, lambda: Rebatcher(2048, ColumnPlan(features=feats), ring_size=6)),
        "inputs= {X: 20 columns}": (plain, lambda: Rebatcher(2048, ColumnPlan(inputs={"X": feats}, model_inputs=x), ring_size=6)),
        "+ Hashed(dictionary city)": (dictionary, lambda: Rebatcher(2048, ColumnPlan(inputs={"X": feats, "ids": Hashed("city", 1 << 16)}, model_inputs=xi), ring_size=6)),
        "+ Hashed(string city)": (plain, lambda: Rebatcher(2048, ColumnPlan(inputs={"X": feats, "ids": Hashed("city", 1 << 16)}, model_inputs=xi), ring_size=6)),
        "+ Vocabulary(string city)": (plain, lambda: Rebatcher(2048, ColumnPlan(inputs={"X": feats, "ids": Vocabulary("city")}, model_inputs=xi), ring_size=6)),
    }
    live = {name: (SourceBatch(batch, lambda r: {"row": r}), make()) for name, (batch, make) in cases.items()}
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, (sb, rb) in live.items():
            t = time.perf_counter()
            for _tb in rb.push(sb):
                pass
            best[name] = min(best[name], time.perf_counter() - t)
    print(f"CPU: {cpu_model()}; {n} rows x {d} float32 columns per record batch, best of {rounds} interleaved rounds")
    base = best["features= (one X)"]
    for name, seconds in best.items():
        print(f"  {name:28s} {seconds / n * 1e9:7.1f} ns/row   x{seconds / base:.2f} vs features=")
    if args.json:
        doc = {"env": {**env, "loadavg_end": list(os.getloadavg())},
               "config": {"quick": args.quick, "rows": n, "columns": d, "rounds": rounds, "batch": 2048},
               "cases": [{"case": name, "ns_per_row": seconds / n * 1e9, "vs_features": seconds / base}
                         for name, seconds in best.items()]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
