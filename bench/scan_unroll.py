"""A design tried for per-row chunks and not kept: the Scan body unrolled, ``U`` rows per iteration.

streamfit's chunk graph runs one step per Scan iteration (``_engine/steps/scan.py``).  If the cost of a row were
Scan's own work per iteration, a body holding ``U`` copies of the step, chained through the carried state, with
each scanned input split ``U`` ways before the loop (``[steps, ...]`` -> ``U`` inputs of ``[steps / U, ...]``) and
the outputs joined after it, would pay that work once per ``U`` rows.  This script takes streamfit's own chunk
graphs of a ready-made logistic regression at ``batch_size=1`` (River's configuration, SGD at a constant rate, and
the defaults, Adam), unrolls them, checks that every output is the same, and times one session run per chunk, per
row, the variants in interleaved rounds.  On an AMD EPYC (AVX-512), two runs: the 4-node SGD body ran 1.33 us a
row with 2 features and 1.35-1.41 with 9 at ``U=1``, 1.42-1.65 at ``U=2..8``; the Adam body of the defaults 3.30-3.84
us at ``U=1``, 3.58-4.32 unrolled (the body of Adam's nodes, before its kernel).  Unrolling is 5-15 % slower
everywhere: what Scan does once per iteration is not what a row costs here.

    python bench/scan_unroll.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cpu import cpu_model, has_avx512  # noqa: E402

__all__ = ["unroll", "chunk_graph"]


def unroll(model: Any, U: int) -> Any:
    """``model`` with its one top-level Scan's body repeated ``U`` times per iteration (needs a number of steps that
    ``U`` divides); the values computed are the same.  Where the body holds Adam's kernel (which writes its outputs
    over its inputs), the unrolled graph writes the state it was fed: run it on a copy of its feeds."""
    from onnx import helper as H
    from onnx import numpy_helper as NH

    m = copy.deepcopy(model)
    g = m.graph
    at = next(i for i, n in enumerate(g.node) if n.op_type == "Scan")
    scan = g.node[at]
    body = next(a.g for a in scan.attribute if a.name == "body")
    n_scanned = next(a.i for a in scan.attribute if a.name == "num_scan_inputs")
    n_state = len(scan.input) - n_scanned
    states = [i.name for i in body.input[:n_state]]
    n_out = len(body.output) - n_state
    new = H.make_graph([], f"{body.name}_x{U}", [], [])
    new.initializer.extend(body.initializer)  # constants: one copy, read by every row
    current = {s: s for s in states}
    ins: list[list[Any]] = [[] for _ in range(n_scanned)]
    outs: list[list[Any]] = [[] for _ in range(n_out)]
    for u in range(U):  # copy u reads the state copy u - 1 wrote
        names = dict(current)
        for j, vi in enumerate(body.input[n_state:]):
            v = copy.deepcopy(vi)
            v.name = names[vi.name] = f"{vi.name}__u{u}"
            ins[j].append(v)
        for node in body.node:
            n = copy.deepcopy(node)
            n.name = f"{node.name}__u{u}" if node.name else ""
            n.input[:] = [names.get(x, x) if x else x for x in n.input]  # names of the outer scope stay
            for k, x in enumerate(n.output):
                names[x] = n.output[k] = f"{x}__u{u}"
            new.node.append(n)
        for k, o in enumerate(body.output[:n_state]):
            current[states[k]] = names.get(o.name, o.name)
        for j, o in enumerate(body.output[n_state:]):
            v = copy.deepcopy(o)
            v.name = names.get(o.name, o.name)
            outs[j].append(v)
    new.input.extend(body.input[:n_state])
    for j in range(n_scanned):
        new.input.extend(ins[j])
    for k, o in enumerate(body.output[:n_state]):
        v = copy.deepcopy(o)
        v.name = current[states[k]]
        new.output.append(v)
    for j in range(n_out):
        new.output.extend(outs[j])
    g.initializer.extend([NH.from_array(np.array([1], np.int64), "unr_one"),
                          NH.from_array(np.array([-1, U], np.int64), "unr_head"),
                          NH.from_array(np.array([1 << 62], np.int64), "unr_end"),
                          NH.from_array(np.array([-1], np.int64), "unr_minus")])
    before, after, scan_in, scan_out = [], [], list(scan.input[:n_state]), list(scan.output[:n_state])
    for j in range(n_scanned):  # [steps, ...] -> [steps / U, U, ...] -> U inputs of [steps / U, ...]
        s = scan.input[n_state + j]
        before += [H.make_node("Shape", [s], [f"{s}__shape"]),
                   H.make_node("Slice", [f"{s}__shape", "unr_one", "unr_end"], [f"{s}__tail"]),
                   H.make_node("Concat", ["unr_head", f"{s}__tail"], [f"{s}__to"], axis=0),
                   H.make_node("Reshape", [s, f"{s}__to"], [f"{s}__r"]),
                   H.make_node("Split", [f"{s}__r"], [f"{s}__p{u}" for u in range(U)], axis=1)]
        for u in range(U):
            before.append(H.make_node("Squeeze", [f"{s}__p{u}", "unr_one"], [f"{s}__s{u}"]))
            scan_in.append(f"{s}__s{u}")
    for j in range(n_out):  # U outputs of [steps / U, ...] -> [steps / U, U, ...] -> [steps, ...]
        o = scan.output[n_state + j]
        for u in range(U):
            scan_out.append(f"{o}__o{u}")
            after.append(H.make_node("Unsqueeze", [f"{o}__o{u}", "unr_one"], [f"{o}__q{u}"]))
        after += [H.make_node("Concat", [f"{o}__q{u}" for u in range(U)], [f"{o}__c"], axis=1),
                  H.make_node("Shape", [f"{o}__c"], [f"{o}__cs"]),
                  H.make_node("Slice", [f"{o}__cs", "unr_one", "unr_end"], [f"{o}__t1"]),
                  H.make_node("Slice", [f"{o}__t1", "unr_one", "unr_end"], [f"{o}__t2"]),
                  H.make_node("Concat", ["unr_minus", f"{o}__t2"], [f"{o}__to"], axis=0),
                  H.make_node("Reshape", [f"{o}__c", f"{o}__to"], [o])]
    loop = H.make_node("Scan", scan_in, scan_out, num_scan_inputs=n_scanned * U, body=new)
    nodes = list(g.node[:at]) + before + [loop] + after + list(g.node[at + 1:])
    del g.node[:]
    g.node.extend(nodes)
    return m


def chunk_graph(features: int, defaults: bool, rows: int) -> Any:
    """streamfit's chunk graph of a ``LogisticRegression(batch_size=1)`` that learned ``rows`` rows of ``features``
    random features in chunks of 256 (River's configuration, or the defaults)."""
    import streamfit as sf

    kw: dict[str, Any] = {} if defaults else {"optimizer": "sgd", "learning_rate": "constant", "eta0": 0.01,
                                              "penalty": None}
    est = sf.LogisticRegression(batch_size=1, **kw)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, features)).astype(np.float32)
    y = X.sum(axis=1) > 0
    for i in range(0, rows, 256):
        est.partial_fit_predict(X[i:i + 256], y[i:i + 256], **({"classes": [False, True]} if i == 0 else {}))
    return next(iter(est.trainer_._chunk_steps.models.values()))


def _feeds(model: Any, steps: int) -> dict[str, np.ndarray]:
    """Values of the graph's inputs for ``steps`` one-row steps (the state small, the scales near 1)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    rng = np.random.default_rng(1)
    out = {}
    for i in model.graph.input:
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value else steps if d.dim_param == "S" else 1 for d in t.shape.dim]
        a = (rng.random(shape) * 0.1).astype(tensor_dtype_to_np_dtype(t.elem_type))
        out[i.name] = a + 1 if "scale" in i.name else a
    return out


def _copy(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds of their own for one run (an unrolled kernel body writes the state it is fed)."""
    return {name: a.copy() for name, a in feeds.items()}


def main() -> None:
    import onnxruntime as ort

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = p.parse_args()
    repeats, steps = (2, 64) if args.quick else (25, 256)
    print(f"CPU: {cpu_model()}, AVX-512: {'yes' if has_avx512() else 'no'}; one session run of {steps} one-row "
          f"steps, best of {repeats}, one thread")
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    for features, defaults in ((2, False), (9, False), (2, True)):
        base = chunk_graph(features, defaults, 2 * steps)
        feeds = _feeds(base, steps)
        label = f"{features} features, {'defaults (Adam)' if defaults else 'SGD, constant 0.01'}"
        sessions, same = {}, {}
        for U in (1, 2, 4, 8):
            model = base if U == 1 else unroll(base, U)
            sessions[U] = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            got = sessions[U].run(None, _copy(feeds))
            ref = got if U == 1 else ref
            same[U] = all(np.array_equal(a, b) for a, b in zip(ref, got))
        best = dict.fromkeys(sessions, float("inf"))
        for r in range(repeats):  # interleaved rounds, each in another order: a shared machine's load moves
            for U in list(sessions)[r % 4:] + list(sessions)[:r % 4]:
                copies = [_copy(feeds) for _ in range(20)]
                t = time.perf_counter()
                for fed in copies:
                    sessions[U].run(None, fed)
                best[U] = min(best[U], (time.perf_counter() - t) / 20)
        for U, seconds in best.items():
            print(f"   {label:<36} U={U:<3} {seconds * 1e6 / steps:6.3f} us a row   outputs "
                  f"{'the same' if same[U] else 'DIFFER'}")

if __name__ == "__main__":
    main()
