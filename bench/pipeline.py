#!/usr/bin/env python
"""Streaming pipeline benchmark: rows/s of the async training loop end to end, from Parquet and from Kafka,
beside the in-memory training rate of the same model and the raw read/decode rate of the same source.

    python bench/pipeline.py                # full run, about 4-5 minutes on 2 cores
    python bench/pipeline.py --quick        # smoke run, < 30 s (CI)
    python bench/pipeline.py --sources parquet --layouts vec --models mlp --rounds 3
    python bench/pipeline.py --profile      # also break every loop's time down (see below)

Models: an MLP 100-256-256-1 (ReLU) and a linear model d=100, float32, squared error, plain SGD, both at
batch 2048 (``--batch``): the loop's ``batch_size`` and the estimator's ``batch_size``, so one
``partial_fit`` call is one optimizer step.  ``mlp`` and ``linear`` use streamfit's default threads
(``threads=None``: a heavy step, like the MLP's, on one ORT intra-op thread per core, spinning between ops;
a light one, like the linear model's 2048 x 101, on one thread; ``--threads`` to force a count),
``linear-t1`` is the linear model with one thread given explicitly: a step of 2048 x 100 gains little from
a second thread, whose spinning takes CPU from the reader and the broker.

Sources (the columns of the tables):

    parquet/vec     a Parquet directory, one FixedSizeList<float32,100> column + y (the zero-copy path)
    parquet/mixed   20 float32 columns + one FixedSizeList<float32,80> column + y (the loop's feature spec
                    combines plain and list columns; copied into X)
    parquet/cols    100 float32 columns + y (add with ``--layouts``)
    kafka/vec       a topic on a tansu broker started here (127.0.0.1, free port, memory storage): one Arrow
                    IPC stream message of 4096 rows (vec layout) per Kafka message, one partition;
                    KafkaSource with its default options (consume up to 500 messages, 0.02 s timeout,
                    one consume call fetched ahead by a thread)
    kafka/vec p10ms the same with ``poll_timeout=0.01`` (a 10 ms consume timeout)
    kafka/vec noahead  the defaults with ``fetch_ahead=0`` (fetch on demand; add with ``--kafka-variants``)
    kafka/vec qb1000   the defaults with librdkafka's ``fetch.queue.backoff.ms=1000`` (its default; KafkaSource
                    sets 10 ms; add with ``--kafka-variants``)
    parquet/* t1    ParquetSource(use_threads=False): pyarrow decodes in the reading thread, not in its CPU
                    pool; b16k, b8k: record batches of 16384 / 8192 rows (add with ``--parquet-variants``)

The Parquet data is one file written once to a temporary directory (uncompressed, row groups of 65536),
listed as several ``part-*.parquet`` symlinks to it so a long run reads from the page cache.

Paths, all measured in each source's interleaved rounds (round r starts with path r mod n); medians:

    read              iterate the Source, convert every record batch to numpy X (n, 100) + y; no training
    rebatch           the Source through the loop's Rebatcher (2048-row training batches); no training
    <model> memory    estimator.partial_fit on pre-made C-contiguous numpy batches (no I/O)
    <model> loop      streamfit's StreamLoop (train_stream), progressive validation on (evaluate=True)
    <model> noeval    the same, evaluate=False
    <model> loop-mem  the loop from a MemorySource of the same record batches already decoded in memory
                      (the loop's own overhead, no reading; Parquet sources only)

Steady-state rates: a loop is timed from its first trained batch after a warm-up (the 7th batch, and for
Parquet at least 0.5 s, while pyarrow's scanner fills its read-ahead of 4 x 65536 rows) to its 7th-last
batch; a Parquet read from its first batch.  Kafka: every sample consumes the whole topic (~1M rows) with a
new consumer group; the group join (~1.2 s on tansu) and the first ``consume`` call (which returns what
was fetched meanwhile, a burst) are excluded: reads and loops are timed from the second fetch on (with
fetch-ahead: from the call that returns the first batch of the second ``consume`` call, see :class:`Probe`).
``memory`` is timed over all its steps (the estimator is warm).  Ratios are medians of same-round pairs.
CPU use is this process's (``time.process_time``: all threads) plus, for Kafka, the broker's.

Targets (issue "async streaming loop"):

    Parquet: MLP loop rows/s >= 90 % of MLP in-memory training rows/s   (checked on every Parquet layout)
    Kafka:   linear loop rows/s >= 90 % of raw consume+decode rows/s     (every Kafka variant; linear and
             linear-t1)

The tables also give a CPU ceiling per model and source: cores / (core-us per row of in-memory training +
core-us per row of the read, the broker's CPU included), the loop's rate if reading and training overlapped
perfectly and only CPU limited them; on 2 cores the Parquet read alone keeps the MLP loop below ~90 %.

``--profile`` (and automatically, in a full run, every missed target) runs the loop once more with timers:
the estimator call and the metrics rows computed in the worker thread, the thread hand-off and per-batch
bookkeeping on the event loop, the time the trainer waited for a batch, the time in ``source.__anext__``
(and how many calls took > 50 ms) and in the rebatcher; totals over the whole run, per training batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402  (puts the repository root on sys.path)
import anyio  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from streamfit._stream import StreamLoop  # noqa: E402
from streamfit._stream.batching import IN_FLIGHT_EXTRA, Rebatcher  # noqa: E402
from streamfit._columns.plan import ColumnPlan  # noqa: E402
from streamfit.sources import MemorySource, Source, SourceBatch, open_source  # noqa: E402

QUEUE_SIZE = 4  # the loop's default
TRIM = QUEUE_SIZE + IN_FLIGHT_EXTRA  # batches dropped at each end of a loop's timing window
TARGET = 0.90
KAFKA_MESSAGE_ROWS = 4096
#: librdkafka settings: fast group joins on tansu, short fetch waits, room for the 1.6 MB messages.
KAFKA_CONFIG = {"session.timeout.ms": 1000, "heartbeat.interval.ms": 100, "fetch.wait.max.ms": 10,
                "max.partition.fetch.bytes": 8 * 2**20}
#: KafkaSource options per variant (URI query): its defaults, a 10 ms consume timeout, and no fetch-ahead
#: (fetch on demand: the behaviour before fetch-ahead; only when asked for with --kafka-variants).
KAFKA_VARIANTS = {"default": "", "p10ms": "&poll_timeout=0.01", "noahead": "&fetch_ahead=0",
                  "qb1000": "&fetch.queue.backoff.ms=1000"}
DEFAULT_KAFKA_VARIANTS = ("default", "p10ms")
#: ParquetSource options per variant (URI query): its defaults, decoding in the reading thread only
#: (pyarrow's CPU pool off), smaller record batches (only when asked for with --parquet-variants).
PARQUET_VARIANTS = {"default": "", "t1": "?use_threads=false", "b16k": "?batch_size=16384", "b8k": "?batch_size=8192"}
#: "linear-t1" is the linear model with one ORT intra-op thread (ORT's default is one per core, spinning).
MODELS = ("mlp", "linear", "linear-t1")


def model_kind(model: str) -> str:
    return model.split("-")[0]


def model_threads(model: str, threads: int | None) -> int | None:
    return 1 if model.endswith("-t1") else threads


def model_title(model: str, threads: int | None) -> str:
    t = model_threads(model, threads)
    return C.model_title(model_kind(model)) + f", ORT intra-op threads {t or 'default'}"
SOURCE_PATHS = ("read", "rebatch")
MODEL_PATHS = ("memory", "loop", "noeval", "loop-mem")
LABELS = {
    "read": "source read + to numpy",
    "rebatch": "source + Rebatcher, no training",
    "memory": "in-memory partial_fit",
    "loop": "loop (evaluate=True)",
    "noeval": "loop (evaluate=False)",
    "loop-mem": "loop from MemorySource",
}


def rows_per_sample(what: str, source: str, quick: bool, scale: float, rate: float | None = None) -> int:
    """Rows read or trained per sample, about 1.5-2.5 s each in a full run on 2 cores (Kafka: see main).

    The MLP trains at ~100K rows/s on a busy machine and ~380K on an idle one: its samples are sized from
    ``rate``, its in-memory rate measured at start-up (2 s worth).  Linear loops from Parquet are bound by the
    read (1-2.5M rows/s) and start their window after ``5 x 65536`` rows (the scanner's read-ahead).
    """
    if model_kind(what) == "mlp" and source == "parquet":
        full = int(min(max(2.0 * (rate or 1e5), 200_000), 1_500_000))
    else:
        full = {("linear", "parquet"): 2_500_000, ("read", "parquet"): 2_500_000,
                ("read", "kafka"): 400_000}[(model_kind(what), source)]
    n = full // 12 if quick else full
    # a multiple of the record batches' 65536 rows: a loop's max_rows then ends at a record batch boundary
    # (streamfit's Rebatcher emits an empty training batch when max_rows ends inside a record batch on the
    # zero-copy path, and partial_fit refuses it: see the report)
    return max(65536, -(-int(n * scale) // 65536) * 65536)


# -- cases -------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One source (a column of the tables); its paths (read, and per model) are interleaved together."""

    source: str  # "parquet" | "kafka"
    layout: str
    variant: str
    uri: Callable[[], str]  # a fresh URI per run (Kafka: a new consumer group)
    rows: dict[str, int]  # rows per sample: "read" and per model
    warmup_s: float
    models: list[str] = field(default_factory=list)
    warmup_rows: int = 0
    mem_batches: list[pa.RecordBatch] | None = None
    total_rows: int | None = None  # rows in the Kafka topic
    rounds: Any = None  # C.Rounds, keys "read", "rebatch", "mlp:loop", ...
    profile: list[dict[str, Any]] = field(default_factory=list)

    @property
    def column(self) -> str:
        return f"{self.source}/{self.layout}" + ("" if self.variant == "default" else f" {self.variant}")

    def targets(self) -> list[tuple[str, str, str, str]]:
        """(model, a, b, text): the issue's targets here, rows/s of a / rows/s of b >= TARGET."""
        models = self.models
        if self.source == "parquet":
            return [(m, f"{m}:loop", f"{m}:memory", f"{m} loop >= 90% of in-memory training")
                    for m in models if model_kind(m) == "mlp"]
        if self.source == "kafka":
            return [(m, f"{m}:loop", "read", f"{m} loop >= 90% of raw consume+decode")
                    for m in models if model_kind(m) == "linear"]
        return []


# -- numpy conversion (the "read" path) ----------------------------------------------------------------------
class ToNumpy:
    """Record batch -> (X (n, 100) float32 C-contiguous, y): zero-copy for the vec layout, else into a reused
    buffer, column by column (the fastest conversion measured, see the shared notes)."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.buf = np.empty((0, C.N_FEATURES), np.float32)

    def __call__(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        n = batch.num_rows
        y = batch.column("y").to_numpy()
        if self.layout == "vec":
            return batch.column("x").flatten().to_numpy(zero_copy_only=True).reshape(n, C.N_FEATURES), y
        if self.buf.shape[0] < n:
            self.buf = np.empty((n, C.N_FEATURES), np.float32)
        X = self.buf[:n]
        j = 0
        for name in C.feature_names(self.layout):
            col = batch.column(name)
            if pa.types.is_fixed_size_list(col.type):
                w = col.type.list_size
                X[:, j:j + w] = col.flatten().to_numpy(zero_copy_only=True).reshape(n, w)
                j += w
            else:
                X[:, j] = col.to_numpy()
                j += 1
        return X, y


# -- paths ---------------------------------------------------------------------------------------------------
class Probe(Source):
    """Passes a source through and finds where its second *fetch* starts being handed out: for Kafka, where
    the first ``consume`` call returns a burst of messages that was fetched during the group join, steady
    state starts at the second fetch.

    ``steady_t`` / ``steady_row``: the start of the call that returns the first batch of the second fetch,
    and the rows handed out before it.  With KafkaSource's fetch-ahead (its default) a fetch is numbered by
    its private ``_taken``; with ``fetch_ahead=0`` the second fetch starts in the second call that finds its
    private ``_queue`` empty (bench only).  For other sources both stay None.
    """

    def __init__(self, inner: Source, timeout: float = 15.0) -> None:
        self.inner = inner
        self.timeout = timeout  # a source that stalls (a topic read to its end) fails the sample
        self.rows = 0
        self.refills = 0
        self.steady_t: float | None = None
        self.steady_row: int | None = None
        self.kafka = hasattr(inner, "_queue")

    async def __anext__(self) -> SourceBatch:
        t = time.perf_counter()
        ahead = getattr(self.inner, "fetch_ahead", 0)
        queue = getattr(self.inner, "_queue", None)
        if not ahead and queue is not None and len(queue) == 0 and self._opened_inner():
            self.refills += 1
            if self.refills == 2:
                self.steady_t, self.steady_row = t, self.rows
        with anyio.fail_after(self.timeout):
            sb = await self.inner.__anext__()
        if ahead and self.steady_t is None and getattr(self.inner, "_taken", 0) >= 2:
            self.steady_t, self.steady_row = t, self.rows
        self.rows += sb.num_rows
        return sb

    def _opened_inner(self) -> bool:
        return bool(getattr(self.inner, "_opened", True))

    async def aclose(self) -> None:
        await self.inner.aclose()
        await super().aclose()


def run_memory(est: Any, batches: list[tuple[np.ndarray, np.ndarray]], steps: int, meter: C.CpuMeter) -> C.Sample:
    with meter:
        a = meter.mark()
        for i in range(steps):
            X, y = batches[i % len(batches)]
            est.partial_fit(X, y)
        b = meter.mark()
    dt = b[0] - a[0]
    return C.Sample(steps * len(batches[0][1]), dt, {"step_ms": dt / steps * 1e3, **meter.cores(a, b)})


async def _read(uri: str, layout: str, max_rows: int, batch: int, rebatch: bool, meter: C.CpuMeter,
                limit: int | None = None) -> C.Sample:
    """Iterate the source (optionally through the Rebatcher) and convert to numpy.

    The clock starts once the first batch is in and converted, or for Kafka at the start of the second
    fetch (see :class:`Probe`); the rows handed out from then on are counted.
    """
    source = Probe(open_source(uri))
    conv = ToNumpy(layout)
    rb = Rebatcher(batch, ColumnPlan(features=C.feature_names(layout)), ring_size=QUEUE_SIZE + IN_FLIGHT_EXTRA) if rebatch else None
    sink = 0.0
    a = b = None
    row0 = 0
    pending: tuple[float, float] | None = None
    try:
        async for sb in source:
            if a is None and source.steady_t is not None:  # Kafka: count from the second fetch on
                a, row0 = pending or meter.mark(), source.steady_row or 0
            if rb is None:
                X, y = conv(sb.batch)
                sink += float(X[0, 0]) + float(y[0])
            else:
                for tb in rb.push(sb):
                    sink += float(tb.X[0, 0])
            if a is None and not source.kafka:
                a, row0 = meter.mark(), source.rows  # other sources: from the first batch, converted
            if a is None:
                pending = meter.mark()  # Kafka: the mark closest before the second fetch
            if a is not None and source.rows - row0 >= max_rows:
                break
            if limit is not None and source.rows >= limit:  # a Kafka topic read to its end: do not wait
                break
        b = meter.mark()
    finally:
        await source.aclose()
    rows = source.rows - row0
    if a is None or b is None or rows <= 0:
        raise RuntimeError(f"the source ended after {source.rows} rows")
    return C.Sample(rows, b[0] - a[0], meter.cores(a, b))


def run_read(uri: Callable[[], str], layout: str, max_rows: int, batch: int, rebatch: bool,
             meter: C.CpuMeter, limit: int | None = None) -> C.Sample:
    with meter:
        return anyio.run(_read, uri(), layout, max_rows, batch, rebatch, meter, limit)


def run_loop(est: Any, source: Any, layout: str, batch: int, max_rows: int, evaluate: bool, meter: C.CpuMeter,
             warmup_s: float = 0.0, loop_cls: type = StreamLoop, warmup_rows: int = 0) -> tuple[C.Sample, Any]:
    """One loop over ``max_rows`` rows (the source must hold at least that many); steady-state window:
    from the TRIM-th batch, once ``warmup_s`` have passed since the first or ``warmup_rows`` rows are
    trained (whichever comes first), and for Kafka from the first batch holding rows of the second fetch
    (see :class:`Probe`), to the TRIM-th-last batch."""
    marks: list[tuple[tuple[float, float], int]] = []

    def on_batch(ev: Any) -> None:
        marks.append((meter.mark(), ev.rows))

    probe = Probe(open_source(source))
    loop = loop_cls(est, probe, features=C.feature_names(layout), batch_size=batch, max_rows=max_rows,
                    evaluate=evaluate, queue_size=QUEUE_SIZE, on_batch=on_batch)
    with meter:
        summary = anyio.run(loop.run)
    n = len(marks)
    if summary.rows < max_rows or n < 3:
        raise RuntimeError(f"the loop trained {summary.rows} rows, expected {max_rows} ({summary.ended_by})")
    last = n - 1 - (TRIM if n > 4 * TRIM else 1)
    first = TRIM if n > 4 * TRIM else 1
    t_start = marks[0][0][0] + warmup_s
    row_start = probe.steady_row if probe.steady_row is not None else 0

    def warming(i: int) -> bool:
        warm = marks[i][0][0] >= t_start or (warmup_rows > 0 and marks[i][1] >= warmup_rows)
        return not warm or marks[i][1] < row_start

    while first < last - max(2, n // 5) and warming(first):
        first += 1  # ... but keep at least a fifth of the batches in the window
    (a, ra), (b, rb) = marks[first], marks[last]
    return C.Sample(rb - ra, b[0] - a[0], {"end_to_end": summary.rows_per_s, "window_batches": last - first,
                                           **meter.cores(a, b)}), loop


# -- the profiled loop -----------------------------------------------------------------------------------------
class _TimedSource(Source):
    """Times ``__anext__`` of the wrapped source (thread hand-off included) and counts the slow calls."""

    def __init__(self, inner: Source, acc: dict[str, float]) -> None:
        self.inner, self.acc = inner, acc

    async def __anext__(self) -> SourceBatch:
        t0 = time.perf_counter()
        try:
            return await self.inner.__anext__()
        finally:
            dt = time.perf_counter() - t0
            self.acc["source"] += dt
            self.acc["source_calls"] += 1
            if dt > 0.05:
                self.acc["source_slow"] += 1
                self.acc["source_slow_s"] += dt

    async def aclose(self) -> None:
        await self.inner.aclose()
        await super().aclose()


class ProfiledLoop(StreamLoop):
    """StreamLoop with timers around its stages (a bench-only subclass: nothing in streamfit changes).

    It overrides the private ``_step``/``_train`` and wraps ``_rebatcher.push``, ``_rebatcher.extract_ahead`` and ``_metrics.update``:
    if streamfit renames them, the profile breaks, not the benchmark table.
    """

    KEYS = ("source", "source_calls", "source_slow", "source_slow_s", "rebatch", "extract", "estimator", "step",
            "train", "metrics", "gap")

    def __init__(self, estimator: Any, source: Any, **kw: Any) -> None:
        self.acc: dict[str, float] = {k: 0.0 for k in self.KEYS}
        self._last_train_end: float | None = None
        super().__init__(estimator, _TimedSource(open_source(source), self.acc), **kw)
        acc = self.acc
        push = self._rebatcher.push

        def timed_push(sb: SourceBatch, ahead: Any = None) -> Any:
            gen = push(sb, ahead)
            while True:
                t0 = time.perf_counter()
                try:
                    tb = next(gen)
                except StopIteration:
                    acc["rebatch"] += time.perf_counter() - t0
                    return
                acc["rebatch"] += time.perf_counter() - t0
                yield tb

        self._rebatcher.push = timed_push  # type: ignore[method-assign]

        def timing(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
            def timed_call(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    acc[key] += time.perf_counter() - t0
            return timed_call

        # extract_ahead runs in a worker thread, for large record batches
        self._rebatcher.extract_ahead = timing(self._rebatcher.extract_ahead, "extract")  # type: ignore[method-assign]
        self._metrics.update = timing(self._metrics.update, "metrics")  # type: ignore[method-assign]
        for name in ("partial_fit", "partial_fit_predict"):
            fn = getattr(type(estimator), name)

            def timed(*a: Any, _fn: Any = fn, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _fn(estimator, *a, **k)
                finally:
                    acc["estimator"] += time.perf_counter() - t0

            setattr(estimator, name, timed)  # instance attributes, removed by unpatch()
        self._est = estimator

    def unpatch(self) -> None:
        for name in ("partial_fit", "partial_fit_predict"):
            self._est.__dict__.pop(name, None)

    def _step(self, tb: Any, first: bool) -> Any:
        t0 = time.perf_counter()
        try:
            return super()._step(tb, first)
        finally:
            self.acc["step"] += time.perf_counter() - t0

    async def _train(self, tb: Any) -> None:
        t0 = time.perf_counter()
        if self._last_train_end is not None:
            self.acc["gap"] += t0 - self._last_train_end
        await super()._train(tb)
        self._last_train_end = time.perf_counter()
        self.acc["train"] += self._last_train_end - t0


def profile_loop(case: Case, model: str, est: Any, batch: int, evaluate: bool, meter: C.CpuMeter) -> dict[str, Any]:
    sample, loop = run_loop(est, case.uri(), case.layout, batch, case.rows[model], evaluate, meter,
                            case.warmup_s, ProfiledLoop, case.warmup_rows)
    loop.unpatch()
    s = loop.summary()
    acc, n = loop.acc, max(1, s.batches)
    per_batch = {k: v / n * 1e3 for k, v in acc.items() if k not in ("source_calls", "source_slow")}
    return {"model": model, "evaluate": evaluate, "rows_per_s": sample.rate, "batches": s.batches,
            "elapsed": s.elapsed, "cpu": sample.extra.get("cpu"),
            "broker_cpu": sample.extra.get("other_cpu") if case.source == "kafka" else None,
            "per_batch_ms": per_batch, "source_calls": acc["source_calls"], "source_slow": acc["source_slow"],
            "source_slow_s": acc["source_slow_s"], "trainer_busy": acc["train"] / s.elapsed if s.elapsed else None,
            "memory_step_ms": case.rounds.median_extra(f"{model}:memory", "step_ms")}


def handoff_us(n: int = 300) -> tuple[float, float]:
    """Median round trip of ``anyio.to_thread.run_sync`` on a no-op (the loop's per-batch hand-off), and of
    the same with a 1 ms sleep in the worker minus 1 ms (a worker that was idle long enough to park)."""
    async def main() -> tuple[float, float]:
        fast, slow = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(lambda: None)
            fast.append(time.perf_counter() - t0)
        for _ in range(n // 10):
            await anyio.sleep(0.002)
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(time.sleep, 0.001)
            slow.append(time.perf_counter() - t0 - 0.001)
        return float(np.median(fast)) * 1e6, float(np.median(slow)) * 1e6
    return anyio.run(main)


def print_profile(case: Case, out: Callable[[str], None]) -> None:
    for p in case.profile:
        pb = p["per_batch_ms"]
        mem = p["memory_step_ms"]
        est = pb["estimator"]
        handoff = pb["train"] - pb["step"] - pb["metrics"]
        out(f"  {p['model']} from {case.column}, evaluate={p['evaluate']}: {C.fmt_rate(p['rows_per_s'])} rows/s "
            f"(steady window), {p['batches']} batches, process CPU {p['cpu']:.2f} cores"
            + (f", broker CPU {p['broker_cpu']:.2f} cores" if p.get("broker_cpu") is not None else ""))
        total = pb["train"] + pb["gap"]
        out(f"    per training batch, ms: estimator call {est:.3f}"
            + (f" (in-memory step {mem:.3f}, x{est / mem:.2f})" if mem else "")
            + f" | metrics rows in worker {pb['step'] - est:.3f} | thread hand-off + bookkeeping {handoff:.3f}"
            + f" | metrics.update {pb['metrics']:.3f} | trainer waiting for a batch {pb['gap']:.3f}"
            + f" | total {total:.3f}")
        out(f"    trainer busy {p['trainer_busy'] * 100:.0f}% of the run; time beyond the estimator call "
            f"{(total - est) / total * 100:.1f}%; reader on the event loop: source.__anext__ {pb['source']:.3f} "
            f"({int(p['source_calls'])} calls, {int(p['source_slow'])} took > 50 ms, {p['source_slow_s']:.2f} s in "
            f"them), rebatch {pb['rebatch']:.3f}; in a worker thread: checks + extraction of large record batches "
            f"{pb.get('extract', 0.0):.3f}")


# -- data setup ------------------------------------------------------------------------------------------------
def setup_parquet(tmp: str, layout: str, rows_needed: int, quick: bool) -> str:
    rows_per_file = 65536 if quick else 262144
    copies = max(2, -(-rows_needed // rows_per_file))
    return str(C.write_parquet_dir(os.path.join(tmp, f"pq-{layout}"), layout, rows_per_file, copies))


def memory_batches(layout: str, n_rows: int) -> list[pa.RecordBatch]:
    t = C.make_table(n_rows, layout, seed=1)
    return t.combine_chunks().to_batches(max_chunksize=65536)


def setup_kafka(broker: C.Tansu, layout: str, rows: int) -> str:
    topic = broker.create_topic(f"bench-{layout}-{uuid.uuid4().hex[:6]}", partitions=1)
    rb = C.make_table(KAFKA_MESSAGE_ROWS, layout, seed=2).combine_chunks().to_batches()[0]
    msg = C.ipc_bytes(rb)
    broker.produce(topic, (msg for _ in range(-(-rows // KAFKA_MESSAGE_ROWS))), partition=0)
    return topic


def kafka_uri(broker: C.Tansu, topic: str, variant: str) -> Callable[[], str]:
    conf = "&".join(f"{k}={v}" for k, v in KAFKA_CONFIG.items()) + KAFKA_VARIANTS[variant]
    return lambda: f"kafka://{broker.bootstrap}/{topic}?group=bench-{uuid.uuid4().hex[:8]}&{conf}"


# -- main ------------------------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run (< 30 s): tiny samples, one round")
    p.add_argument("--models", help=f"a subset of {', '.join(MODELS)} (default: mlp,linear on Parquet and all three "
                                    f"on Kafka)")
    p.add_argument("--sources", default="parquet,kafka")
    p.add_argument("--layouts", default="vec,mixed", help=f"Parquet layouts: {', '.join(C.LAYOUTS)}")
    p.add_argument("--kafka-layout", default="vec", choices=sorted(C.LAYOUTS))
    p.add_argument("--parquet-variants", help=f"{', '.join(PARQUET_VARIANTS)} (default: default)")
    p.add_argument("--kafka-variants", help=f"{', '.join(KAFKA_VARIANTS)} (default: default,p10ms; --quick: p10ms, whose "
                                            f"first fetch is small enough for its tiny topic)")
    p.add_argument("--paths", help=f"a subset of {', '.join(SOURCE_PATHS + MODEL_PATHS)} (default: all; "
                                   f"rebatch runs on Kafka only when named here)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --quick 1)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the rows per sample")
    p.add_argument("--threads", type=int, help="ORT intra-op threads of the estimators (default: streamfit's)")
    p.add_argument("--profile", action="store_true", help="break down the loop time of every case and model")
    p.add_argument("--no-auto-profile", action="store_true", help="do not profile missed targets")
    p.add_argument("--json", help="write all samples here")
    p.add_argument("-v", "--verbose", action="store_true", help="print every sample and tracebacks")
    return p.parse_args(argv)


def split(text: str | None, known: Any, what: str) -> list[str]:
    items = [x for x in (text or "").split(",") if x]
    for x in items:
        if x not in known:
            raise SystemExit(f"unknown {what} {x!r}; known: {', '.join(known)}")
    return items


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_start = time.perf_counter()
    rounds = args.rounds or (1 if args.quick else 3)
    models = split(args.models or ",".join(MODELS), MODELS, "model")
    pq_models = models if args.models else [m for m in models if m != "linear-t1"]
    sources = split(args.sources, ("parquet", "kafka"), "source")
    layouts = split(args.layouts, C.LAYOUTS, "layout")
    paths = split(args.paths or ",".join(SOURCE_PATHS + MODEL_PATHS), SOURCE_PATHS + MODEL_PATHS, "path")
    variants = split(args.kafka_variants or ("p10ms" if args.quick else ",".join(DEFAULT_KAFKA_VARIANTS)),
                     KAFKA_VARIANTS, "Kafka variant")
    pq_variants = split(args.parquet_variants or "default", PARQUET_VARIANTS, "Parquet variant")
    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    for s in C.header("streamfit pipeline benchmark (issue: async streaming loop)",
                      sys.argv[1:] if argv is None else argv):
        out(s)
    if args.quick:
        out("--quick: a smoke run (tiny samples, one round): the figures below say nothing about performance")
    out(f"batch {args.batch} (loop batch_size = estimator batch_size: one SGD step per partial_fit call), "
        f"{rounds} interleaved round(s), ORT intra-op threads {args.threads or 'streamfit default'}"
        f"{', linear-t1: 1' if 'linear-t1' in models else ''}")
    tmp = tempfile.mkdtemp(prefix="streamfit-bench-pipeline-")
    broker = None
    cases: list[Case] = []
    skipped: list[str] = []
    warmup = 0.1 if args.quick else 0.5
    try:
        # -- estimators: one per model, shared by all its paths (same sessions, same state); calibration
        np_batches = C.numpy_batches(8, args.batch)
        estimators: dict[str, Any] = {}
        step_s: dict[str, float] = {}
        for m in models:
            est = C.make_estimator(model_kind(m), args.batch, model_threads(m, args.threads))
            for X, y in np_batches[:2]:
                est.partial_fit(X, y)
                est.partial_fit_predict(X, y)
            n_cal = 8 if model_kind(m) == "mlp" else 64
            t1 = time.perf_counter()
            for i in range(n_cal):
                est.partial_fit(*np_batches[i % len(np_batches)])
            step_s[m] = (time.perf_counter() - t1) / n_cal
            estimators[m] = est

        # -- data, written / produced once
        t0 = time.perf_counter()
        if "parquet" in sources and pq_models:
            rows = {w: rows_per_sample(w, "parquet", args.quick, args.scale,
                                       args.batch / step_s[w] if w in step_s else None) for w in ("read", *pq_models)}
            need = max(rows.values()) + 6 * 65536  # read-ahead and the first batch come on top
            for layout in layouts:
                root = setup_parquet(tmp, layout, need, args.quick)
                mem = memory_batches(layout, min(max(rows[m] for m in pq_models), 8 * 65536)) \
                    if "loop-mem" in paths else None
                for variant in pq_variants:
                    cases.append(Case("parquet", layout, variant,
                                      lambda r=root, q=PARQUET_VARIANTS[variant]: f"parquet:{r}{q}", rows, warmup,
                                      list(pq_models), 0 if args.quick else 5 * 65536, mem))
        if "kafka" in sources:
            try:
                broker = C.Tansu.start()
                # Every Kafka sample reads / trains the whole topic (it never ends: stopping exactly at its last
                # row never waits); the window starts at the second fetch (see Probe), because the first consume
                # call returns what was fetched while the group joined: with the source's defaults 0.2-0.4 s of
                # fetching, up to ~700K rows on an idle machine.  So the topic is that much bigger than the
                # steady-state rows wanted.
                want = rows_per_sample("read", "kafka", args.quick, args.scale)
                margin = (16 if args.quick else 150) * KAFKA_MESSAGE_ROWS
                total = -(-(want + margin) // KAFKA_MESSAGE_ROWS) * KAFKA_MESSAGE_ROWS
                topic = setup_kafka(broker, args.kafka_layout, total)
                rows = {w: total for w in ("read", *models)}
                for variant in variants:
                    cases.append(Case("kafka", args.kafka_layout, variant, kafka_uri(broker, topic, variant), rows, 0.0,
                                      list(models), total_rows=total))
            except C.Unavailable as exc:
                skipped.append(f"kafka: {exc}")
        log(f"data ready in {time.perf_counter() - t0:.1f} s"
            + (f"; broker RSS {broker.rss_mb():.0f} MiB" if broker is not None else ""))

        # -- measure, one source at a time, all its paths interleaved
        for case in cases:
            t_case = time.perf_counter()
            meter = C.CpuMeter(broker.proc.pid if case.source == "kafka" and broker is not None else None)
            fns: dict[str, Callable[[], C.Sample]] = {}
            for p in paths:
                # rebatching is the same code whatever the source: on Kafka only when asked for
                if p in SOURCE_PATHS and (p != "rebatch" or case.source == "parquet" or args.paths):
                    fns[p] = lambda c=case, rb=(p == "rebatch"): run_read(c.uri, c.layout, c.rows["read"], args.batch,
                                                                         rb, meter, c.total_rows)
            for m in case.models:
                est, n = estimators[m], case.rows[m]
                for p in paths:
                    key = f"{m}:{p}"
                    if p == "noeval" and case.source == "kafka" and model_kind(m) == "mlp" and not args.paths:
                        continue  # no target there, and 4-5 s per sample: only when asked for
                    if p == "memory":
                        steps = max(4, int(min(n / args.batch, (0.3 if args.quick else 1.5) / step_s[m])))
                        fns[key] = lambda est=est, steps=steps: run_memory(est, np_batches, steps, meter)
                    elif p in ("loop", "noeval"):
                        fns[key] = lambda c=case, est=est, n=n, ev=(p == "loop"): run_loop(
                            est, c.uri(), c.layout, args.batch, n, ev, meter, c.warmup_s, warmup_rows=c.warmup_rows)[0]
                    elif p == "loop-mem" and case.mem_batches is not None:
                        reps = max(1, -(-n // sum(b.num_rows for b in case.mem_batches)))
                        fns[key] = lambda c=case, est=est, n=n, reps=reps: run_loop(
                            est, MemorySource(c.mem_batches * reps), c.layout, args.batch, n, True, meter)[0]
            log(f"  {case.column}: {len(fns)} paths x {rounds} round(s)")
            case.rounds = C.interleave(fns, rounds, log=log if args.verbose else None, verbose=args.verbose)
            for model, a, b, _ in case.targets():
                r = case.rounds.ratio(a, b)
                missed = r is not None and r[0] < TARGET
                if args.profile or (missed and not args.quick and not args.no_auto_profile):
                    for ev in (True, False):
                        case.profile.append(profile_loop(case, model, estimators[model], args.batch, ev, meter))
            if args.profile:
                for m in case.models:
                    if not any(p["model"] == m for p in case.profile):
                        case.profile.append(profile_loop(case, m, estimators[m], args.batch, True, meter))
            log(f"  {case.column}: done in {time.perf_counter() - t_case:.1f} s")

        report(cases, models, args, rounds, out)
        for s in skipped:
            out(f"skipped {s}")
        out(f"total {time.perf_counter() - t_start:.0f} s; load average at the end {C.load_average()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(to_json(cases, args, lines), f, indent=1)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


# -- report ----------------------------------------------------------------------------------------------------
def report(cases: list[Case], models: list[str], args: argparse.Namespace, rounds: int,
           out: Callable[[str], None]) -> None:
    W = 20
    head = f"{'':34s}" + "".join(f"{c.column:>{W}s}" for c in cases)

    def rate_cell(c: Case, key: str) -> str:
        if key in c.rounds.errors:
            return f"{'ERROR':>{W}s}"
        m = c.rounds.median_rate(key)
        sp = c.rounds.spread(key)
        txt = (C.fmt_rate(m) + (f" +-{sp * 100:.0f}%" if sp is not None else "")) if m else "-"
        return f"{txt:>{W}s}"

    def cpu_cell(c: Case, key: str) -> str:
        cpu = c.rounds.median_extra(key, "cpu")
        rate = c.rounds.median_rate(key)
        if cpu is None or not rate:
            return f"{'-':>{W}s}"
        other = c.rounds.median_extra(key, "other_cpu") if c.source == "kafka" else None
        cores = cpu + (other or 0.0)
        txt = f"{cpu:.2f}" + (f"+{other:.2f}" if other is not None else "") + f" {cores / rate * 1e6:.2f}us"
        return f"{txt:>{W}s}"

    ncpu = os.cpu_count() or 1

    def core_us(c: Case, key: str) -> float | None:
        cpu, rate = c.rounds.median_extra(key, "cpu"), c.rounds.median_rate(key)
        if cpu is None or not rate:
            return None
        other = c.rounds.median_extra(key, "other_cpu") if c.source == "kafka" else 0.0
        return (cpu + (other or 0.0)) / rate

    def ceiling(c: Case, m: str) -> float | None:
        """rows/s if training and reading were perfectly overlapped and CPU-bound on all cores."""
        a, b = core_us(c, f"{m}:memory"), core_us(c, "read")
        return None if a is None or b is None else ncpu / (a + b)

    out("")
    out(f"rows/s, median of {rounds} interleaved round(s) (+-: half the IQR across rounds, % of the median)")
    out(head)
    for p in SOURCE_PATHS:
        if any(p in c.rounds.samples for c in cases):
            out(f"{LABELS[p]:34s}" + "".join(rate_cell(c, p) for c in cases))
    for m in models:
        out(model_title(m, args.threads))
        for p in MODEL_PATHS:
            key = f"{m}:{p}"
            if any(key in c.rounds.samples for c in cases):
                out(f"{'  ' + LABELS[p]:34s}" + "".join(rate_cell(c, key) for c in cases))
        cells = [ceiling(c, m) if m in c.models else None for c in cases]
        if any(cells):
            out(f"{'  CPU ceiling (see below)':34s}" + "".join(f"{C.fmt_rate(x) if x else '-':>{W}s}" for x in cells))
    loads = []
    for c in cases:
        o = c.rounds.all_extra("others")
        loads.append(f"{(f'{np.median(o):.2f} [{min(o):.2f}-{max(o):.2f}]' if o else '-'):>{W}s}")
    out(f"{'other processes, cores [min-max]':34s}" + "".join(loads))
    out("")
    out("CPU: cores used (this process + the broker) and core-microseconds per row, medians")
    out(head)
    for p in SOURCE_PATHS:
        if any(p in c.rounds.samples for c in cases):
            out(f"{LABELS[p]:34s}" + "".join(cpu_cell(c, p) for c in cases))
    for m in models:
        out(model_title(m, args.threads))
        for p in MODEL_PATHS:
            key = f"{m}:{p}"
            if any(key in c.rounds.samples for c in cases):
                out(f"{'  ' + LABELS[p]:34s}" + "".join(cpu_cell(c, key) for c in cases))
    out("")
    out("ratios of rows/s, median of same-round pairs [quartiles]")
    out(head)
    for m in models:
        out(model_title(m, args.threads))
        for a, b in (("loop", "memory"), ("noeval", "memory"), ("loop", "read"), ("noeval", "read"),
                     ("loop", "noeval"), ("loop-mem", "memory")):
            ka = f"{m}:{a}"
            kb = b if b in SOURCE_PATHS else f"{m}:{b}"
            if not any(c.rounds.ratio(ka, kb) for c in cases):
                continue
            cells = [f"{C.fmt_ratio(c.rounds.ratio(ka, kb)):>{W}s}" for c in cases]
            out(f"{'  ' + a + ' / ' + b:34s}" + "".join(cells))
        cells = []
        for c in cases:
            x = ceiling(c, m) if m in c.models else None
            mem, read = c.rounds.median_rate(f"{m}:memory"), c.rounds.median_rate("read")
            cells.append(f"{(f'{x / mem:.0%} / {x / read:.0%}' if x and mem and read else '-'):>{W}s}")
        if any(x.strip() != "-" for x in cells):
            out(f"{'  CPU ceiling / memory, / read':34s}" + "".join(cells))
    if any(c.rounds.ratio("rebatch", "read") for c in cases):
        cells = [f"{C.fmt_ratio(c.rounds.ratio('rebatch', 'read')):>{W}s}" for c in cases]
        out(f"{'rebatch / read':34s}" + "".join(cells))
    out(f"CPU ceiling = {ncpu} cores / (core-us per row of in-memory training + of the read, broker included): the "
        f"loop's rows/s if reading and training overlapped perfectly and only CPU limited them (ORT's spinning "
        f"threads count as used)")
    out("")
    out(f"targets (>= {TARGET:.0%}):")
    for c in cases:
        for model, a, b, text in c.targets():
            r = c.rounds.ratio(a, b)
            verdict = "n/a" if r is None else ("MET" if r[0] >= TARGET else "MISSED")
            r2 = c.rounds.ratio(a.replace(":loop", ":noeval"), b)
            extra = f"; with evaluate=False {r2[0]:.0%}" if r2 is not None else ""
            out(f"  {c.column:18s} {text:48s} {('n/a' if r is None else f'{r[0]:.0%}'):>5s}  {verdict}{extra}")
    errors = [(c, p, e) for c in cases for p, e in c.rounds.errors.items()]
    if errors:
        out("")
        out("ERRORS")
        for c, p, e in errors:
            out(f"  {c.column} {p}: {e}")
    if any(c.profile for c in cases):
        out("")
        out("where the time goes: one instrumented loop each (totals over the whole run, per training batch)")
        fast, slow = handoff_us()
        out(f"  anyio.to_thread.run_sync round trip here: {fast:.0f} us back to back, {slow:.0f} us after 2 ms "
            f"idle (median)")
        for c in cases:
            print_profile(c, out)


def to_json(cases: list[Case], args: argparse.Namespace, lines: list[str]) -> dict[str, Any]:
    res = []
    for c in cases:
        res.append({"source": c.source, "layout": c.layout, "variant": c.variant, "rows": c.rows,
                    "samples": {p: [{"rows": s.rows, "seconds": s.seconds, **s.extra} for s in v]
                                for p, v in c.rounds.samples.items()},
                    "errors": c.rounds.errors, "profile": c.profile})
    return {"args": vars(args), "cases": res, "report": lines}


if __name__ == "__main__":
    sys.exit(main())
