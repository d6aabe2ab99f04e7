#!/usr/bin/env python
"""The same fused step graphs on onnxruntime-training 1.19.2 and on the newest plain onnxruntime, side by side.

    python bench/ort_versions.py --new-python /path/to/venv-ort-new/bin/python [--quick] [--json out.json]

Run with the project's interpreter (onnxruntime-training 1.19.2): it records one step of each case with the
engine (linear d=100 and MLP 100-256-256-1 ReLU, float32, squared error, plain SGD, batches 1, 32, 2048),
writes the step graph as the engine builds it ("original") and after :func:`make_portable` ("portable"),
then starts two persistent workers -- this interpreter and ``--new-python`` (plain onnxruntime, e.g. 1.31.1
on Python 3.13; ``STREAMFIT_PLAIN_ORT_PYTHON`` is the default) -- that time the graphs the way the engine runs
them: inputs bound once, two IOBindings ping-ponging the weights, one ``run_with_iobinding`` per step, one
intra-op thread below 64 rows and two above (as the Trainer chooses).  The workers import only numpy and
onnxruntime.  Rounds interleave every (worker, graph) pair of a case, starting from a different pair each
round; a figure is the median step time over rounds, a ratio the median of per-round ratios.  The original
small-batch MLP graph does not load on plain onnxruntime (``ReluGrad``): shown as such.
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
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# -- worker: numpy + onnxruntime only ------------------------------------------------------------------

class _Bound:
    """One case graph in one session, bound as the fused step binds it (A->B and B->A)."""

    def __init__(self, case: Path, threads: int) -> None:
        import onnxruntime as ort

        spec = json.loads((case / "case.json").read_text())
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        so.add_session_config_entry("session.set_denormal_as_zero", "1")
        (role, file), = spec["graphs"].items()
        self.sess = ort.InferenceSession(str(case / file), so, providers=["CPUExecutionProvider"])
        load = lambda path, names: dict(zip(names, (np.load(path, allow_pickle=False)[f"a{i}"] for i in range(len(names)))))  # noqa: E731
        state = load(case / "state.npz", spec["state"])
        feeds = load(case / spec["steps"][0]["file"], spec["steps"][0]["names"])
        names = [o.name for o in self.sess.get_outputs()]
        first = dict(zip(names, self.sess.run(names, {**feeds, **{k: v for k, v in state.items()
                                                                  if k in {i.name for i in self.sess.get_inputs()}}})))
        value = ort.OrtValue.ortvalue_from_numpy
        self.keep: list[Any] = []
        sets = [{k: np.array(v) for k, v in state.items()}, {k: np.array(v) for k, v in state.items()}]
        outs = {n: np.empty_like(first[n]) for n in names if not n.endswith("__new")}
        self.io = []
        for src, dst in ((0, 1), (1, 0)):
            io = self.sess.io_binding()
            for k, v in feeds.items():
                self.keep.append(v)
                io.bind_ortvalue_input(k, value(v))
            inputs = {i.name for i in self.sess.get_inputs()}
            for k in state:
                if k in inputs:
                    io.bind_ortvalue_input(k, value(sets[src][k]))
                if f"{k}__new" in names:
                    io.bind_ortvalue_output(f"{k}__new", value(sets[dst][k]))
            for n, a in outs.items():
                io.bind_ortvalue_output(n, value(a))
            self.io.append(io)
        self.keep += [sets, outs]
        self.current = 0

    def steps(self, n: int) -> float:
        run = self.sess.run_with_iobinding
        t0 = time.perf_counter()
        for _ in range(n):
            run(self.io[self.current])
            self.current ^= 1
        return time.perf_counter() - t0


def worker() -> None:
    """Line protocol on stdin/stdout: {"load": dir, "threads": t} -> {"ok"|"error"}; {"time": dir, "steps": n}."""
    import onnxruntime as ort

    print(json.dumps({"onnxruntime": ort.__version__, "python": sys.version.split()[0]}), flush=True)
    bound: dict[str, _Bound] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if "load" in req:
                bound[req["load"]] = _Bound(Path(req["load"]), req["threads"])
                out: dict[str, Any] = {"ok": True}
            else:
                out = {"seconds": bound[req["time"]].steps(req["steps"])}
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(json.dumps(out), flush=True)


class _Worker:
    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the worker died")
        return json.loads(line)

    def ask(self, **req: Any) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=30)


# -- driver (onnxruntime-training) ---------------------------------------------------------------------

def _record(out: Path, batches: list[int]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "portable"))
    from cases import recording, write_case

    from streamfit._engine.testing import linear_model, mlp_model
    from streamfit._engine.trainer import Trainer

    rng = np.random.default_rng(0)
    X = rng.standard_normal((max(batches), 100)).astype(np.float32)
    y = X[:, :3].sum(axis=1).astype(np.float32)
    cases = []
    for model, make in (("linear", lambda: linear_model(100)), ("mlp", lambda: mlp_model([100, 256, 256, 1], "Relu"))):
        for rows in batches:
            with recording() as recs:
                t = Trainer(make(), learning_rate=1e-4)
                t.step(X[:rows], y[:rows])
            (rec,) = recs
            dirs = {v: write_case(rec, out, f"{model}_{rows}_{v}", portable=(v == "portable"))
                    for v in ("original", "portable")}
            cases.append({"model": model, "rows": rows, "threads": 1 if rows < 64 else 2, "dirs": dirs})
    return cases


def _calibrate(w: _Worker, case: str, slice_s: float) -> int:
    n = 1
    while True:
        s = w.ask(time=case, steps=n)["seconds"]
        if s > slice_s / 4 or n > 1 << 20:
            return max(1, int(n * slice_s / max(s, 1e-9)))
        n *= 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--new-python", default=os.environ.get("STREAMFIT_PLAIN_ORT_PYTHON"),
                        help="interpreter of a venv with plain onnxruntime (default $STREAMFIT_PLAIN_ORT_PYTHON)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--slice", type=float, default=0.3, help="seconds per timed slice")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of short slices")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    if args.quick:
        args.rounds, args.slice = 2, 0.02
    from _cpu import cpu_model, run_env

    load_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="sf-ortv-") as tmp:
        cases = _record(Path(tmp), [1, 32, 2048])
        workers = {"1.19.2": _Worker(sys.executable)}
        if args.new_python:
            workers["new"] = _Worker(args.new_python)
        else:
            print("no --new-python (or STREAMFIT_PLAIN_ORT_PYTHON): timing onnxruntime-training only")
        versions = {k: w.info["onnxruntime"] for k, w in workers.items()}
        print(f"CPU: {cpu_model()}; " + ", ".join(f"onnxruntime {v} (Python {workers[k].info['python']})"
                                                   for k, v in versions.items()))
        results = []
        for case in cases:
            pairs = {}
            for wk, w in workers.items():
                for variant, d in case["dirs"].items():
                    reply = w.ask(load=str(d), threads=case["threads"])
                    if "error" in reply:
                        pairs[(wk, variant)] = reply["error"]
                    else:
                        pairs[(wk, variant)] = _calibrate(w, str(d), args.slice)
            live = [p for p, v in pairs.items() if isinstance(v, int)]
            times: dict[tuple[str, str], list[float]] = {p: [] for p in live}
            for r in range(args.rounds):
                for p in live[r % len(live):] + live[: r % len(live)]:
                    n = pairs[p]
                    times[p].append(workers[p[0]].ask(time=str(case["dirs"][p[1]]), steps=n)["seconds"] / n)
            res = {"model": case["model"], "rows": case["rows"], "threads": case["threads"],
                   "us_per_step": {f"{a}/{b}": statistics.median(t) * 1e6 for (a, b), t in times.items()},
                   "errors": {f"{a}/{b}": v for (a, b), v in pairs.items() if not isinstance(v, int)}}

            def ratio(p: tuple[str, str], q: tuple[str, str]) -> "float | None":
                if p not in times or q not in times:
                    return None
                return statistics.median(a / b for a, b in zip(times[p], times[q]))

            res["new_portable_vs_1192_original"] = ratio(("new", "portable"), ("1.19.2", "original"))
            res["new_original_vs_1192_original"] = ratio(("new", "original"), ("1.19.2", "original"))
            res["1192_portable_vs_original"] = ratio(("1.19.2", "portable"), ("1.19.2", "original"))
            results.append(res)
        for w in workers.values():
            w.close()
    new = versions.get("new", "-")
    print(f"\nus per fused step (median of {args.rounds} interleaved rounds); ratios < 1: faster than 1.19.2's original")
    print(f"{'case':14s} {'1.19.2 orig':>12s} {'1.19.2 port':>12s} {new + ' orig':>13s} {new + ' port':>13s}"
          f" {'port/orig@1.19.2':>17s} {'new port/1.19.2':>16s} {'new orig/1.19.2':>16s}")
    fmt = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    for r in results:
        us = r["us_per_step"]
        cell = lambda k: f"{us[k]:.1f}" if k in us else ("no load" if k in r["errors"] else "-")  # noqa: E731
        print(f"{r['model'] + ' bs' + str(r['rows']):14s} {cell('1.19.2/original'):>12s} {cell('1.19.2/portable'):>12s} "
              f"{cell('new/original'):>13s} {cell('new/portable'):>13s} {fmt(r['1192_portable_vs_original']):>17s} "
              f"{fmt(r['new_portable_vs_1192_original']):>16s} {fmt(r['new_original_vs_1192_original']):>16s}")
    for r in results:
        for k, e in r["errors"].items():
            print(f"  {r['model']} bs{r['rows']} {k}: {e}")
    if args.json:
        env = {**run_env(), "loadavg_start": load_start, "loadavg_end": list(os.getloadavg())}
        args.json.write_text(json.dumps({"cpu": cpu_model(), "env": env, "config": {"quick": args.quick,
                                         "rounds": args.rounds, "slice_s": args.slice}, "versions": versions,
                                         "results": results}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
