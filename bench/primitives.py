#!/usr/bin/env python
"""What a batch-1 training step is made of in ONNX Runtime: per-run and per-node cost, and the single ops of
an MLP 100-256-256-1 step, each timed alone (thread CPU time, one intra-op thread, best of 7 repeats).

    python bench/primitives.py            # ~20 s
    python bench/primitives.py --quick    # smoke run
    python bench/primitives.py --json docs/benchmarks/data/primitives.json   # also as JSON (bench/plots.py)

It backs the floor quoted for the MLP at batch 1: ORT's Gemm with a C input copies C into the output
before accumulating, so the rank-1 weight update costs two passes over the weight, and no op does it in one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")):
    sys.path.insert(0, ROOT)  # measure the tree this script lives in

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnxruntime.capi import _pybind_state as C  # noqa: E402

from streamfit._engine.runtime.device import session_options  # noqa: E402

CPU = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)


def time_graph(nodes: list[Any], inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], runs: int) -> float:
    """us per run of a graph through an IOBinding bound once (thread CPU time, best of 7)."""
    def info(name: str, a: np.ndarray) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape))

    graph = helper.make_graph(nodes, "g", [info(k, v) for k, v in inputs.items()],
                              [info(k, v) for k, v in outputs.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    io = C.SessionIOBinding(session._sess)
    for k, v in inputs.items():
        io.bind_ortvalue_input(k, C.OrtValue.ortvalue_from_numpy(v, CPU))
    for k, v in outputs.items():
        io.bind_ortvalue_output(k, C.OrtValue.ortvalue_from_numpy(v, CPU))
    for _ in range(max(10, runs // 5)):
        session._sess.run_with_iobinding(io, None)
    best = float("inf")
    for _ in range(7):
        t0 = time.thread_time()
        for _ in range(runs):
            session._sess.run_with_iobinding(io, None)
        best = min(best, (time.thread_time() - t0) / runs)
    return best * 1e6


def chain(k: int, runs: int) -> float:
    """k Mul nodes in a chain on a (1, 1) tensor: the run's fixed cost plus k node costs."""
    nodes, prev = [], "x"
    for i in range(k):
        nodes.append(helper.make_node("Mul", [prev, "x"], [f"o{i}"]))
        prev = f"o{i}"
    return time_graph(nodes, {"x": np.ones((1, 1), np.float32)}, {prev: np.zeros((1, 1), np.float32)}, runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: few repetitions")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/plots.py draws them)")
    args = p.parse_args()
    sys.path.insert(0, HERE)
    from _cpu import run_env

    env = run_env()
    runs = 200 if args.quick else 5000
    one, twenty = chain(1, runs * 4), chain(21, runs * 4)
    doc: dict[str, Any] = {"env": env, "config": {"quick": args.quick, "runs": runs},
                           "run_us": one, "node_us": (twenty - one) / 20, "ops_us": {}}
    print(f"session run, 1 node: {one:.2f} us; each further node: {(twenty - one) / 20:.2f} us "
          f"(a chain of tiny Mul nodes, IOBinding bound once, 1 thread)")
    rng = np.random.default_rng(0)

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    print("single ops of an MLP 100-256-256-1 step at batch 1 (us):")
    for d_in in (256, 100):
        W, h, dz = f(d_in, 256), f(1, d_in), f(1, 256)
        out_w, out_v = np.zeros((d_in, 256), np.float32), np.zeros((1, 256), np.float32)
        rows = [
            ("forward GEMV  MatMul(h, W)", [helper.make_node("MatMul", ["h", "W"], ["O"])],
             {"h": h, "W": W}, {"O": out_v}),
            ("backward GEMV FusedMatMul(dz, W, transB)", [helper.make_node("FusedMatMul", ["dz", "W"], ["O"],
                                                                          domain="com.microsoft", transB=1)],
             {"dz": dz, "W": W}, {"O": np.zeros((1, d_in), np.float32)}),
            ("update        Gemm(h, dz, C=W, transA)", [helper.make_node("Gemm", ["h", "dz", "W"], ["O"], transA=1,
                                                                        alpha=-1.0, beta=1.0)],
             {"h": h.reshape(1, d_in), "dz": dz, "W": W}, {"O": out_w}),
            ("  of which: copy of W (Identity)", [helper.make_node("Identity", ["W"], ["O"])], {"W": W}, {"O": out_w}),
            ("  of which: rank-1 Gemm without C", [helper.make_node("Gemm", ["h", "dz"], ["O"], transA=1)],
             {"h": h.reshape(1, d_in), "dz": dz}, {"O": out_w}),
            ("check         ReduceSum(W)", [helper.make_node("ReduceSum", ["W"], ["O"], keepdims=0)],
             {"W": W}, {"O": np.zeros((), np.float32)}),
        ]
        print(f"  layer {d_in}x256:")
        for label, nodes, ins, outs in rows:
            us = time_graph(nodes, ins, outs, runs)
            doc["ops_us"].setdefault(f"{d_in}x256", {})[" ".join(label.split())] = us
            print(f"    {label:45s} {us:7.2f}")
    if args.json:
        doc["env"]["loadavg_end"] = list(os.getloadavg())
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
