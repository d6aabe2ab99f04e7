"""The leanest Scan bodies a per-row linear learner can have in ONNX, hand-written, timed: the floor of the design.

streamfit's chunk body is derived from the fused step graph, so that a chunk gives the bits of one step per call.
These bodies drop that constraint to count as few nodes as ONNX allows, and so bound what any Scan body can
reach on this machine:

- ``sgd``: ``z = [x, 1] @ theta`` (one Gemm, the bias folded into the product), ``e = sigmoid(z) * gw - y * gw`` as one Gemm
  (``y * gw`` computed before the loop), ``theta -= [x, 1]^T e`` as one Gemm: 4 nodes (3 for a linear regressor,
  without the sigmoid).
- ``adam``: the same forward and error, the gradient with its L2 term in one Gemm, each moment's update in one
  Gemm (``alpha * g + beta * m``), the bias corrections folded into the scanned step size and epsilon: 12 nodes.
- ``adam_kernel``: the same gradient, then onnxruntime-training's Adam kernel (``com.microsoft.AdamOptimizer``,
  the step count scanned): 6 nodes.  streamfit's lean bodies run it where the build has it
  (``_engine/steps/fused_adam.py``), so on onnxruntime-training this is the defaults' floor.

- ``ftrl`` (:func:`lean_ftrl_seconds`): a hashed logistic regression of ``F`` one-hot fields and a bias, FTRL without
  a penalty, over a carried block of distinct rows ``[w, z, n, sqrt(n)]`` (the square root carried, not recomputed):
  one ``Gather`` of the row's ``F + 1`` block rows, one ``Split``, the score a ``ReduceSum``, its ``Sigmoid``, the
  gradient one Gemm (``cgw * p - y * cgw``), ``n``'s and ``sqrt(n)``'s updates, ``z``'s in one Gemm, the new weight
  a Gemm and a ``Div`` (``-alpha z / (beta + sqrt(n))``), one ``Concat``, one ``ScatterND`` back: 16 nodes.

They round differently from the step path (a fused multiply-add where the step graph rounds twice), which is why
streamfit does not run them; their time is what the node count costs, not a target for a test.  They are run as
streamfit runs its chunk bodies: every intermediate value carried as a loop state (``steps/scan_expose.py``:
onnxruntime then allocates nothing per iteration) and the inputs and outputs bound once (IOBinding).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["lean_body_seconds", "lean_ftrl_seconds"]


def _model(kind: str, d: int, sigmoid: bool):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper, numpy_helper

    def vi(name: str, shape: list) -> object:  # type: ignore[type-arg]
        elem = TensorProto.INT64 if name in ("t", "s_t") else TensorProto.FLOAT  # the kernel's step count
        return helper.make_tensor_value_info(name, elem, shape)

    N = helper.make_node
    nodes = [N("Gemm", ["xa", "th"], ["z"])]  # a Gemm: cheaper per call than a MatMul of these shapes
    out = "z"
    if sigmoid:
        nodes.append(N("Sigmoid", ["z"], ["p"]))
        out = "p"
    nodes.append(N("Gemm", [out, "gw", "nyg"], ["e"]))  # p * gw - y * gw
    state = ["th"]
    consts = []
    if kind == "sgd":
        nodes.append(N("Gemm", ["xa", "e", "th"], ["th2"], transA=1, alpha=-1.0, beta=1.0))
        scanned = [("xa", [1, d + 1]), ("gw", [1, 1]), ("nyg", [1, 1])]
    elif kind == "adam_kernel":  # onnxruntime-training's Adam kernel: one node for the moments and the step
        nodes += [N("Mul", ["th", "pm"], ["pen"]),
                  N("Gemm", ["xa", "e", "pen"], ["g"], transA=1),
                  N("AdamOptimizer", ["lr", "t", "th", "g", "m", "v"], ["t2", "m2", "v2", "th2"], domain="com.microsoft")]
        state += ["m", "v"]
        scanned = [("xa", [1, d + 1]), ("gw", [1, 1]), ("nyg", [1, 1]), ("lr", []), ("t", [])]
        pm = np.full((d + 1, 1), 1e-4, np.float32)
        pm[-1] = 0.0
        consts = [numpy_helper.from_array(pm, "pm")]
    else:
        b1, b2 = 0.9, 0.999
        nodes += [N("Mul", ["th", "pm"], ["pen"]),
                  N("Gemm", ["xa", "e", "pen"], ["g"], transA=1),
                  N("Gemm", ["g", "one", "m"], ["m2"], alpha=1 - b1, beta=b1),
                  N("Mul", ["g", "g"], ["gg"]),
                  N("Gemm", ["gg", "one", "v"], ["v2"], alpha=1 - b2, beta=b2),
                  N("Sqrt", ["v2"], ["sv"]),
                  N("Add", ["sv", "eps"], ["den"]),
                  N("Div", ["m2", "den"], ["r"]),
                  N("Gemm", ["r", "step", "th"], ["th2"], alpha=-1.0, beta=1.0)]
        state += ["m", "v"]
        scanned = [("xa", [1, d + 1]), ("gw", [1, 1]), ("nyg", [1, 1]), ("eps", [1]), ("step", [1, 1])]
        pm = np.full((d + 1, 1), 1e-4, np.float32)
        pm[-1] = 0.0  # no penalty on the bias
        consts = [numpy_helper.from_array(pm, "pm"), numpy_helper.from_array(np.ones((1, 1), np.float32), "one")]
    nodes.append(N("Identity", ["z"], ["z_out"]))
    body = helper.make_graph(nodes, "body", [vi(s, [d + 1, 1]) for s in state] + [vi(n, sh) for n, sh in scanned],
                             [vi(s + "2", [d + 1, 1]) for s in state] + [vi("z_out", [1, 1])], initializer=consts)
    scan = N("Scan", [s + "0" for s in state] + ["s_" + n for n, _ in scanned],
             [s + "_final" for s in state] + ["zs"], num_scan_inputs=len(scanned), body=body)
    g = helper.make_graph([scan], "chunk", [vi(s + "0", [d + 1, 1]) for s in state]
                          + [vi("s_" + n, ["n"] + sh) for n, sh in scanned],
                          [vi(s + "_final", [d + 1, 1]) for s in state] + [vi("zs", ["n", 1, 1])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(g, opset_imports=opsets, ir_version=8), len(nodes) - 1


def lean_body_seconds(kind: str, features: int, sigmoid: bool = True, rows: int = 256, rounds: int = 5
                      ) -> tuple[float, int]:
    """CPU seconds per row of the leanest ``kind`` ("sgd" or "adam") body over ``rows`` rows of ``features``
    features (the best of ``rounds`` rounds of 20 runs), and its node count."""
    import onnxruntime as ort

    from streamfit._engine.steps.scan_expose import expose_body_values

    model, count = _model(kind, features, sigmoid)
    model, _ = expose_body_values(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [rows if not isinstance(d, int) else d for d in i.shape]
        if i.type == "tensor(int64)":  # the kernel's step counts
            feeds[i.name] = np.arange(1, rows + 1, dtype=np.int64).reshape(shape)
            continue
        feeds[i.name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    for name in ("v0", "eps", "step", "s_lr"):
        if name in feeds:
            feeds[name] = np.abs(feeds[name]) + 1e-3
    return _bound_seconds(sess, feeds, rows, rounds), count


def _ftrl_model(fields: int):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    P = fields + 1

    def vi(name: str, shape: list, elem: int = TensorProto.FLOAT) -> object:  # type: ignore[type-arg]
        return helper.make_tensor_value_info(name, elem, shape)

    N = helper.make_node
    nodes = [N("Gather", ["M", "pf"], ["rows"], axis=0),  # [P, 4]
             N("Split", ["rows"], ["w", "z", "n", "s"], axis=1, num_outputs=4),
             N("ReduceSum", ["w"], ["score"], keepdims=1),  # [1, 1]
             N("Sigmoid", ["score"], ["p"]),
             N("Gemm", ["cgw", "p", "nyc"], ["g"]),  # cgw * p - y * cgw: [P, 1]
             N("Mul", ["g", "g"], ["gg"]),
             N("Add", ["n", "gg"], ["n2"]),
             N("Sqrt", ["n2"], ["s2"]),
             N("Sub", ["s2", "s"], ["ds"]),
             N("Mul", ["ds", "w"], ["dsw"]),
             N("Add", ["z", "g"], ["zg"]),
             N("Gemm", ["dsw", "nia", "zg"], ["z2"]),  # z + g - sigma * w, sigma = ds / alpha
             N("Gemm", ["s2", "nia", "nba"], ["den"]),  # -(beta + sqrt(n)) / alpha
             N("Div", ["z2", "den"], ["w2"]),
             N("Concat", ["w2", "z2", "n2", "s2"], ["new"], axis=1),
             N("ScatterND", ["M", "pidx", "new"], ["M2"]),
             N("Identity", ["score"], ["score_out"])]
    ints = TensorProto.INT64
    scanned = [("pf", [P], ints), ("pidx", [P, 1], ints), ("cgw", [P, 1], TensorProto.FLOAT),
               ("nyc", [P, 1], TensorProto.FLOAT), ("nia", [1, 1], TensorProto.FLOAT), ("nba", [1, 1], TensorProto.FLOAT)]
    body = helper.make_graph(nodes, "body", [vi("M", ["R", 4])] + [vi(n, sh, e) for n, sh, e in scanned],
                             [vi("M2", ["R", 4]), vi("score_out", [1, 1])])
    scan = N("Scan", ["M0"] + ["s_" + n for n, _, _ in scanned], ["M_final", "scores"], num_scan_inputs=len(scanned),
             body=body)
    g = helper.make_graph([scan], "chunk", [vi("M0", ["R", 4])] + [vi("s_" + n, ["n"] + sh, e) for n, sh, e in scanned],
                          [vi("M_final", ["R", 4]), vi("scores", ["n", 1, 1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), len(nodes) - 1


def lean_ftrl_seconds(fields: int, block_rows: int, rows: int = 256, rounds: int = 5, seed: int = 0
                      ) -> tuple[float, int]:
    """CPU seconds per row of the leanest FTRL body (``fields`` one-hot fields and a bias) over ``rows`` rows whose
    ids fall in a carried block of ``block_rows`` distinct rows (the best of ``rounds`` rounds of 20 runs), and its
    node count.  The session run alone: no hashing, no gathering of the block from the table, no host work."""
    import onnxruntime as ort

    from streamfit._engine.steps.scan_expose import expose_body_values

    model, count = _ftrl_model(fields)
    model, _ = expose_body_values(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    P = fields + 1
    pf = np.concatenate([rng.integers(0, block_rows - 1, (rows, fields)), np.full((rows, 1), block_rows - 1)], axis=1)
    M0 = np.zeros((block_rows, 4), np.float32)
    M0[:, 2] = rng.uniform(0.0, 1.0, block_rows)
    M0[:, 3] = np.sqrt(M0[:, 2])
    y = rng.integers(0, 2, (rows, 1, 1)).astype(np.float32)
    cgw = np.ones((rows, P, 1), np.float32)
    feeds = {"M0": M0, "s_pf": pf.astype(np.int64), "s_pidx": pf.astype(np.int64)[:, :, None], "s_cgw": cgw,
             "s_nyc": -y * cgw, "s_nia": np.full((rows, 1, 1), -10.0, np.float32),
             "s_nba": np.full((rows, 1, 1), -10.0, np.float32)}
    return _bound_seconds(sess, feeds, rows, rounds), count


def _bound_seconds(sess: Any, feeds: dict[str, np.ndarray], rows: int, rounds: int) -> float:
    """CPU seconds per row of ``sess`` on ``feeds`` over ``rows`` rows, its inputs and outputs bound once (as
    streamfit runs its chunks): the best of ``rounds`` rounds of 20 runs."""
    import onnxruntime as ort

    outputs = {o.name: np.empty(a.shape, a.dtype) for o, a in zip(sess.get_outputs(), sess.run(None, feeds))}
    io = sess.io_binding()
    keep = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in {**feeds, **outputs}.items()}
    for name in feeds:
        io.bind_ortvalue_input(name, keep[name])
    for name in outputs:
        io.bind_ortvalue_output(name, keep[name])
    sess.run_with_iobinding(io)
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for _ in range(20):
            sess.run_with_iobinding(io)
        best = min(best, (time.process_time() - t) / (20 * rows))
    return best
