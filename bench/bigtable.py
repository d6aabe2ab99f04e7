"""Big embedding tables: step time of a 2^24-row table against a 2^16-row one (same batch), where the time
goes, the hardware floor, and memory.

A table of ``rows x 16`` float32 read by ``Gather`` with 20 ids per row (batch 1024: 20480 ids), trained
row-sparsely (AdaGrad and SGD).  Rounds are interleaved (small, big, small, big, ...) and the median step
is reported, with its parts: staging the touched rows (``gather``: distinct ids, copies of rows and state),
the fused graph run, and the rows update (``update``: the update graph and the write-back).  The floor is
bare numpy on the same ids: distinct ids, gather of the rows (and state), an add, scatter back.  RSS:
growth of a fresh process that builds a trainer from an external-data file and trains, per table byte.

    python bench/bigtable.py [--big-bits 24] [--small-bits 16] [--rounds 7] [--steps 20] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from _cpu import cpu_model, run_env  # noqa: E402

DIM, FIELDS, BATCH = 16, 20, 1024


def table_model(rows: int, dim: int = DIM) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.zeros((rows, dim), np.float32), "E"),
             numpy_helper.from_array(np.full((dim, 1), 0.1, np.float32), "c"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["r"]),
             helper.make_node("ReduceSum", ["r", "ax"], ["p"], keepdims=0), helper.make_node("MatMul", ["p", "c"], ["Y"])]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", FIELDS])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def thp() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def anon_huge_mib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages"):
                return int(line.split()[1]) // 1024
    return 0


class Timed:
    """Wraps a bound method, adding its wall time to ``total``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.total = fn, 0.0

    def __call__(self, *a: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fn(*a)
        self.total += time.perf_counter() - t0
        return out


def step_times(bits_list: tuple[int, ...], optimizer: str, rounds: int, steps: int) -> dict[int, dict[str, float]]:
    from streamfit._engine.trainer import Trainer

    rng = np.random.default_rng(0)
    trainers, data, parts = {}, {}, {}
    y = (rng.random(BATCH) < 0.3).astype(np.float32)
    for bits in bits_list:
        t = Trainer(table_model(1 << bits), loss="log_loss", optimizer=optimizer, learning_rate=0.05, sparse=True)
        data[bits] = [rng.integers(0, 1 << bits, (BATCH, FIELDS)) for _ in range(16)]
        for k in range(3):
            t.step({"ids": data[bits][k]}, y)
        sp = t._sparse
        parts[bits] = {"gather": Timed(sp.gather), "update": Timed(sp.update)}
        sp.gather, sp.update = parts[bits]["gather"], parts[bits]["update"]  # type: ignore[method-assign]
        trainers[bits] = t
    times: dict[int, list[dict[str, float]]] = {b: [] for b in bits_list}
    for _ in range(rounds):
        for bits in bits_list:
            for p in parts[bits].values():
                p.total = 0.0
            t0 = time.perf_counter()
            for k in range(steps):
                trainers[bits].step({"ids": data[bits][k % 16]}, y)
            total = (time.perf_counter() - t0) / steps
            g, u = parts[bits]["gather"].total / steps, parts[bits]["update"].total / steps
            times[bits].append({"step": total, "gather": g, "update": u, "rest": total - g - u})
    out = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in times.items()}
    for b, rs in times.items():  # the fastest round: the least disturbed by other processes on a shared machine
        out[b]["min_step"] = min(r["step"] for r in rs)
    return out


def floor_times(bits_list: tuple[int, ...], arrays: int, rounds: int) -> dict[int, dict[str, float]]:
    """Bare numpy, same ids: distinct ids (one sort of packed id/position keys, as the engine; or unsorted,
    by a per-row scratch array), then gather, add, scatter of ``arrays`` row arrays (1: the table;
    2: table and AdaGrad state), rows copied as opaque items."""
    from streamfit._engine.prepare.large_initializers import table_array

    rng = np.random.default_rng(0)
    out = {}
    n = BATCH * FIELDS
    bits_pos = (n - 1).bit_length()
    for bits in bits_list:
        rows = 1 << bits
        tabs = [table_array((rows, DIM), np.float32) for _ in range(arrays)]
        for t in tabs:
            t += 0.01  # touch every page
        items = [t.view(np.dtype((np.void, DIM * 4))).reshape(-1) for t in tabs]
        marks = np.zeros(rows, np.int64)
        ids = [rng.integers(0, rows, n) for _ in range(16)]
        ar = np.arange(n)
        res: dict[str, list[float]] = {"sorted": [], "scratch": []}

        def rows_update(u: np.ndarray) -> None:
            for t, it in zip(tabs, items):
                b = np.take(it, u).view(np.float32)
                b += 1e-3
                np.put(it, u, b.view(it.dtype))

        for r in range(rounds * 20):
            i = ids[r % 16]
            t0 = time.perf_counter()
            keys = np.sort((i << bits_pos) | ar) >> bits_pos
            first = np.empty(n, bool)
            first[0] = True
            np.not_equal(keys[1:], keys[:-1], out=first[1:])
            rows_update(keys[first])
            t1 = time.perf_counter()
            marks[i] = ar
            rows_update(i[marks[i] == ar])
            t2 = time.perf_counter()
            res["sorted"].append(t1 - t0)
            res["scratch"].append(t2 - t1)
        out[bits] = {k: statistics.median(v) for k, v in res.items()}
        del tabs, items, marks
    return out


_RSS_CHILD = """
import json, sys
import numpy as np
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
path, rows, optimizer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from streamfit._engine.trainer import Trainer
base = status("VmRSS")
trainer = Trainer(path, loss="log_loss", optimizer=optimizer, learning_rate=0.05, sparse=True)
built = status("VmRSS") - base
rng = np.random.default_rng(0)
y = (rng.random(1024) < 0.3).astype(np.float32)
for _ in range(10):
    trainer.step({"ids": rng.integers(0, rows, (1024, 20))}, y)
trained = status("VmRSS") - base
peak = status("VmHWM") - base
state = trainer.state_dict()
snap = status("VmHWM") - base
del state
print(json.dumps({"built": built, "trained": trained, "peak": peak, "state_dict_peak": snap}))
"""


def rss(bits: int, optimizer: str) -> dict[str, float]:
    rows = 1 << bits
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(table_model(rows), path, save_as_external_data=True, location="m.data", size_threshold=1024)
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, path, str(rows), optimizer], capture_output=True,
                             text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    table = rows * DIM * 4
    return {k: v / table for k, v in r.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-bits", type=int, default=24)
    parser.add_argument("--small-bits", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/plots.py draws them)")
    args = parser.parse_args()
    if args.quick:
        args.big_bits, args.small_bits, args.rounds, args.steps = 18, 12, 2, 3
    bits = (args.small_bits, args.big_bits)
    doc: dict[str, Any] = {"env": run_env(), "config": {"quick": args.quick, "bits": list(bits), "rounds": args.rounds,
                                                         "steps": args.steps, "dim": DIM, "fields": FIELDS,
                                                         "batch": BATCH},
                           "steps_s": {}, "floor_s": {}, "rss": {}}
    print(f"== bench/bigtable.py on {cpu_model()} ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}); "
          f"transparent huge pages: {thp()}")
    print(f"   table rows x {DIM} float32, batch {BATCH} x {FIELDS} ids; 2^{bits[0]} vs 2^{bits[1]} rows "
          f"({(1 << bits[1]) * DIM * 4 / 2**20:,.0f} MiB); medians of {args.rounds} interleaved rounds of "
          f"{args.steps} steps")
    for optimizer in ("adagrad", "sgd"):
        t = step_times(bits, optimizer, args.rounds, args.steps)
        doc["steps_s"][optimizer] = {str(k): v for k, v in t.items()}
        s, b = t[bits[0]], t[bits[1]]
        print(f"-- {optimizer}: step {s['step'] * 1e3:.2f} ms (2^{bits[0]}) vs {b['step'] * 1e3:.2f} ms (2^{bits[1]}): "
              f"ratio {b['step'] / s['step']:.2f}x (target <= 1.2x); fastest rounds {s['min_step'] * 1e3:.2f} vs "
              f"{b['min_step'] * 1e3:.2f} ms: {b['min_step'] / s['min_step']:.2f}x")
        for part in ("gather", "rest", "update"):
            print(f"     {part:>7}: {s[part] * 1e3:6.2f} ms vs {b[part] * 1e3:6.2f} ms ({b[part] / s[part]:.2f}x)")
        print(f"     AnonHugePages of this process: {anon_huge_mib():,} MiB")
    for arrays, what in ((1, "table (SGD)"), (2, "table + state (AdaGrad)")):
        f = floor_times(bits, arrays, args.rounds)
        doc["floor_s"][what] = {str(k): v for k, v in f.items()}
        s, b = f[bits[0]], f[bits[1]]  # noqa: F841
        print(f"-- floor, bare numpy gather + add + scatter of the distinct rows of one batch, {what}: "
              f"sorted ids {s['sorted'] * 1e3:.2f} vs {b['sorted'] * 1e3:.2f} ms "
              f"(+{(b['sorted'] - s['sorted']) * 1e3:.2f} ms, {b['sorted'] / s['sorted']:.2f}x); "
              f"unsorted (scratch) {s['scratch'] * 1e3:.2f} vs {b['scratch'] * 1e3:.2f} ms")
    for optimizer in ("sgd", "adagrad"):
        r = rss(bits[1], optimizer)
        doc["rss"][optimizer] = r
        print(f"-- RSS growth, fresh process, 2^{bits[1]} table from an external-data file, {optimizer}: built "
              f"{r['built']:.2f}x the table, after 10 steps {r['trained']:.2f}x, peak {r['peak']:.2f}x; "
              f"a state_dict() snapshot on top: peak {r['state_dict_peak']:.2f}x")
    if args.json:
        doc["env"]["loadavg_end"] = list(os.getloadavg())
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
