#!/usr/bin/env python
"""Per-op profile of streamfit's fused training step (ORT's profiler), and its GEMMs beside numpy's.

    python bench/profile_step.py                      # MLP 100-256-256-1, batches 256 and 2048, 2 threads
    python bench/profile_step.py --batches 2048 --threads 1 --steps 300 --top 30
    python bench/profile_step.py --gemms              # also time each big GEMM shape alone (ORT vs numpy)
    python bench/profile_step.py --json docs/benchmarks/data/profile_step.json   # bench/plots.py draws it

For each batch size it trains a ``Trainer(step="fused")`` (float32, squared error, SGD) with ORT profiling on,
then prints the mean time per step of every node of the graph that ran (the large-batch graph for batches of
``FusedStep.large_batch_rows`` rows and more), with its GFLOP/s for MatMul/Gemm nodes, the sum of the kernels
and the session's own ``model_run`` time (their difference is the executor's overhead).  Profiling costs a few
us per node, so the step is slower here than in ``engine.py``; the shares are what this is for.  On a shared
machine, run it when ``uptime`` shows the load near 0: a busy core inflates whichever kernel it interrupts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import shutil
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")):
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

sys.path.insert(0, HERE)  # bench/, for _cpu
from _cpu import run_env  # noqa: E402

SIZES = (100, 256, 256, 1)


def _numel(shape_entry) -> int:  # type: ignore[no-untyped-def]
    dims = next(iter(shape_entry.values())) if shape_entry else []
    return int(np.prod(dims)) if dims else 1


def _flops(op: str, args: dict) -> float | None:  # type: ignore[type-arg]
    """2*M*N*K of a MatMul-like node from the shapes the profiler recorded (M*K, K*N, M*N elements)."""
    if op not in ("MatMul", "Gemm", "FusedMatMul", "FusedGemm"):
        return None
    ins, outs = args.get("input_type_shape") or [], args.get("output_type_shape") or []
    if len(ins) < 2 or not outs:
        return None
    a, b, c = _numel(ins[0]), _numel(ins[1]), _numel(outs[0])
    return 2.0 * c * float(np.sqrt(a * b / c)) if c else None


def profile(batch: int, threads: int, steps: int) -> dict[str, Any]:
    """Profile ``steps`` fused steps at ``batch`` rows; the mean time per step of each node, and the run's."""
    from streamfit import Trainer
    from streamfit._engine.testing import mlp_model

    trainer = Trainer(mlp_model(list(SIZES), "Relu", seed=0), loss="squared_error", optimizer="sgd",
                      learning_rate=1e-3, step="fused", threads=threads)
    rng = np.random.default_rng(batch)
    data = [(rng.standard_normal((batch, SIZES[0])).astype(np.float32), rng.standard_normal(batch).astype(np.float32))
            for _ in range(8)]
    tmp = tempfile.mkdtemp(prefix="sf-prof-")
    for opts in (trainer.options, trainer.small_batch_options):  # the step's sessions are made on its first batch
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "step")
    trainer.step(*data[0])
    strategy = trainer._strategy
    large = batch >= strategy.large_batch_rows
    session = strategy._large_session if large else strategy.session
    for i in range(20):
        trainer.step(*data[i % 8])
    t0 = time.perf_counter()
    for i in range(steps):
        trainer.step(*data[i % 8])
    wall = (time.perf_counter() - t0) / steps
    with open(session.end_profiling()) as f:
        events = json.load(f)
    shutil.rmtree(tmp, ignore_errors=True)
    nodes, runs = _node_times(events, steps)
    kernel_sum = sum(n["us"] for n in nodes)
    mean_run = sum(runs) / max(1, len(runs))
    return {"batch": batch, "threads": threads, "graph": "large" if large else "small", "wall_us": wall * 1e6,
            "rows_per_s": batch / wall, "model_run_us": mean_run, "kernels_us": kernel_sum,
            "overhead_us": mean_run - kernel_sum, "loadavg": os.getloadavg()[0], "nodes": nodes}


def _node_times(events: list[dict[str, Any]], steps: int) -> tuple[list[dict[str, Any]], list[float]]:
    """Each node's mean kernel time over the last ``steps`` steps (slowest first), and the model_run times."""
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    op_of: dict[str, str] = {}
    flops_of: dict[str, float | None] = {}
    runs = []
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            kernels[name].append(e["dur"])
            op_of[name] = e.get("args", {}).get("op_name", "?")
            flops_of[name] = _flops(op_of[name], e.get("args", {}))
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            runs.append(e["dur"])
    runs = runs[-steps:] if len(runs) > steps else runs
    per_step = {k: float(np.mean(v[-steps:])) for k, v in kernels.items()}  # each node runs once a step
    nodes = [{"name": k, "op": op_of.get(k, "?"), "us": us,
              "gflops": (flops_of[k] / us / 1e3 if flops_of.get(k) and us else None)}
             for k, us in sorted(per_step.items(), key=lambda kv: -kv[1])]
    return nodes, runs


def report(case: dict[str, Any], top: int) -> None:
    """Print one batch size's profile: the run's times, then the ``top`` slowest nodes."""
    kernel_sum = case["kernels_us"] or 1.0
    print(f"\n== MLP {'-'.join(map(str, SIZES))}, batch {case['batch']}, {case['threads']} thread(s), "
          f"{case['graph']}-batch graph, {len(case['nodes'])} nodes after ORT's optimizations ==")
    print(f"step (profiled) {case['wall_us']:.0f} us wall, {case['rows_per_s'] / 1e3:.0f}K rows/s; model_run "
          f"{case['model_run_us']:.0f} us; kernels {case['kernels_us']:.0f} us; executor overhead "
          f"{case['overhead_us']:.0f} us; load average {case['loadavg']:.2f}")
    gemm_sum = 0.0
    for n in case["nodes"][:top]:
        if n["gflops"]:
            gemm_sum += n["us"]
        extra = f"{n['gflops']:6.0f} GFLOP/s" if n["gflops"] else ""
        print(f"  {n['us']:8.1f} us {n['us'] / kernel_sum * 100:5.1f}%  {n['op']:13s} {extra:>15s}  {n['name']}")
    print(f"  GEMM nodes listed: {gemm_sum:.0f} us ({gemm_sum / kernel_sum * 100:.0f}% of the kernels)")


def gemms(batch: int, threads: int) -> None:
    """Each big GEMM shape of the MLP step alone: ORT (MatMul/Gemm, as the step calls it) vs numpy."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime.capi import _pybind_state as C

    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    except ImportError:
        pass
    cpu = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    rng = np.random.default_rng(0)
    h, d = SIZES[1], SIZES[0]
    cases = [  # label, M, K, N, transA, transB
        ("forward H@W (hidden)", batch, h, h, 0, 0),
        ("forward X@W (input)", batch, d, h, 0, 0),
        ("weight grad H^T dZ (transA)", h, batch, h, 1, 0),
        ("weight grad X^T dZ (transA)", d, batch, h, 1, 0),
        ("input grad dZ W^T (transB)", batch, h, h, 0, 1),
    ]
    print(f"\n== GEMM shapes alone, batch {batch}, {threads} thread(s) (best of 7) ==")
    for label, M, K, N, ta, tb in cases:
        A = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        B = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        out = np.empty((M, N), np.float32)
        g = helper.make_graph([helper.make_node("Gemm", ["A", "B"], ["Y"], transA=ta, transB=tb)], "g",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(A.shape)),
                               helper.make_tensor_value_info("B", TensorProto.FLOAT, list(B.shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, N])])
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                                      ir_version=8).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        io = C.SessionIOBinding(sess._sess)
        io.bind_ortvalue_input("A", C.OrtValue.ortvalue_from_numpy(A, cpu))
        io.bind_ortvalue_input("B", C.OrtValue.ortvalue_from_numpy(B, cpu))
        io.bind_ortvalue_output("Y", C.OrtValue.ortvalue_from_numpy(out, cpu))
        a_, b_ = (A.T if ta else A), (B.T if tb else B)
        fns = {"ORT": lambda: sess._sess.run_with_iobinding(io, None), "numpy": lambda: np.matmul(a_, b_, out=out)}
        flop = 2.0 * M * N * K
        reps = max(3, int(0.02 / (flop / 200e9)))
        cells = []
        for key, fn in fns.items():
            fn()
            best = min(_timed(fn, reps) for _ in range(7))
            cells.append(f"{key} {best * 1e6:7.0f} us {flop / best / 1e9:4.0f} GFLOP/s")
        print(f"  {label:30s} M={M:<5d} K={K:<5d} N={N:<5d}  " + "   ".join(cells))


def _timed(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="256,2048", help="comma list of batch sizes (default %(default)s)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--steps", type=int, default=200, help="profiled steps per batch size (default %(default)s)")
    p.add_argument("--top", type=int, default=20, help="nodes listed (default %(default)s)")
    p.add_argument("--gemms", action="store_true", help="also time the big GEMM shapes alone, ORT vs numpy")
    p.add_argument("--quick", action="store_true", help="a smoke run: batch 256 only, 30 profiled steps")
    p.add_argument("--json", metavar="PATH", help="also write the profiles as JSON (bench/plots.py draws them)")
    args = p.parse_args(argv)
    env = run_env()
    batches, steps = ([256], 30) if args.quick else ([int(b) for b in args.batches.split(",") if b.strip()], args.steps)
    cases = []
    for batch in batches:
        cases.append(profile(batch, args.threads, steps))
        report(cases[-1], args.top)
        if args.gemms:
            gemms(batch, args.threads)
    if args.json:
        doc = {"env": {**env, "loadavg_end": list(os.getloadavg())},
               "config": {"quick": args.quick, "sizes": list(SIZES), "threads": args.threads, "steps": steps,
                          "batches": batches}, "cases": cases}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
