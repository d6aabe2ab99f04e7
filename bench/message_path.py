"""The path of one record batch (steady state) from a Parquet source to a weight update: the streamfit functions,
files and packages entered on every batch.  Usage: python bench/message_path.py [--quick] [--json PATH]
(ARCHITECTURE.md quotes it; bench/plots.py draws the JSON).  It counts calls, it does not time them."""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, for _cpu
from _cpu import run_env  # noqa: E402

import streamfit  # noqa: E402
from streamfit import LinearRegressor, train_stream_sync  # noqa: E402


def count_calls(batches: int, bs: int) -> collections.Counter[tuple[str, str]]:
    """Calls into streamfit's files (file, function) while a LinearRegressor trains on ``batches`` Parquet batches."""
    root = os.path.dirname(streamfit.__file__)
    d = tempfile.mkdtemp()
    rng = np.random.default_rng(0)
    n = bs * batches
    cols = {f"x{i}": rng.standard_normal(n).astype(np.float32) for i in range(4)}
    cols["y"] = (cols["x0"] * 2).astype(np.float32)
    pq.write_table(pa.table(cols), f"{d}/a.parquet", row_group_size=bs)
    est = LinearRegressor(batch_size=bs)
    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            fn = frame.f_code.co_filename
            if fn.startswith(root):
                seen[(os.path.relpath(fn, root), frame.f_code.co_name)] += 1

    sys.setprofile(prof)
    threading.setprofile(prof)
    train_stream_sync(est, f"parquet://{d}", features=[f"x{i}" for i in range(4)], label="y", batch_size=bs)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    shutil.rmtree(d, ignore_errors=True)
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 10 batches instead of 40")
    ap.add_argument("--json", metavar="PATH", help="also write the counts as JSON (bench/plots.py draws them)")
    args = ap.parse_args(argv)
    env = run_env()
    nb, bs = (10 if args.quick else 40), 256
    seen = count_calls(nb, bs)
    per = {k: v for k, v in seen.items() if v >= nb}   # entered at least once per batch: the steady path
    files = {f for f, _ in per}
    pkgs = {f.split(os.sep)[0] if os.sep in f else "(root)" for f in files}
    print(f"{nb} batches; functions entered every batch: {len(per)}, calls per batch: {sum(per.values())/nb:.0f}, "
          f"files: {len(files)}, packages: {len(pkgs)}")
    for f in sorted(files):
        print("  ", f, sorted({c for ff, c in per if ff == f}))
    if args.json:
        doc = {"env": {**env, "loadavg_end": list(os.getloadavg())},
               "config": {"quick": args.quick, "batches": nb, "batch": bs, "features": 4},
               "functions": len(per), "calls_per_batch": sum(per.values()) / nb, "files": len(files),
               "packages": len(pkgs),
               "per_file": [{"file": f, "functions": sorted(c for ff, c in per if ff == f),
                             "calls_per_batch": sum(v for (ff, _), v in per.items() if ff == f) / nb}
                            for f in sorted(files)]}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
