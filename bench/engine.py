#!/usr/bin/env python
"""Engine benchmark: streamfit's training steps against scikit-learn, ORT's on-device training API and PyTorch.

    python bench/engine.py                 # full run, about 2-4 minutes on 2 cores
    python bench/engine.py --quick         # smoke run, a few seconds (CI)
    python bench/engine.py --threads 1 --cases mlp:1,mlp:256 --json /tmp/bench.json

Models: a linear model (d=100) and an MLP 100-256-256-1 (ReLU), float32, squared error, plain SGD, at batch
sizes 1, 32, 256 and 2048.  Paths (``--paths``):

    fused    streamfit Trainer(step="fused").step(X, y)
    fb       streamfit Trainer(step="forward_backward").step(X, y)
    pfit     streamfit OnnxRegressor(batch_size=B).partial_fit(X, y), one B-row call (one step) at a time
    sklearn  SGDRegressor.partial_fit (linear) / MLPRegressor(solver="sgd").partial_fit (MLP)
    ortapi   ORT on-device training API: Module train_step + Optimizer(SGD).step + lazy_reset_grad
    torch    PyTorch CPU eager (nn.Linear / MLP, SGD, MSELoss), only when torch is importable

Method: the machine is shared and noisy, so only ratios measured side by side mean much.  Every path of a
case is built, warmed up, and then timed in interleaved rounds: each round runs every path (starting from
a different one each round) for a fixed number of steps worth about ``--slice`` seconds.  A path's figure is
its median per-step time over the rounds; a ratio is the median over rounds of the per-round ratio of two
paths, so both sides of a ratio were measured within a second of each other.  All paths cycle over the same
pre-generated batches, and all get the same thread count (ORT intra-op threads, torch threads, BLAS threads
via threadpoolctl).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")):
    sys.path.insert(0, ROOT)  # measure the tree this script lives in, not whatever is installed
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/, also when imported as a module
from _cpu import cpu_model  # noqa: E402

import _peers  # noqa: E402
from _peers import Unavailable  # noqa: E402

MODELS = ("linear", "mlp")
BATCHES = (1, 32, 256, 2048)
PATHS = ("fused", "fb", "pfit", "sklearn", "ortapi", "torch")
LABELS = {
    "fused": "streamfit fused step",
    "fb": "streamfit forward/backward",
    "pfit": "streamfit partial_fit",
    "sklearn": "scikit-learn partial_fit",
    "ortapi": "ORT on-device API",
    "torch": "PyTorch eager",
}
N_FEATURES = 100
MLP_SIZES = (100, 256, 256, 1)
LR = 1e-3
N_DISTINCT = 8  # distinct pre-generated batches per case, cycled


# -- targets -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    model: str
    batch: int
    what: str  # "time": a / b step time (<= bound); "rate": a / b rows/s (>= bound)
    a: str
    b: str
    bound: float

    @property
    def label(self) -> str:
        if self.what == "time":
            return f"{self.model} bs={self.batch}: {LABELS[self.a]} time / {LABELS[self.b]} time"
        return f"{self.model} bs={self.batch}: {LABELS[self.a]} rows/s / {LABELS[self.b]} rows/s"


TARGETS = [
    Target("linear", 1, "time", "fused", "ortapi", 0.5),
    Target("linear", 1, "time", "pfit", "ortapi", 0.7),
    Target("mlp", 1, "time", "fused", "ortapi", 0.5),
    Target("mlp", 1, "time", "pfit", "ortapi", 0.7),
    Target("mlp", 256, "rate", "fused", "torch", 1.3),
    Target("mlp", 2048, "rate", "fused", "torch", 1.2),
    Target("mlp", 2048, "rate", "fused", "ortapi", 1.8),
]


# -- models and data ---------------------------------------------------------------------------------------
@dataclass
class ModelSpec:
    kind: str
    sizes: tuple[int, ...]
    proto: Any
    initial: dict[str, np.ndarray]
    n_weights: int
    art: Any = None  # OrtArtifacts, built once per model
    art_error: BaseException | None = None  # why there are none (Unavailable: n/a; anything else: an error)

    @property
    def title(self) -> str:
        if self.kind == "linear":
            return f"linear d={self.sizes[0]} ({self.n_weights} weights)"
        return f"MLP {'-'.join(map(str, self.sizes))} ReLU ({self.n_weights} weights)"


def make_model(kind: str) -> ModelSpec:
    from onnx import numpy_helper

    from streamfit._engine.testing import linear_model, mlp_model

    if kind == "linear":
        proto, sizes = linear_model(N_FEATURES, seed=0), (N_FEATURES, 1)
    else:
        proto, sizes = mlp_model(list(MLP_SIZES), "Relu", seed=0), MLP_SIZES
    initial = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    return ModelSpec(kind, sizes, proto, initial, sum(a.size for a in initial.values()))


def make_batches(batch: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)
    out = []
    for _ in range(N_DISTINCT):
        X = rng.standard_normal((batch, N_FEATURES)).astype(np.float32)
        y = (X @ w + 0.1 * rng.standard_normal(batch)).astype(np.float32)
        out.append((X, y))
    return out


def copy_proto(proto: Any) -> Any:
    new = type(proto)()
    new.CopyFrom(proto)
    return new


# -- streamfit steppers ------------------------------------------------------------------------------------
def make_streamfit(path: str, spec: ModelSpec, batch: int, batches: list[tuple[np.ndarray, np.ndarray]],
                   threads: int | None, spinning: bool) -> Callable[[int], None]:
    import itertools

    from streamfit import OnnxRegressor, Trainer

    it = itertools.cycle(batches)
    if path in ("fused", "fb"):
        trainer = Trainer(copy_proto(spec.proto), loss="squared_error", optimizer="sgd", learning_rate=LR,
                          step="fused" if path == "fused" else "forward_backward", threads=threads,
                          spinning=spinning)

        def run(n: int) -> None:
            for _ in range(n):
                X, y = next(it)
                trainer.step(X, y)

        run.keep = trainer  # type: ignore[attr-defined]
        return run
    reg = OnnxRegressor(copy_proto(spec.proto), batch_size=batch, learning_rate="constant", eta0=LR, penalty=None,
                        threads=threads)

    def run_pf(n: int) -> None:
        for _ in range(n):
            X, y = next(it)
            reg.partial_fit(X, y)

    run_pf.keep = reg  # type: ignore[attr-defined]
    return run_pf


def make_stepper(path: str, spec: ModelSpec, batch: int, batches: list[tuple[np.ndarray, np.ndarray]],
                 args: argparse.Namespace) -> Callable[[int], None]:
    if path in ("fused", "fb", "pfit"):
        return make_streamfit(path, spec, batch, batches, args.threads, not args.no_spinning)
    if path == "sklearn":
        return _peers.make_sklearn(spec.kind, spec.sizes, batch, batches, LR)
    if path == "ortapi":
        if spec.art is None:
            raise spec.art_error or Unavailable("no artifacts")
        run, keep = _peers.make_ort_api(spec.art, batches, LR, args.threads, not args.no_spinning)
        run.keep = keep  # type: ignore[attr-defined]
        return run
    if path == "torch":
        return _peers.make_torch(spec.kind, spec.sizes, spec.initial, batches, LR, args.threads)
    raise ValueError(path)


# -- measurement ---------------------------------------------------------------------------------------------
def settle(limit: float = 0.5) -> None:
    """Wait until no thread of this process burns CPU (at most ``limit`` seconds).

    Thread pools spin after a call: OpenBLAS workers (scikit-learn) for about 0.12 s here, ORT's and
    OpenMP's for a few ms.  Without this, the path timed right after scikit-learn loses a core.
    """
    end = time.perf_counter() + limit
    while time.perf_counter() < end:
        c0 = time.process_time()
        time.sleep(0.005)
        if time.process_time() - c0 < 0.0015:
            return


class CpuMeter:
    """CPU used by *other* processes during a slice, in cores: machine busy time (/proc/stat, including
    time stolen by the hypervisor) minus this process's CPU time.  None where /proc/stat is missing."""

    def __init__(self) -> None:
        self.ok = os.path.exists("/proc/stat")
        self.hz = os.sysconf("SC_CLK_TCK") if self.ok else 100

    def _busy(self) -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        return (sum(fields) - fields[3] - fields[4]) / self.hz  # all but idle and iowait

    def snap(self) -> tuple[float, float, float] | None:
        if not self.ok:
            return None
        return self._busy(), time.process_time(), time.perf_counter()

    @staticmethod
    def foreign(a: tuple[float, float, float] | None, b: tuple[float, float, float] | None) -> float | None:
        if a is None or b is None or b[2] <= a[2]:
            return None
        return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / (b[2] - a[2]))


@dataclass
class Slice:
    seconds_per_step: float
    steps: int
    foreign: float | None  # cores used by other processes meanwhile


@dataclass
class CaseResult:
    model: str
    batch: int
    rounds: list[dict[str, Slice]] = field(default_factory=list)
    na: dict[str, str] = field(default_factory=dict)  # path -> why not measured (missing package)
    errors: dict[str, str] = field(default_factory=dict)  # path -> error (a failure, not a missing package)
    quiet_limit: float = 0.25  # a slice is "clean" when other processes used less than this many cores
    min_clean: int = 3  # medians use clean slices only when there are at least this many

    def _clean(self, sl: Slice) -> bool:
        return sl.foreign is None or sl.foreign < self.quiet_limit

    def slices(self, path: str) -> tuple[list[Slice], bool]:
        """The slices a figure is taken from: the clean ones if there are enough, else all (False)."""
        every = [r[path] for r in self.rounds if path in r]
        clean = [sl for sl in every if self._clean(sl)]
        return (clean, True) if len(clean) >= self.min_clean else (every, False)

    def median(self, path: str) -> float | None:
        sl, _ = self.slices(path)
        return statistics.median(x.seconds_per_step for x in sl) if sl else None

    def spread(self, path: str) -> float | None:
        """Half the interquartile range of the per-slice times, relative to the median."""
        s = [x.seconds_per_step for x in self.slices(path)[0]]
        if len(s) < 3:
            return None
        q = statistics.quantiles(s, n=4)
        return (q[2] - q[0]) / 2 / statistics.median(s)

    def clean_count(self, path: str) -> tuple[int, int]:
        every = [r[path] for r in self.rounds if path in r]
        return sum(self._clean(x) for x in every), len(every)

    def paired(self, a: str, b: str) -> tuple[list[float], bool]:
        """Per-round ratios a/b, from the rounds where both slices were clean if there are enough (True)."""
        both = [(r[a], r[b]) for r in self.rounds if a in r and b in r]
        clean = [(x, y) for x, y in both if self._clean(x) and self._clean(y)]
        use, ok = (clean, True) if len(clean) >= self.min_clean else (both, False)
        return [x.seconds_per_step / y.seconds_per_step for x, y in use], ok

    def time_ratio(self, a: str, b: str) -> tuple[float, float, float, bool] | None:
        """a's step time / b's step time: median and interquartile range of the per-round ratios, and
        whether they come from clean rounds."""
        r, ok = self.paired(a, b)
        if not r:
            return None
        if len(r) < 3:
            return statistics.median(r), min(r), max(r), ok
        q = statistics.quantiles(r, n=4)
        return statistics.median(r), q[0], q[2], ok

    def rate_ratio(self, a: str, b: str) -> tuple[float, float, float, bool] | None:
        """a's rows/s / b's rows/s (= b's time / a's time)."""
        return self.time_ratio(b, a)

    def foreign_mean(self) -> float | None:
        f = [sl.foreign for r in self.rounds for sl in r.values() if sl.foreign is not None]
        return statistics.fmean(f) if f else None


def fail(path: str, exc: BaseException, case: CaseResult, verbose: bool) -> None:
    if isinstance(exc, Unavailable):
        case.na[path] = str(exc)
    else:
        case.errors[path] = f"{type(exc).__name__}: {exc}"
        if verbose:
            traceback.print_exc()


def measure(spec: ModelSpec, batch: int, paths: list[str], args: argparse.Namespace, allowance: float,
            log: Callable[[str], None]) -> CaseResult:
    """Warm every path up, then interleaved rounds: ``args.rounds`` of them, and more (up to twice as many,
    within ``allowance`` seconds) while some path has fewer clean slices than rounds."""
    t_case = time.perf_counter()
    case = CaseResult(spec.kind, batch, quiet_limit=args.quiet)
    meter = CpuMeter()
    batches = make_batches(batch, seed=batch)
    steppers: dict[str, Callable[[int], None]] = {}
    chunk: dict[str, int] = {}
    for path in paths:
        try:
            run = make_stepper(path, spec, batch, batches, args)
            run(1)  # builds sessions / per-shape bindings
            settle(args.settle)
            done, n, t0 = 0, 1, time.perf_counter()
            while True:
                run(n)
                done += n
                elapsed = time.perf_counter() - t0
                if elapsed >= args.warmup and done >= 3:
                    break
                n = min(2 * n, max(1, done))
            steppers[path] = run
            chunk[path] = max(1, round(args.slice / 8 / (elapsed / done)))  # ~8 clock reads per slice
        except Exception as exc:  # noqa: BLE001 - reported in the table
            fail(path, exc, case, args.verbose)
    names = list(steppers)
    r = 0
    while names:
        if r >= args.rounds:
            short = min(case.clean_count(p)[0] for p in names)
            if (short >= args.rounds or r >= 2 * args.rounds or args.quick
                    or time.perf_counter() - t_case > allowance):
                break
        order = names[r % len(names):] + names[:r % len(names)]
        row: dict[str, Slice] = {}
        for path in order:
            if path in case.errors:
                continue
            gc.collect()
            settle(args.settle)
            try:
                k, steps = chunk[path], 0
                a = meter.snap()
                t0 = time.perf_counter()
                while True:
                    steppers[path](k)
                    steps += k
                    elapsed = time.perf_counter() - t0
                    if elapsed >= args.slice:
                        break
                b = meter.snap()
                row[path] = Slice(elapsed / steps, steps, CpuMeter.foreign(a, b))
            except Exception as exc:  # noqa: BLE001
                fail(path, exc, case, args.verbose)
        case.rounds.append(row)
        names = [p for p in names if p not in case.errors]
        r += 1
    for path in case.errors:
        for row in case.rounds:
            row.pop(path, None)
    parts = []
    for path in paths:
        m = case.median(path)
        parts.append(f"{path} {fmt_us(m)}" if m is not None else f"{path} n/a")
    fm = case.foreign_mean()
    log(f"  {spec.kind:6s} bs={batch:<5d} " + ", ".join(parts) + f"  [{len(case.rounds)} rounds, "
        f"{time.perf_counter() - t_case:.1f}s, other processes {'?' if fm is None else f'{fm:.2f}'} cores]")
    steppers.clear()
    gc.collect()
    return case


# -- formatting --------------------------------------------------------------------------------------------
def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    us = seconds * 1e6
    if us >= 10000:
        return f"{us / 1000:.1f}ms"
    if us >= 100:
        return f"{us:.0f}us"
    return f"{us:.1f}us"


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "n/a"
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M"
    if rate >= 1e4:
        return f"{rate / 1e3:.0f}K"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f}K"
    return f"{rate:.0f}"


def fmt_ratio(r: tuple[float, float, float, bool] | None) -> str:
    return "n/a" if r is None else f"{r[0]:.2f}x" + ("" if r[3] else "*")


def cell_missing(case: CaseResult, path: str) -> str:
    if path in case.errors:
        return "ERROR"
    return "n/a"


def print_tables(specs: dict[str, ModelSpec], results: list[CaseResult], paths: list[str], args: argparse.Namespace,
                 out: Callable[[str], None]) -> None:
    W = 17
    for kind in MODELS:
        rows = [c for c in results if c.model == kind]
        if not rows:
            continue
        spec = specs[kind]
        head = f"{'':28s}" + "".join(f"{'bs=' + str(c.batch):>{W}s}" for c in rows)
        out("")
        out(f"== {spec.title} ==")
        out(f"us/step: median over interleaved rounds of the slices during which other processes used < {args.quiet}"
            f" cores (* = fewer than 3 such slices: all used); +-: half the IQR, % of median")
        out(head)
        for path in paths:
            cells = []
            for c in rows:
                m = c.median(path)
                if m is None:
                    cells.append(f"{cell_missing(c, path):>{W}s}")
                    continue
                s = c.spread(path)
                txt = fmt_us(m) + (f" +-{s * 100:.0f}%" if s is not None else "") + ("" if c.slices(path)[1] else "*")
                cells.append(f"{txt:>{W}s}")
            out(f"{LABELS[path]:28s}" + "".join(cells))
        cells = []
        for c in rows:
            counts = [c.clean_count(p) for p in paths if c.clean_count(p)[1]]
            txt = f"{min(x[0] for x in counts)}/{len(c.rounds)}" if counts else "-"
            cells.append(f"{txt:>{W}s}")
        out(f"{'(clean slices/rounds, min)':28s}" + "".join(cells))
        cells = [f"{('?' if c.foreign_mean() is None else f'{c.foreign_mean():.2f}'):>{W}s}" for c in rows]
        out(f"{'(other processes, cores)':28s}" + "".join(cells))
        out("rows/s")
        out(head)
        for path in paths:
            cells = []
            for c in rows:
                m = c.median(path)
                cells.append(f"{(fmt_rate(c.batch / m) if m else cell_missing(c, path)):>{W}s}")
            out(f"{LABELS[path]:28s}" + "".join(cells))
        out("step-time ratios, median of per-round pairs (< 1: faster than the on-device API; * = from disturbed rounds)")
        out(head)
        for path in [p for p in paths if p != "ortapi"]:
            cells = [f"{fmt_ratio(c.time_ratio(path, 'ortapi')):>{W}s}" for c in rows]
            out(f"{(path + ' / ortapi'):28s}" + "".join(cells))
        out("fused speed-up, rows/s ratio, median of per-round pairs (> 1: fused is faster; * = from disturbed rounds)")
        out(head)
        for peer in [p for p in paths if p != "fused"]:
            cells = [f"{fmt_ratio(c.rate_ratio('fused', peer)):>{W}s}" for c in rows]
            out(f"{('fused vs ' + peer):28s}" + "".join(cells))
    errors = [(c, p, e) for c in results for p, e in c.errors.items()]
    if errors:
        out("")
        out("ERRORS")
        for c, p, e in errors:
            out(f"  {c.model} bs={c.batch} {p}: {e}")
    na = sorted({(p, e) for c in results for p, e in c.na.items()})
    for p, e in na:
        out(f"n/a: {p}: {e}")


def evaluate_targets(results: list[CaseResult]) -> list[dict[str, Any]]:
    rows = []
    for t in TARGETS:
        case = next((c for c in results if c.model == t.model and c.batch == t.batch), None)
        if case is None:
            continue
        r = case.time_ratio(t.a, t.b) if t.what == "time" else case.rate_ratio(t.a, t.b)
        if r is None:
            status = "n/a"
        else:
            met = r[0] <= t.bound if t.what == "time" else r[0] >= t.bound
            status = "met" if met else "MISSED"
            lo, hi = r[1], r[2]
            if not r[3]:
                status += " (UNRELIABLE: other processes were busy)"
            elif lo <= t.bound <= hi:
                status += " (within noise)"
        rows.append({"model": t.model, "batch": t.batch, "kind": t.what, "a": t.a, "b": t.b, "label": t.label,
                     "bound": t.bound, "measured": None if r is None else r[0],
                     "iqr": None if r is None else [r[1], r[2]], "clean": None if r is None else r[3],
                     "status": status})
    return rows


def print_targets(rows: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    if not rows:
        return
    out("")
    out("== targets (ratios are medians of per-round pairs; [IQR across rounds]) ==")
    width = max(len(r["label"]) for r in rows)
    for r in rows:
        sign = "<=" if r["kind"] == "time" else ">="
        meas = "n/a" if r["measured"] is None else f"{r['measured']:.2f}x [{r['iqr'][0]:.2f}-{r['iqr'][1]:.2f}]"
        out(f"  {r['label']:{width}s}  {meas:>19s}  target {sign} {r['bound']:.2f}x  {r['status']}")


# -- environment -------------------------------------------------------------------------------------------
def environment(args: argparse.Namespace, torch_mod: Any, limiter: Any) -> dict[str, Any]:
    import onnxruntime as ort

    import streamfit

    env: dict[str, Any] = {
        "python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "processor": cpu_model(), "numpy": np.__version__, "onnxruntime": ort.__version__,
        "streamfit": os.path.dirname(streamfit.__file__),
        "threads": args.threads, "ort_spinning": not args.no_spinning,
        "env_vars": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                 "OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ},
    }
    try:
        import sklearn

        env["sklearn"] = sklearn.__version__
    except ImportError:
        env["sklearn"] = None
    env["torch"] = None if torch_mod is None else {"version": torch_mod.__version__,
                                                   "threads": torch_mod.get_num_threads()}
    try:
        from threadpoolctl import threadpool_info

        env["threadpools"] = [{k: d.get(k) for k in ("user_api", "internal_api", "version", "num_threads",
                                                     "architecture", "threading_layer")}
                              | {"lib": os.path.basename(d.get("filepath", ""))} for d in threadpool_info()]
    except ImportError:
        env["threadpools"] = None
    env["blas_limited_by_threadpoolctl"] = limiter is not None
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        env["numpy_blas"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
    except Exception:  # noqa: BLE001 - older numpy
        env["numpy_blas"] = None
    return env




def print_env(env: dict[str, Any], out: Callable[[str], None]) -> None:
    out("== environment ==")
    out(f"python {env['python']} on {env['machine']}, {env['cpu_count']} CPUs ({env['processor']})")
    out(f"numpy {env['numpy']}, BLAS {env.get('numpy_blas')}")
    out(f"onnxruntime {env['onnxruntime']}, scikit-learn {env['sklearn']}, "
        f"torch {env['torch']['version'] + ' (' + str(env['torch']['threads']) + ' threads)' if env['torch'] else 'not importable'}")
    out(f"streamfit from {env['streamfit']}")
    out(f"threads: {env['threads']} for every path (ORT intra-op, torch, BLAS via threadpoolctl: "
        f"{'yes' if env['blas_limited_by_threadpoolctl'] else 'NO (threadpoolctl missing)'}); "
        f"ORT spinning {'on' if env['ort_spinning'] else 'off'}; env {env['env_vars'] or 'no thread env vars set'}")
    for tp in env.get("threadpools") or []:
        out(f"  thread pool: {tp['internal_api']} {tp.get('version') or ''} {tp.get('architecture') or ''} "
            f"({tp['lib']}): {tp['num_threads']} threads")


# -- main --------------------------------------------------------------------------------------------------
def parse_cases(spec: str | None) -> list[tuple[str, int]]:
    if not spec:
        return [(m, b) for m in MODELS for b in BATCHES]
    cases: list[tuple[str, int]] = []
    for token in spec.split(","):
        token = token.strip().lower()
        if not token:
            continue
        model, _, bs = token.partition(":")
        if model not in MODELS:
            raise SystemExit(f"--cases: unknown model {model!r} in {token!r}; expected {MODELS} or MODEL:BATCH")
        for b in ([int(bs)] if bs else BATCHES):
            if b < 1:
                raise SystemExit(f"--cases: bad batch size in {token!r}")
            if (model, b) not in cases:
                cases.append((model, b))
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Targets: fused bs-1 step <= 0.5x the on-device API's; partial_fit bs 1 <= 0.7x it; "
                                       "MLP bs 2048 >= 1.2x PyTorch and >= 1.8x the on-device API; MLP bs 256 >= 1.3x PyTorch.")
    p.add_argument("--quick", action="store_true", help="short smoke run (a few seconds)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for every path (default: %(default)s, the CPU count)")
    p.add_argument("--cases", help="comma list of MODEL or MODEL:BATCH (models: linear, mlp); default all x 1,32,256,2048")
    p.add_argument("--paths", default=",".join(PATHS), help="comma list of %(default)s")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 7, more while slices are disturbed; "
                                              "3 with --quick)")
    p.add_argument("--slice", type=float, help="seconds per path per round (default 0.25; 0.03 with --quick)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per path and case (default 0.2; 0.02 with --quick)")
    p.add_argument("--quiet", type=float, default=0.25, metavar="CORES",
                   help="a slice counts as clean when other processes used fewer cores meanwhile (default %(default)s)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="time for the whole run; extra rounds stop when it runs out (default 210; 20 with --quick)")
    p.add_argument("--no-spinning", action="store_true", help="ORT intra-op threads do not spin (streamfit and ortapi)")
    p.add_argument("--json", metavar="PATH", help="also write every figure and per-round sample as JSON")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing paths")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.slice = args.slice or (0.03 if args.quick else 0.25)
    args.budget = args.budget or (20.0 if args.quick else 210.0)
    args.settle = 0.03 if args.quick else 0.5  # longest wait for other paths' spinning threads to stop
    args.warmup = args.warmup if args.warmup is not None else (0.02 if args.quick else 0.2)
    if args.threads < 1:
        p.error("--threads must be >= 1")
    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    bad = [x for x in paths if x not in PATHS]
    if bad:
        p.error(f"unknown paths {bad}; expected some of {PATHS}")
    cases = parse_cases(args.cases)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    # Import everything that brings a thread pool before limiting them.
    torch_mod = None
    if "torch" in paths:
        try:
            torch_mod = _peers.import_torch()
            torch_mod.set_num_threads(args.threads)
        except Unavailable:
            torch_mod = None
    try:
        import sklearn.linear_model  # noqa: F401
        import sklearn.neural_network  # noqa: F401
    except ImportError:
        pass
    import streamfit  # noqa: F401
    try:
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(limits=args.threads)
    except ImportError:
        limiter = None

    gc.collect()
    gc.freeze()  # imported modules' objects: a full collection between slices then takes microseconds, not 50 ms
    specs = {kind: make_model(kind) for kind in dict.fromkeys(m for m, _ in cases)}
    tmp = tempfile.TemporaryDirectory(prefix="streamfit-bench-")
    if "ortapi" in paths:
        for kind, spec in specs.items():
            try:
                spec.art = _peers.OrtArtifacts(spec.proto, os.path.join(tmp.name, kind))
            except Exception as exc:  # noqa: BLE001 - reported per case (n/a or ERROR)
                spec.art_error = exc
                if args.verbose and not isinstance(exc, Unavailable):
                    traceback.print_exc()
    env = environment(args, torch_mod, limiter)
    log(f"setup took {time.perf_counter() - t_start:.1f}s")
    log(f"measuring {len(cases)} cases x {len(paths)} paths, {args.rounds} rounds x {args.slice}s slices ...")
    results: list[CaseResult] = []
    try:
        for i, (kind, batch) in enumerate(cases):
            allowance = (args.budget - (time.perf_counter() - t_start)) / (len(cases) - i)
            results.append(measure(specs[kind], batch, paths, args, allowance, log))
    finally:
        tmp.cleanup()
    env["loadavg_start"] = list(load_start)
    env["loadavg_end"] = list(os.getloadavg())
    env["seconds"] = round(time.perf_counter() - t_start, 1)

    out = print
    print_env(env, out)
    out(f"load average (1/5/15 min) at start {', '.join(f'{x:.2f}' for x in load_start)}, at end "
        f"{', '.join(f'{x:.2f}' for x in env['loadavg_end'])}; run took {env['seconds']}s")
    out(f"method: lr {LR}, float32, {N_DISTINCT} pre-generated batches per case cycled; warm-up {args.warmup}s, then "
        f"{args.rounds}+ interleaved rounds of ~{args.slice}s per path (rotated order, idle threads settled between)")
    if args.quick:
        out("--quick: a smoke run; its figures are indicative only")
    print_tables(specs, results, paths, args, out)
    targets = evaluate_targets(results)
    print_targets(targets, out)

    if args.json:
        doc = {
            "env": env,
            "config": {"quick": args.quick, "rounds": args.rounds, "slice_s": args.slice, "warmup_s": args.warmup,
                       "quiet_cores": args.quiet, "budget_s": args.budget,
                       "threads": args.threads, "paths": paths, "lr": LR, "labels": LABELS},
            "ort_artifact_ir_versions": {k: (s.art.ir_versions if s.art else None) for k, s in specs.items()},
            "cases": [{
                "model": c.model, "batch": c.batch,
                "paths": {path: {"us_per_step": c.median(path) * 1e6, "rows_per_s": c.batch / c.median(path),
                                 "spread": c.spread(path), "from_clean_slices": c.slices(path)[1],
                                 "clean_slices": c.clean_count(path)[0]}
                          for path in paths if c.median(path) is not None},
                "rounds": [{path: {"us_per_step": sl.seconds_per_step * 1e6, "steps": sl.steps,
                                   "other_processes_cores": sl.foreign} for path, sl in row.items()}
                           for row in c.rounds],
                "time_ratio_vs_ortapi": {path: c.time_ratio(path, "ortapi") for path in paths if path != "ortapi"},
                "fused_rate_ratio": {peer: c.rate_ratio("fused", peer) for peer in paths if peer != "fused"},
                "na": c.na, "errors": c.errors,
            } for c in results],
            "targets": targets,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        out(f"\nwrote {args.json}")
    return 1 if any(c.errors for c in results) else 0


if __name__ == "__main__":
    sys.exit(main())
