"""String hashing: onnxruntime's MurmurHash3 session (the old path) against the numpy hash (the new), and the
end-to-end ``partial_fit`` of a hashed ``LogisticRegression`` on string columns, old tree against new.

1. One string column of N values (8-24 ASCII characters, all distinct), N = 1, 32, 1024, 65536: a session
   running ``com.microsoft.MurmurHash3`` on ``to_numpy()`` of the column (what training ran before) against
   :func:`streamfit.features._murmur.murmur3_arrow` on the Arrow column.
2. ``Hashed.encode`` of 1 and 20 such columns, old tree against new (each in a child process).
3. ``LogisticRegression(categorical=20 string columns, buckets=2**18).partial_fit`` at batch 1, 32, 1024: rows/s
   and RSS growth, old tree against new (children), the old tree checked out with ``git worktree`` at
   ``--baseline`` (default: the commit before the numpy hash).

Times are this thread's (or process's) CPU time, the best of ``--rounds`` rounds: on shared cores, other
processes' load moves wall time far more than CPU time.  Old and new children alternate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: main before the numpy string hash: Hashed.encode ran a MurmurHash3 session on the strings of batches > 32 rows
BASELINE = "d5bf81e"


def _best(fn: Callable[[], Any], reps: int, rounds: int, clock: Callable[[], float] = time.thread_time) -> float:
    """Seconds per call: the best of ``rounds`` rounds of ``reps`` calls."""
    best = float("inf")
    for _ in range(rounds):
        t = clock()
        for _ in range(reps):
            fn()
        best = min(best, (clock() - t) / reps)
    return best


def _strings(n: int, seed: int) -> Any:
    """n random strings of 8-24 lowercase letters (distinct, in practice)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 25, n)
    letters = rng.integers(97, 123, int(lengths.sum())).astype(np.uint8).tobytes().decode()
    ends = np.cumsum(lengths)
    return pa.array([letters[e - k:e] for e, k in zip(ends.tolist(), lengths.tolist())])


def _session(seed: int) -> Any:
    """A session running the kernel alone, as ``streamfit.features._murmur.murmur3`` did before."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("MurmurHash3", ["x"], ["y"], domain="com.microsoft", seed=seed, positive=1)
    graph = helper.make_graph([node], "murmur3", [helper.make_tensor_value_info("x", TensorProto.STRING, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT32, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def hash_column(sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """Section 1, in this process: session against numpy on one column (the session leaks: fresh strings only)."""
    sys.path.insert(0, ROOT)
    from streamfit.features._murmur import murmur3_arrow

    sess = _session(7)
    out = []
    for n in sizes:
        col = _strings(n, n)
        reps = max(2, 20_000 // n)
        assert sess.run(None, {"x": col.to_numpy(zero_copy_only=False)})[0].tolist() == murmur3_arrow(col, 7).tolist()
        old = _best(lambda: sess.run(None, {"x": col.to_numpy(zero_copy_only=False)}), reps, rounds)
        new = _best(lambda: murmur3_arrow(col, 7), reps, rounds)
        out.append({"n": n, "session_us": old * 1e6, "numpy_us": new * 1e6})
    return out


def _child_encode(sizes: list[int], columns: int, rounds: int) -> list[dict[str, Any]]:
    import streamfit
    from streamfit.features import Hashed
    from streamfit.features._encoders import _hash_str

    assert os.path.dirname(os.path.dirname(streamfit.__file__)) == os.environ["PYTHONPATH"], streamfit.__file__

    names = [f"c{j}" for j in range(columns)]
    enc = Hashed(names, buckets=1 << 18)
    out = []
    for n in sizes:
        cols = [_strings(n, 1000 * j + n) for j in range(columns)]
        reps = max(2, 20_000 // (n * columns))

        def encode() -> None:
            _hash_str.cache_clear()  # distinct values: no hash of a value seen before
            enc.encode(enc.new_state(), cols)

        t = _best(encode, reps, rounds)
        out.append({"n": n, "columns": columns, "us": t * 1e6})
    return out


def _child_fit(batch: int, rows: int, rounds: int) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa

    import streamfit
    from streamfit import LogisticRegression

    from _common import rss_mb  # after streamfit: _common puts its own tree first on sys.path

    assert os.path.dirname(os.path.dirname(streamfit.__file__)) == os.environ["PYTHONPATH"], streamfit.__file__
    names = [f"c{j}" for j in range(20)]
    rng = np.random.default_rng(0)
    n_batches = max(rows // batch, 4)
    # distinct strings in every batch of every round (as a stream of ids, sessions, urls would have)
    tables = [[pa.table({c: _strings(batch, 10**7 * r + 100_000 * j + b) for j, c in enumerate(names)})
               for b in range(n_batches)] for r in range(rounds + 1)]
    ys = [rng.integers(0, 2, batch) for _ in range(n_batches)]
    model = LogisticRegression(categorical=names, buckets=1 << 18, optimizer="ftrl", batch_size=batch,
                               random_state=0)
    model.partial_fit(tables[0][0], ys[0], classes=[0, 1])
    for tb, y in zip(tables[0], ys):  # warm up
        model.partial_fit(tb, y)
    rss0 = rss_mb()
    best = float("inf")
    for r in range(1, rounds + 1):
        t = time.process_time()
        for tb, y in zip(tables[r], ys):
            model.partial_fit(tb, y)
        best = min(best, (time.process_time() - t) / (n_batches * batch))
    return {"batch": batch, "rows_per_s": 1 / best, "rss_growth_mb": rss_mb() - rss0,
            "batches": n_batches * rounds}


def _child(tree: str, job: dict[str, Any]) -> Any:
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(job)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(f"child {job} in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _checkout(rev: str, where: str) -> str:
    path = os.path.join(where, "old")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", path, rev], check=True, capture_output=True)
    return path


def encode_section(old: str, baseline: str, sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """Section 2: ``Hashed.encode`` of 1 and 20 columns in children of the old tree and the new, printed."""
    print(f"\n== Hashed.encode of N rows x C string columns of distinct values: old tree ({baseline}) vs new")
    print(f"{'N':>7} {'C':>3} {'old us':>10} {'new us':>10} {'speed-up':>9}")
    rows = []
    for columns in (1, 20):
        job = {"kind": "encode", "sizes": sizes, "columns": columns, "rounds": rounds}
        o, n = _child(old, job), _child(ROOT, job)
        for a, b in zip(o, n):
            print(f"{a['n']:>7} {columns:>3} {a['us']:>10.1f} {b['us']:>10.1f} {a['us'] / b['us']:>8.2f}x")
            rows.append({"n": a["n"], "columns": columns, "old_us": a["us"], "new_us": b["us"]})
    return rows


def fit_section(old: str, batches: list[int], rows_per_round: int, rounds: int) -> list[dict[str, Any]]:
    """Section 3: ``partial_fit`` of the hashed model in children of the old tree and the new, printed."""
    print("\n== LogisticRegression(categorical=20 string columns, FTRL, 2**18 buckets).partial_fit, "
          "distinct strings per batch")
    print(f"{'batch':>6} {'old rows/s':>11} {'new rows/s':>11} {'speed-up':>9} {'old RSS +MB':>12} "
          f"{'new RSS +MB':>12} {'batches':>8}")
    out = []
    for batch in batches:
        rows = min(rows_per_round, 2000 if batch == 1 else 10**9)
        job = {"kind": "fit", "batch": batch, "rows": rows, "rounds": min(rounds, 3)}
        o, n = _child(old, job), _child(ROOT, job)
        print(f"{batch:>6} {o['rows_per_s']:>11.0f} {n['rows_per_s']:>11.0f} "
              f"{n['rows_per_s'] / o['rows_per_s']:>8.2f}x {o['rss_growth_mb']:>12.1f} "
              f"{n['rss_growth_mb']:>12.1f} {n['batches']:>8}")
        out.append({"batch": batch, "old_rows_per_s": o["rows_per_s"], "new_rows_per_s": n["rows_per_s"],
                    "old_rss_growth_mb": o["rss_growth_mb"], "new_rss_growth_mb": n["rss_growth_mb"],
                    "batches": n["batches"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the old tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20_480, help="rows per round of each partial_fit run")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/plots.py draws them)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job = json.loads(args.child)
        kind = job.pop("kind")
        print(json.dumps(_child_encode(**job) if kind == "encode" else _child_fit(**job)))
        return
    sys.path.insert(0, HERE)
    from _cpu import cpu_model, run_env

    env = run_env()
    sizes = [1, 32] if args.quick else [1, 32, 1024, 65536]
    rounds = 1 if args.quick else args.rounds
    rows = args.rows if not args.quick else 256
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; times: CPU time, best of {rounds} rounds")
    print("\n== hashing one string column of N distinct values (8-24 chars): session (old) vs numpy (new)")
    print(f"{'N':>7} {'session us':>11} {'numpy us':>10} {'numpy/session speed':>20}")
    column = hash_column(sizes, rounds)
    for r in column:
        print(f"{r['n']:>7} {r['session_us']:>11.1f} {r['numpy_us']:>10.1f} {r['session_us'] / r['numpy_us']:>19.2f}x")
    baseline = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.baseline], check=True,
                              capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="streamfit-bench-hashing-") as tmp:  # the old tree: a worktree there
        old = _checkout(args.baseline, tmp)
        try:
            encode = encode_section(old, args.baseline, sizes, rounds)
            fit = fit_section(old, [1, 32, 1024] if not args.quick else [32], rows, rounds)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old], capture_output=True)
    if args.json:
        doc = {"env": {**env, "loadavg_end": list(os.getloadavg())},
               "config": {"quick": args.quick, "rounds": rounds, "rows": rows, "baseline": baseline, "sizes": sizes},
               "hash_column": column, "encode": encode, "fit": fit}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
