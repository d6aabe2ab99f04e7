#!/usr/bin/env python
"""Per-event learning (issue 20): streamfit and its peers (River, Vowpal Wabbit) side by side in one run.

    python bench/perrow.py                    # every section, a few minutes on 2 shared cores
    python bench/perrow.py --quick            # smoke run: tiny sizes, one round
    python bench/perrow.py --json docs/benchmarks/data/perrow.json   # also the figures as JSON (bench/plots.py)
    python bench/perrow.py --baseline recorded # section 4 against the recorded figures, not BASELINE's tree

Sections (every ratio printed with met/MISSED against the issue's target, collected at the end):

1. River's Phishing, TrumpApproval, Bananas, predict then learn at ``batch_size=1``, the rows given to
   ``partial_fit_predict`` in chunks of ``--chunk`` rows (the predictions are the steps' own, before each
   update): with River's configuration (``optimizer="sgd"``, constant 0.01, no penalty) <= 0.3x River's time,
   with the defaults <= 0.5x; accuracy >= River's - 0.005, MAE <= 1.05x River's.  River: ``StandardScaler() |
   LogisticRegression()`` / ``LinearRegression()``, ``predict_one`` then ``learn_one``.  Also the River
   wrapper (``streamfit.river``) under River's own ``progressive_val_score`` (information).
2. Hashed ``LogisticRegression(categorical=16 string columns, optimizer="ftrl")`` with its default learning
   rate: ``batch_size=1`` (rows in chunks) >= 2x VW's rows/s at <= 1.01x its progressive log loss;
   ``batch_size=1024`` >= 3x VW's rows/s.  VW: ``--loss_function logistic``, 18 bits, parse + predict + learn
   of each text line (formatted beforehand).  Skipped (n/a) without the ``vowpalwabbit`` package.
3. One event per call: ``partial_fit_predict`` of one Phishing row with the default ``LogisticRegression()``
   <= 1.5x River's predict_one + learn_one of that row.
4. The ready-made ``partial_fit`` with the default ``batch_size=32`` on 1024-row calls >= 3x the rows/s of
   main at ``BASELINE``, that tree measured in this run and process (imported beside this one under another
   name, the two trees' rounds interleaved; ``--baseline REV`` another commit;
   ``--baseline recorded``, ``--quick`` or a checkout without that commit: the figures recorded on it,
   ``BASELINE_RATES``, which a machine's speed of the day moves).
5. ``MLPClassifier(batch_size=1)``: chunks of ``--chunk`` rows >= 5x faster than one call per row, with the
   same predictions (max |difference| printed).
6. The floor: one bound session run of a one-node graph on one row (what any per-call onnxruntime learner
   pays at least once per call), beside River's per-row time.

Times are CPU time of this process (``time.process_time``: what the scheduler gives other processes on a shared
machine is not counted; onnxruntime's threads are), the best of ``--rounds`` interleaved rounds of each side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")) and ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # measure the tree this script lives in
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from _cpu import cpu_model, has_avx512, run_env  # noqa: E402

#: main when issue 20's work started: section 4's baseline
BASELINE = "8b225c9"
#: rows/s of section 4 measured on BASELINE (AMD EPYC, 2 cores, load ~3, process CPU time, best of 5 rounds of
#: 8 calls of 1024 rows): the figures the >= 3x target is checked against with --baseline recorded.  Measured
#: in one run beside this tree, that tree was 1.7-2.7x faster than these on a quiet machine: they overstate
#: the ratio, hence the default
BASELINE_RATES = {"LogisticRegression()": 570_128, "LinearRegressor()": 515_086, "MLPClassifier()": 258_992,
                  "LogisticRegression(categorical=16 strings, ftrl)": 150_501}
STREAMS = ("Phishing", "TrumpApproval", "Bananas")


@dataclass
class Target:
    what: str
    value: float
    limit: float
    ok: bool

    def line(self) -> str:
        return f"{'met' if self.ok else 'MISSED':<7} {self.what:<88} {self.value:8.3f}  (target {self.limit:g})"


TARGETS: list[Target] = []
#: section 1's figures, one per stream and configuration, for --json
STREAM_RESULTS: list[dict[str, Any]] = []


def target(what: str, value: float, limit: float, at_most: bool = True) -> str:
    ok = value <= limit if at_most else value >= limit
    TARGETS.append(Target(what, value, limit, ok))
    return "met" if ok else "MISSED"


def best_of(fns: dict[str, Callable[[], Any]], rounds: int, passes: int = 1) -> tuple[dict[str, float], dict[str, Any]]:
    """CPU seconds of one call of each function, the best of ``rounds`` interleaved rounds of ``passes`` calls each
    (several calls a round: a pass of a few milliseconds alone is at the mercy of the machine's moods, which have
    been seen to change one run's time by 1.7x); and its last result."""
    best = {k: float("inf") for k in fns}
    last: dict[str, Any] = {}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for k in order:
            t = time.process_time()
            for _ in range(passes):
                last[k] = fns[k]()
            best[k] = min(best[k], (time.process_time() - t) / passes)
    return best, last


# -- River's streams ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stream:
    name: str
    regression: bool
    rows: list[tuple[dict[str, Any], Any]]
    X: np.ndarray
    y: np.ndarray


def load(name: str, limit: int | None) -> Stream:
    from river import datasets

    rows = list(getattr(datasets, name)())[:limit]
    keys = list(rows[0][0])
    X = np.array([[float(x[k]) for k in keys] for x, _ in rows], np.float32)
    regression = name == "TrumpApproval"
    y = np.array([float(t) if regression else bool(t) for _, t in rows])
    return Stream(name, regression, rows, X, y)


def river_model(s: Stream) -> Any:
    from river import linear_model, preprocessing

    return preprocessing.StandardScaler() | (linear_model.LinearRegression() if s.regression
                                             else linear_model.LogisticRegression())


def _river_at(lr: float) -> Any:
    """River's StandardScaler | LogisticRegression with plain SGD at ``lr`` (its default: 0.01)."""
    from river import linear_model, optim, preprocessing

    return preprocessing.StandardScaler() | linear_model.LogisticRegression(optimizer=optim.SGD(lr))


def river_pass(s: Stream, model: Any = None) -> float:
    """River's StandardScaler | LinearRegression / LogisticRegression, predict_one then learn_one: MAE or accuracy
    (a fresh model, or ``model`` going on learning)."""
    model = river_model(s) if model is None else model
    score = 0.0
    for x, t in s.rows:
        p = model.predict_one(x)
        score += abs(p - t) if s.regression else float(p == t)
        model.learn_one(x, t)
    return score / len(s.rows)


def _score(s: Stream, out: np.ndarray) -> float:
    if s.regression:
        return float(np.mean(np.abs(out.reshape(-1) - s.y)))
    return float(np.mean((out[:, 1] > 0.5) == s.y))


def chunked_pass(s: Stream, make: Callable[[], Any], chunk: int, est: Any = None) -> tuple[float, np.ndarray]:
    """predict then learn at the model's batch_size, ``chunk`` rows per ``partial_fit_predict`` call (a fresh
    model from ``make``, or ``est`` going on learning)."""
    fresh = est is None
    est = make() if fresh else est
    kw = {"classes": [False, True]} if fresh and not s.regression else {}
    outs = []
    for i in range(0, len(s.X), chunk):
        outs.append(est.partial_fit_predict(s.X[i:i + chunk], s.y[i:i + chunk], **kw))
        kw = {}
    out = np.concatenate(outs)
    return _score(s, out), out


def per_call_pass(s: Stream, make: Callable[[], Any], est: Any = None) -> tuple[float, np.ndarray]:
    """One ``partial_fit_predict`` call per row."""
    return chunked_pass(s, make, 1, est)


def learned(s: Stream, make: Callable[[], Any]) -> Any:
    """A model that has seen the stream once (its graphs built): what the timed passes go on training."""
    est = make()
    kw = {} if s.regression else {"classes": [False, True]}
    est.partial_fit(s.X, s.y, **kw)
    return est


def river_wrapper_pass(s: Stream) -> float:
    from river import evaluate, metrics

    from streamfit.river import RiverClassifier, RiverRegressor

    model = RiverRegressor() if s.regression else RiverClassifier()
    metric = metrics.MAE() if s.regression else metrics.Accuracy()
    return float(evaluate.progressive_val_score(s.rows, model, metric).get())


def section_streams(args: argparse.Namespace) -> None:
    import streamfit as sf

    print(f"\n== 1. River's streams, predict then learn, batch_size=1, chunks of {args.chunk} rows "
          f"(CPU s per pass, best of {args.rounds} rounds of {args.passes} passes)")
    print(f"{'stream':<14}{'rows':>6}  {'configuration':<30}{'streamfit s':>12}{'River s':>9}{'ratio':>7}  "
          f"{'metric':>9}{'River':>8}")
    for name in STREAMS:
        s = load(name, args.limit)
        if s.regression:
            river_cfg = lambda: sf.LinearRegressor(batch_size=1, optimizer="sgd", learning_rate="constant",  # noqa: E731
                                                   eta0=0.01, penalty=None)
            default = lambda: sf.LinearRegressor(batch_size=1)  # noqa: E731
        else:
            river_cfg = lambda: sf.LogisticRegression(batch_size=1, optimizer="sgd", learning_rate="constant",  # noqa: E731
                                                      eta0=0.01, penalty=None)
            default = lambda: sf.LogisticRegression(batch_size=1)  # noqa: E731
        # metrics: one pass of a fresh model (progressive, from untrained); times: further passes of models that
        # have seen the stream (their graphs built: the steady state per row, not the one-off build)
        last = {"river": river_pass(s), "cfg": chunked_pass(s, river_cfg, args.chunk),
                "default": chunked_pass(s, default, args.chunk), "wrapper": river_wrapper_pass(s)}
        warm = {"river": river_model(s), "cfg": learned(s, river_cfg), "default": learned(s, default)}
        river_pass(s, warm["river"])
        for key in ("cfg", "default"):
            chunked_pass(s, river_cfg, args.chunk, warm[key])  # the chunk-sized graphs too (make unused: a model given)
        times, _ = best_of({"river": lambda: river_pass(s, warm["river"]),
                            "cfg": lambda: chunked_pass(s, river_cfg, args.chunk, warm["cfg"]),
                            "default": lambda: chunked_pass(s, default, args.chunk, warm["default"])},
                           args.rounds, args.passes)
        times.update(best_of({"wrapper": lambda: river_wrapper_pass(s)}, 1)[0])  # information only: one pass
        ref = last["river"]
        metric = "MAE" if s.regression else "accuracy"
        for key, label, limit in (("cfg", "River's (sgd, constant 0.01)", 0.3), ("default", "defaults", 0.5)):
            ratio = times[key] / times["river"]
            value = last[key][0]
            v1 = target(f"{name}: {label}, time / River's", ratio, limit)
            if s.regression:
                v2 = target(f"{name}: {label}, MAE / River's", value / ref, 1.05)
            else:
                v2 = target(f"{name}: {label}, accuracy - River's", value - ref, -0.005, at_most=False)
            print(f"{name:<14}{len(s.X):>6}  {label:<30}{times[key]:>12.3f}{times['river']:>9.3f}{ratio:>7.2f}  "
                  f"{value:>9.4f}{ref:>8.4f}   time {v1}, {metric} {v2}")
            STREAM_RESULTS.append({"stream": name, "rows": len(s.X), "configuration": label, "streamfit_s": times[key],
                                   "river_s": times["river"], "time_ratio": ratio, "metric": metric, "value": value,
                                   "river_value": ref})
        if not s.regression:  # how much a linear learner's accuracy moves with its rate on this stream
            spread = [river_pass(s, _river_at(lr)) for lr in (0.005, 0.02)]
            majority = max(float(np.mean(s.y)), 1.0 - float(np.mean(s.y)))
            print(f"{'':<22}(information: the majority class is {majority:.4f}; River's accuracy at lr 0.005 and 0.02: "
                  f"{spread[0]:.4f}, {spread[1]:.4f}, against {ref:.4f} at its 0.01)")
        print(f"{name:<14}{len(s.X):>6}  {'RiverClassifier/Regressor()':<30}{times['wrapper']:>12.3f}"
              f"{times['river']:>9.3f}{times['wrapper'] / times['river']:>7.2f}  {last['wrapper']:>9.4f}{ref:>8.4f}"
              "   (information: River's progressive_val_score, one call per row, from untrained: its build timed)")


# -- Vowpal Wabbit on string columns -----------------------------------------------------------------------
def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def vw_pass(lines: list[str]) -> np.ndarray:
    from vowpalwabbit import Workspace

    vw = Workspace("--loss_function logistic --link logistic -b 18 --quiet")
    p = np.empty(len(lines))
    for i, line in enumerate(lines):
        ex = vw.parse(line)
        p[i] = vw.predict(ex)
        vw.learn(ex)
        vw.finish_example(ex)
    vw.finish()
    return p


def section_vw(args: argparse.Namespace) -> None:
    import streamfit as sf
    from streamfit.testing import ClickStream

    print(f"\n== 2. hashed LogisticRegression(categorical=16 string columns, optimizer='ftrl', default rate) "
          f"beside Vowpal Wabbit ({args.vw_rows:,} rows, progressive)")
    try:
        import vowpalwabbit  # noqa: F401
    except ImportError:
        print("   n/a: vowpalwabbit is not installed (pip install vowpalwabbit==9.11.9)")
        return
    stream = ClickStream(seed=0, n_categorical=16, n_dense=0, strings=True)
    table = stream.table(args.vw_rows)
    y = table.column("label").to_numpy().astype(np.float64)
    cols = [table.column(c).to_pylist() for c in stream.categorical]
    lines = [f"{1 if y[r] else -1} |c " + " ".join(f"{f}_{cols[f][r]}" for f in range(len(cols)))
             for r in range(len(y))]
    features = table.drop_columns(["label"])

    def streamfit_pass(batch: int, chunk: int) -> np.ndarray:
        est = sf.LogisticRegression(categorical=stream.categorical, optimizer="ftrl", batch_size=batch,
                                    buckets=1 << 18)
        outs, kw = [], {"classes": [0, 1]}
        for i in range(0, len(y), chunk):
            outs.append(est.partial_fit_predict(features.slice(i, chunk), y[i:i + chunk], **kw)[:, 1])
            kw = {}
        return np.concatenate(outs)

    big = max(1024, args.chunk)
    times, last = best_of({"vw": lambda: vw_pass(lines), "b1": lambda: streamfit_pass(1, args.chunk),
                           "b1024": lambda: streamfit_pass(1024, big)}, args.rounds)
    vw_rate, vw_loss = len(y) / times["vw"], log_loss(last["vw"], y)
    print(f"   {'VW (parse + predict + learn a line)':<60}{vw_rate:>10,.0f} rows/s   log loss {vw_loss:.4f}")
    for key, label, limit in (("b1", f"batch_size=1, chunks of {args.chunk}", 2.0), ("b1024", "batch_size=1024", 3.0)):
        rate, loss = len(y) / times[key], log_loss(last[key], y)
        v = target(f"hashed ftrl {label}: rows/s / VW's", rate / vw_rate, limit, at_most=False)
        line = f"   {'streamfit ' + label:<60}{rate:>10,.0f} rows/s   log loss {loss:.4f}   {rate / vw_rate:5.2f}x VW ({v})"
        if key == "b1":
            line += f", log loss / VW's {loss / vw_loss:.4f} ({target('hashed ftrl batch_size=1: log loss / VW', loss / vw_loss, 1.01)})"
        else:
            line += f", log loss / VW's {loss / vw_loss:.4f} (information)"
        print(line)
    _vw_floor(stream, features, y, args, vw_rate)


def _vw_floor(stream: Any, features: Any, y: np.ndarray, args: argparse.Namespace, vw_rate: float) -> None:
    """The floor of the batch_size=1 design: the trainer's chunks on ids hashed beforehand (no estimator, no
    hashing), and the Scan body's node count (the body's cost is its node count)."""
    import streamfit as sf

    est = sf.LogisticRegression(categorical=stream.categorical, optimizer="ftrl", batch_size=1, buckets=1 << 18)
    est.partial_fit(features.slice(0, args.chunk), y[:args.chunk], classes=[0, 1])
    enc = est._hashed_inputs()["ids"]
    ids = enc.encode(enc.new_state(), [features.column(c).combine_chunks() for c in stream.categorical])
    tr = est.trainer_
    T = y.astype(np.float32).reshape(-1, 1)

    def chunks() -> None:
        for i in range(0, len(y), args.chunk):
            tr.step_chunk({"ids": ids[i:i + args.chunk]}, T[i:i + args.chunk], batch_size=1)

    times, _ = best_of({"floor": chunks}, args.rounds)
    rate = len(y) / times["floor"]
    models = tr.__dict__["_chunk_steps"].models
    body = [len(n.attribute[0].g.node) for m in models.values() for n in m.graph.node if n.op_type == "Scan"]
    print(f"   {'floor: Trainer.step_chunk on hashed ids, chunks of ' + str(args.chunk):<60}{rate:>10,.0f} rows/s"
          f"   {rate / vw_rate:5.2f}x VW (information; Scan body of {body[0] if body else '?'} nodes, "
          f"{1e6 * times['floor'] / len(y):.2f} us a row)")
    from lean_bodies import lean_ftrl_seconds

    rows = min(args.chunk, len(ids))
    block = len(np.unique(ids[:rows])) + 1  # a chunk's distinct rows and the bias
    sec, nodes = lean_ftrl_seconds(ids.shape[1], block, rows, max(args.rounds, 3))
    print(f"   {'floor of the design: the leanest FTRL body ONNX allows':<60}{1 / sec:>10,.0f} rows/s"
          f"   {1 / sec / vw_rate:5.2f}x VW (information: bench/lean_bodies.py, {nodes} nodes over a block of {block} "
          f"rows, {1e6 * sec:.2f} us a row for the session run alone, before hashing and host work; the target: 2x)")


# -- one event per call ------------------------------------------------------------------------------------
def section_one_event(args: argparse.Namespace) -> None:
    import streamfit as sf
    from river import linear_model, preprocessing

    s = load("Phishing", args.limit)
    n = len(s.X)
    rows = [s.X[i:i + 1] for i in range(n)]
    labels = [s.y[i:i + 1] for i in range(n)]
    print(f"\n== 3. one event per call: Phishing ({n} rows), LogisticRegression() partial_fit_predict of one row "
          "beside River's predict_one + learn_one")

    est = sf.LogisticRegression()  # built once (its graphs are made on the first call): the steady state is timed
    est.partial_fit(rows[0], labels[0], classes=[False, True])
    model = preprocessing.StandardScaler() | linear_model.LogisticRegression()

    def ours() -> None:  # every pass goes on learning: the same model over the stream again
        pfp = est.partial_fit_predict
        for i in range(1, n):
            pfp(rows[i], labels[i])

    def theirs() -> None:
        for x, t in s.rows[1:]:
            model.predict_one(x)
            model.learn_one(x, t)

    fitted = sf.LogisticRegression()
    fitted.partial_fit(s.X, s.y, classes=[False, True])
    trainer = fitted.trainer_
    targets = [np.array([[float(t[0])]], np.float32) for t in labels]

    def steps() -> None:  # the engine's step alone on the same rows: no estimator around it
        step = trainer.step
        for i in range(1, n):
            step(rows[i], targets[i])

    ours()
    times, _ = best_of({"ours": ours, "river": theirs, "step": steps}, args.rounds)
    ratio = times["ours"] / times["river"]
    print(f"   streamfit {1e6 * times['ours'] / (n - 1):7.1f} us/row   River {1e6 * times['river'] / (n - 1):7.1f} "
          f"us/row   ratio {ratio:.2f} ({target('one Phishing event per call: time / River', ratio, 1.5)})")
    print(f"   Trainer.step of the same rows alone (the estimator's graph, no estimator): "
          f"{1e6 * times['step'] / (n - 1):7.1f} us/row, {times['step'] / times['river']:.2f}x River (information)")


# -- partial_fit at the default batch_size on 1024-row calls ------------------------------------------------
def partial_fit_fits(sf: Any, calls: int) -> dict[str, Callable[[], int]]:
    """Section 4's models of streamfit module ``sf``, each fitted once: a function per model that makes ``calls``
    ``partial_fit`` calls of 1024 rows (default batch_size=32) and returns the rows it gave."""
    from streamfit.testing import ClickStream

    rng = np.random.default_rng(0)
    X = rng.standard_normal((calls * 1024, 9)).astype(np.float32)
    w = rng.standard_normal(9)
    yc, yr = (X @ w > 0).astype(int), X @ w + 0.1 * rng.standard_normal(len(X))
    dense = [(X[i:i + 1024], yc[i:i + 1024]) for i in range(0, len(X), 1024)]
    dreg = [(X[i:i + 1024], yr[i:i + 1024]) for i in range(0, len(X), 1024)]
    cs = ClickStream(seed=0, n_categorical=16, n_dense=0, strings=True)
    hb = [(b.drop_columns(["label"]), b.column("label").to_numpy()) for b in (cs.batch(k, 1024) for k in range(calls))]
    out: dict[str, Callable[[], int]] = {}
    for name, make, data, kw in (
            ("LogisticRegression()", sf.LogisticRegression, dense, {"classes": [0, 1]}),
            ("LinearRegressor()", sf.LinearRegressor, dreg, {}),
            ("MLPClassifier()", lambda: sf.MLPClassifier(random_state=0), dense, {"classes": [0, 1]}),
            ("LogisticRegression(categorical=16 strings, ftrl)",
             lambda: sf.LogisticRegression(categorical=cs.categorical, optimizer="ftrl"), hb, {"classes": [0, 1]})):
        m = make()
        m.partial_fit(data[0][0], data[0][1], **kw)

        def fit(m: Any = m, data: list[tuple[Any, Any]] = data) -> int:
            for X_, y_ in data:
                m.partial_fit(X_, y_)
            return sum(len(y_) for _, y_ in data)

        fit()  # warm: onnxruntime's first runs of a session (its arena, its plan) are slower
        out[name] = fit
    return out


def partial_fit_rates(rounds: int, calls: int, trees: dict[str, Any]) -> dict[str, dict[str, float]]:
    """rows/s of section 4's models for each streamfit module of ``trees`` ({label: module}), all in this
    process, in interleaved rounds (each round in another order: a shared machine's speed moves between rounds
    and between processes), the best round of each."""
    fits = {(label, name): fit for label, sf in trees.items() for name, fit in partial_fit_fits(sf, calls).items()}
    keys = list(fits)
    best = dict.fromkeys(keys, float("inf"))
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            t = time.process_time()
            n = fits[key]()
            best[key] = min(best[key], (time.process_time() - t) / n)
    out: dict[str, dict[str, float]] = {label: {} for label in trees}
    for (label, name), seconds in best.items():
        out[label][name] = 1 / seconds
    return out


def _has_commit(rev: str) -> bool:
    """Whether this checkout has ``rev`` (a shallow clone may not)."""
    return subprocess.run(["git", "-C", ROOT, "cat-file", "-e", rev + "^{commit}"], capture_output=True).returncode == 0


def _renamed_tree(rev: str, where: str) -> Any:
    """``rev``'s streamfit package, imported in this process as ``streamfit_base``: its files taken from git
    (``git archive``), every ``streamfit`` name in its Python sources renamed, so both trees' code runs side by
    side in one interpreter (one process: the VM's speed varies by up to 1.7x from one process to the next)."""
    import importlib
    import io
    import re
    import tarfile

    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "streamfit"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    package = os.path.join(where, "streamfit_base")
    os.rename(os.path.join(where, "streamfit"), package)
    word = re.compile(r"\bstreamfit\b")
    for folder, _, files in os.walk(package):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(word.sub("streamfit_base", text))
    sys.path.insert(0, where)
    try:
        return importlib.import_module("streamfit_base")
    finally:
        sys.path.remove(where)


def section_partial_fit(args: argparse.Namespace) -> None:
    import streamfit

    calls = 2 if args.quick else 8
    rounds = max(args.rounds, 3) * 2  # two trees, four models: rounds are short
    print(f"\n== 4. partial_fit, default batch_size=32, {calls} calls of 1024 rows (rows/s, best of {rounds})")
    if args.baseline != "recorded" and not args.quick and _has_commit(args.baseline):
        with tempfile.TemporaryDirectory() as where:
            rates = partial_fit_rates(rounds, calls, {"now": streamfit, "base": _renamed_tree(args.baseline, where)})
        now, base = rates["now"], rates["base"]
        where = f"{args.baseline}, in this process, rounds interleaved with this tree's"
    else:
        now, base, where = partial_fit_rates(rounds, calls, {"now": streamfit})["now"], BASELINE_RATES, \
            f"{BASELINE}, recorded"
    print(f"   {'model':<52}{'now':>10}{'baseline':>10}{'ratio':>7}   (baseline: {where})")
    for name, rate in now.items():
        ratio = rate / base[name]
        print(f"   {name:<52}{rate:>10,.0f}{base[name]:>10,.0f}{ratio:>7.2f}   "
              f"{target(f'partial_fit 1024 rows, batch_size=32, {name}: rows/s / baseline', ratio, 3.0, at_most=False)}")
    for name, rate in _partial_fit_floor(rounds, calls).items():
        print(f"   {'floor: ' + name:<52}{rate:>10,.0f}{base[name]:>10,.0f}{rate / base[name]:>7.2f}   (information: "
              "Trainer.step_chunk on the same rows, no estimator around it: the ceiling of the ratio)")


def _partial_fit_floor(rounds: int, calls: int) -> dict[str, float]:
    """rows/s of the trainer's own chunks (``Trainer.step_chunk``, batch_size=32) under section 4's dense models, on
    its 1024-row calls: what is left once the estimator's host work (validation, the scalers' statistics per step,
    probabilities) is taken away."""
    import streamfit as sf

    rng = np.random.default_rng(0)
    X = rng.standard_normal((calls * 1024, 9)).astype(np.float32)
    w = rng.standard_normal(9)
    out = {}
    for name, make, y in (("LogisticRegression()", lambda: sf.LogisticRegression(), (X @ w > 0).astype(np.float32)),
                          ("LinearRegressor()", lambda: sf.LinearRegressor(),
                           (X @ w).astype(np.float32))):
        m = make()
        m.partial_fit(X[:1024], y[:1024], **({"classes": [0, 1]} if "Logistic" in name else {}))
        tr = m.trainer_
        T = y  # (n,): as the estimators hand their encoded labels and targets to the trainer
        for i in range(0, len(X), 1024):  # warm
            tr.step_chunk(X[i:i + 1024], T[i:i + 1024], batch_size=32)
        best = float("inf")
        for _ in range(rounds):  # as many rounds as section 4's
            t = time.process_time()
            for i in range(0, len(X), 1024):
                tr.step_chunk(X[i:i + 1024], T[i:i + 1024], batch_size=32)
            best = min(best, (time.process_time() - t) / len(X))
        out[name] = 1 / best
    return out


# -- the MLP in chunks against one call per row ----------------------------------------------------------
def section_mlp(args: argparse.Namespace) -> None:
    import streamfit as sf

    s = load("Phishing", args.limit)
    make = lambda: sf.MLPClassifier(batch_size=1, random_state=0)  # noqa: E731
    print(f"\n== 5. MLPClassifier(batch_size=1) on Phishing ({len(s.X)} rows): chunks of {args.chunk} rows against "
          "one call per row")
    last = {"chunks": chunked_pass(s, make, args.chunk), "per_call": per_call_pass(s, make)}
    warm = {"chunks": learned(s, make), "per_call": learned(s, make)}
    chunked_pass(s, make, args.chunk, warm["chunks"])
    per_call_pass(s, make, warm["per_call"])
    times, _ = best_of({"chunks": lambda: chunked_pass(s, make, args.chunk, warm["chunks"]),
                        "per_call": lambda: per_call_pass(s, make, warm["per_call"])}, args.rounds, args.passes)
    speedup = times["per_call"] / times["chunks"]
    diff = float(np.max(np.abs(last["chunks"][1] - last["per_call"][1])))
    print(f"   chunks {times['chunks']:.3f} s   one call per row {times['per_call']:.3f} s   speed-up {speedup:.2f} "
          f"({target('MLPClassifier(batch_size=1): chunks speed-up over one call per row', speedup, 5.0, at_most=False)}); "
          f"max |prediction difference| {diff:.2e} "
          f"({target('MLPClassifier(batch_size=1): max |chunk - per-call prediction|', diff, 1e-5)})")
    est = learned(s, make)  # the floor: the trainer's chunks alone, on the same rows
    tr = est.trainer_
    T = s.y.astype(np.float32).reshape(-1, 1)

    def chunks() -> None:
        for i in range(0, len(s.X), args.chunk):
            tr.step_chunk(s.X[i:i + args.chunk], T[i:i + args.chunk], batch_size=1)

    chunks()
    floor = best_of({"floor": chunks}, args.rounds, args.passes)[0]["floor"]
    body = [len(n.attribute[0].g.node) for m in tr.__dict__["_chunk_steps"].models.values()
            for n in m.graph.node if n.op_type == "Scan"]
    print(f"   floor: Trainer.step_chunk on the same rows {floor:.3f} s ({1e6 * floor / len(s.X):.1f} us a row, Scan body "
          f"of {body[0] if body else '?'} nodes): speed-up {times['per_call'] / floor:.2f} at most (information)")


# -- the floor -------------------------------------------------------------------------------------------
def section_floor(args: argparse.Namespace) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    x = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 9), np.float32))
    io.bind_ortvalue_input("x", x)
    io.bind_output("y")
    n = 2000 if args.quick else 50_000
    best = float("inf")
    for _ in range(args.rounds):
        t = time.process_time()
        for _ in range(n):
            sess.run_with_iobinding(io)
        best = min(best, (time.process_time() - t) / n)
    print(f"\n== 6. floor: one bound session run of a one-node graph on one row: {best * 1e6:.2f} us per run "
          "(a per-call learner pays it at least once per call; a chunk pays it once per chunk)")
    per_node = {kind: _loop_node_cost(kind, args) for kind in ("Scan", "Loop")}
    print("   a node in a loop body (one iteration per row; Add on a [1, 9] tensor, bodies of 4 and 32 nodes): "
          + ", ".join(f"{kind} {c * 1e6:.3f} us per node per iteration" for kind, c in per_node.items()))
    sgd, adam = _body_nodes(optimizer="sgd", learning_rate="constant", eta0=0.01, penalty=None), _body_nodes()
    print("   so a chunk's per-row time is about (body nodes) x that: River's configuration (SGD, streamfit's Scan "
          f"body of {sgd} nodes) {sgd * per_node['Scan'] * 1e6:.1f} us, the defaults (Adam, one parameter vector, "
          f"{adam} nodes) {adam * per_node['Scan'] * 1e6:.1f} us a row, before any host work")
    _lean_floor(args)


def _body_nodes(**params: Any) -> int:
    """The node count of the Scan body that ``LogisticRegression(batch_size=1, **params)`` trains 9-feature
    chunks with (its chunk graph, as built)."""
    import streamfit as sf

    X = np.random.default_rng(0).standard_normal((8, 9)).astype(np.float32)
    est = sf.LogisticRegression(batch_size=1, **params)
    est.partial_fit_predict(X, (X[:, 0] > 0).astype(int), classes=[0, 1])
    for model in est.trainer_._chunk_steps.models.values():
        for node in model.graph.node:
            if node.op_type == "Scan":
                return len(next(a.g for a in node.attribute if a.name == "body").node)
    raise RuntimeError("no chunk graph was built")


def _lean_floor(args: argparse.Namespace) -> None:
    """The leanest bodies ONNX allows (bench/lean_bodies.py), beside River's per-row time on each stream: what no
    Scan body can beat here, host work not counted."""
    from lean_bodies import lean_body_seconds

    from streamfit._engine.steps.fused_adam import kernel_available

    kernel = kernel_available()  # onnxruntime-training's Adam kernel: the defaults' body on this build

    print("   the leanest bodies ONNX allows (hand-written, bias folded in, Gemm-fused updates; they round otherwise "
          "than the step path, so streamfit does not run them), run as streamfit runs its bodies (intermediates "
          "exposed, buffers bound), per row alone, against River:")
    for name in STREAMS:
        s = load(name, args.limit)
        model = river_model(s)
        river_pass(s, model)
        river = best_of({"river": lambda: river_pass(s, model)}, args.rounds)[0]["river"] / len(s.X)
        width = s.X.shape[1]
        for kind, limit in (("sgd", 0.3), ("adam", 0.5)) + ((("adam_kernel", 0.5),) if kernel else ()):
            sec, nodes = lean_body_seconds(kind, width, sigmoid=not s.regression, rounds=args.rounds)
            label = "River's configuration" if kind == "sgd" else "the defaults (Adam)"
            print(f"     {name:<14}{width:>3} features  {kind:<11}{nodes:>3} nodes {sec * 1e6:6.2f} us a row  River "
                  f"{river * 1e6:6.2f} us  floor ratio {sec / river:.2f} (the target for {label}: {limit})")


def _loop_node_cost(kind: str, args: argparse.Namespace) -> float:
    """Seconds per node per iteration of a Scan (or Loop) whose body is a chain of Add nodes on one carried
    [1, 9] tensor: the slope between bodies of 4 and 32 nodes (the per-iteration cost cancels)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def model(k: int) -> Any:
        names = ["s"] + [f"a{i}" for i in range(k)]
        nodes = [helper.make_node("Add", [names[i], "x"], [names[i + 1]]) for i in range(k)]
        nodes.append(helper.make_node("Identity", [names[-1]], ["s_out"]))
        vi = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)  # noqa: E731
        if kind == "Scan":
            body = helper.make_graph(nodes, "body", [vi("s", [1, 9]), vi("x", [1, 9])], [vi("s_out", [1, 9])])
            top = [helper.make_node("Scan", ["s0", "xs"], ["s_final"], num_scan_inputs=1, body=body)]
            inputs = [vi("s0", [1, 9]), vi("xs", [None, 1, 9])]
        else:
            body = helper.make_graph(nodes + [helper.make_node("Identity", ["c"], ["c_out"])], "body",
                                     [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                      helper.make_tensor_value_info("c", TensorProto.BOOL, []), vi("s", [1, 9])],
                                     [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), vi("s_out", [1, 9])])
            top = [helper.make_node("Loop", ["n", "", "s0"], ["s_final"], body=body)]
            inputs = [helper.make_tensor_value_info("n", TensorProto.INT64, []), vi("s0", [1, 9]), vi("x", [1, 9])]
        g = helper.make_graph(top, "loop", inputs, [vi("s_final", [1, 9])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    rows = 64 if args.quick else 512
    feeds = {"s0": np.zeros((1, 9), np.float32)}
    feeds.update({"xs": np.ones((rows, 1, 9), np.float32)} if kind == "Scan" else
                 {"n": np.array(rows, np.int64), "x": np.ones((1, 9), np.float32)})
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    times = {}
    for k in (4, 32):
        sess = ort.InferenceSession(model(k).SerializeToString(), opts, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        best = float("inf")
        for _ in range(max(args.rounds, 3)):
            t = time.process_time()
            for _ in range(5):
                sess.run(None, feeds)
            best = min(best, (time.process_time() - t) / (5 * rows))
        times[k] = best
    return (times[32] - times[4]) / 28


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3, help="passes over the stream per timed round (sections 1, 5)")
    parser.add_argument("--chunk", type=int, default=256, help="rows per partial_fit_predict call in sections 1, 2, 5")
    parser.add_argument("--vw-rows", type=int, default=20_000)
    parser.add_argument("--baseline", default=BASELINE,
                        help=f"git revision whose tree section 4 measures in this run (default {BASELINE}), or "
                             "'recorded': its recorded figures")
    parser.add_argument("--sections", default="1,2,3,4,5,6")
    parser.add_argument("--json", metavar="PATH", help="also write section 1's figures and every target as JSON")
    args = parser.parse_args(argv)
    args.limit = None
    if args.quick:
        args.rounds, args.passes, args.limit, args.vw_rows, args.chunk = 1, 1, 300, 2048, 64
    import onnxruntime
    import streamfit

    env = run_env()
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# bench/perrow.py at {head or '?'}: CPU {cpu_model()} ({os.cpu_count()} cores), AVX-512 "
          f"{'yes' if has_avx512() else 'no'}, load average {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}, "
          f"onnxruntime {onnxruntime.__version__}, streamfit from {os.path.dirname(streamfit.__file__)}")
    sections = {"1": section_streams, "2": section_vw, "3": section_one_event, "4": section_partial_fit,
                "5": section_mlp, "6": section_floor}
    for key in args.sections.split(","):
        sections[key.strip()](args)
    print("\n== targets")
    for t in TARGETS:
        print(t.line())
    met = sum(t.ok for t in TARGETS)
    print(f"{met} of {len(TARGETS)} met")
    if args.json:
        write_json(args, env)
    return 0


def write_json(args: argparse.Namespace, env: dict[str, Any]) -> None:
    doc = {"env": {**env, "loadavg_end": list(os.getloadavg())},
           "config": {"quick": args.quick, "rounds": args.rounds, "chunk": args.chunk, "vw_rows": args.vw_rows,
                      "sections": args.sections, "limit": args.limit},
           "streams": STREAM_RESULTS,
           "targets": [{"what": t.what, "value": t.value, "limit": t.limit, "ok": t.ok} for t in TARGETS]}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
