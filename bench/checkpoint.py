#!/usr/bin/env python
"""Checkpoint and daemon benchmark: what periodic checkpoints cost in training rows/s, and whether the
daemon's memory stays flat over a long stream.

    python bench/checkpoint.py                 # checkpoint overhead, about 4 minutes on 2 cores
    python bench/checkpoint.py --quick         # smoke run, < 30 s (CI)
    python bench/checkpoint.py --rounds 3 --seconds 6 --json docs/benchmarks/data/checkpoint.json  # ~1.5 min
    python bench/checkpoint.py --rss           # the daemon's RSS over 10M rows (minutes; NOT for CI)
    python bench/checkpoint.py --rss --rss-rows 2000000 --rss-model mlp
    python bench/checkpoint.py --tables         # delta checkpoints of a 2^24 x 16 table (1 GiB), ~2 min
    python bench/checkpoint.py --tables --quick # the same on a 2^16-row table (CI)
    python bench/checkpoint.py --cow            # a full checkpoint while training: copy vs copy-on-write, ~3 min

1. Overhead (default).  The MLP 100-256-256-1 (ReLU, float32, plain SGD), batch 2048, trained through
   ``streamfit.daemon.Runner`` from an endless in-memory source (``--source memory``: the same 65536-row
   record batch of one FixedSizeList<float32,100> column, repeated) or from a Parquet directory
   (``--source parquet``).  Arms, interleaved (round r starts with arm r mod n), each run for ``--seconds``:

       none    Runner without a checkpoint directory
       5s      checkpoint_dir + every_seconds=5     (the target: <= 2 % slower than none)
       1s      checkpoint_dir + every_seconds=1     (to see the cost per checkpoint)

   Rows/s is measured from the loop's progressive-metrics events (one per trained batch) over the window
   from 1 s after the first batch to the moment the stop is requested, so the final checkpoint written on
   stop is outside it.  The table also shows, per checkpoint, the pause of the training loop while the
   snapshot is taken (``Runner._submit`` runs on the event loop between two batches: timed by wrapping it)
   and the background write time (the ``checkpoint`` log events), and the overhead those pauses alone
   predict (pause x checkpoints per second).

2. ``--rss``.  ``streamfit serve`` (``python -m streamfit.cli serve``, the daemon) as a subprocess over
   ``--rss-rows`` rows (default 10M) of a followed Parquet directory written once (one 262144-row file,
   the others symlinks to it), a linear d=100 model (``--rss-model mlp`` for the MLP), batch 2048, a
   checkpoint every 5 s, ``--max-rows`` so it ends by itself.  The daemon's VmRSS (/proc/PID/status) is
   polled every 20 ms and printed every ``--rss-every`` rows (rows from its health file) with the min and max
   since the previous line.  Verdict, after the warm-up (the first 20 % of the rows): flat if the peak RSS
   of each later quarter of the rows is within 5 % of the first quarter's peak (RSS swings inside a quarter
   as the allocators return freed memory in bursts: a sawtooth is not growth).

3. ``--tables``.  An embedding model (8 dense inputs + a ``--table-rows`` x 16 float32 table through
   ``Gather``, ``two_input_model``; 2^24 rows = 1 GiB, AdaGrad: as much again of optimizer state) trained by
   the ``Runner`` from memory, batch 1024, every batch's ids drawn from the same 1 % of the table's rows, a
   checkpoint every ``--table-every`` batches (a full every 3, deltas of touched rows between; a full is a
   copy-on-write snapshot the writer streams while training goes on) and
   ``--publish`` in the background every ``--publish-every`` s.  Printed: bytes written by the full and by
   each delta (the target: a delta <= 5 % of a full), their write times, the training loop's pause to
   snapshot each kind, the batch intervals (p50, and the longest one overlapping a publication:
   publishing must not block training; p50 and max while a checkpoint is written against outside writes),
   the rows the fulls' snapshots saved aside, and the peak RSS above the start of the run (VmHWM, reset once
   the trainer is built) per byte of tables and optimizer state.  ``--table-spread 1`` draws the ids from
   the whole table instead of 1 % of it (the worst case of copy-on-write: every batch writes new rows).

4. ``--cow``.  The same table model trained by ``partial_fit`` on the main thread while a thread writes one
   full checkpoint of its tables, two arms interleaved: ``copy`` (tables and state copied on the training
   thread, the copies written: a full before copy-on-write) and ``cow`` (a copy-on-write snapshot streamed).
   Printed per arm (medians of ``--cow-rounds``): the training thread's pause, the step time during the
   write against the steps just before it, the write time, the peak RSS above the round's start.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402  (puts the repository root on sys.path)
from _cpu import run_env  # noqa: E402
import anyio  # noqa: E402

BATCH = 2048
TARGET_SLOWDOWN = 0.02
ARMS = {"none": None, "5s": 5.0, "1s": 1.0}
QUICK_ARMS = {"none": None, "1s": 1.0, "0.25s": 0.25}


# -- 1. checkpoint overhead ------------------------------------------------------------------------------------
def _after_each_batch(runner: Any, hook: Callable[[Any], None]) -> None:
    """Bench-only: call ``hook(event)`` after the Runner handled each trained batch (its ``BatchEvent``)."""
    handle = runner._on_batch

    async def wrapped(event: Any) -> None:
        await handle(event)
        hook(event)

    runner._on_batch = wrapped


class _Events(logging.Handler):
    """Collects the daemon's structured ``checkpoint`` log events (write durations)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.writes: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "checkpoint":
            seconds = (getattr(record, "fields", None) or {}).get("seconds")
            if isinstance(seconds, (int, float)):
                self.writes.append(float(seconds))


def make_source_factory(kind: str, tmp: str, quick: bool) -> Callable[[], Any]:
    from streamfit.sources import MemorySource, ParquetSource

    if kind == "memory":
        rb = C.make_table(65536, "vec", seed=0).combine_chunks().to_batches()[0]
        many = [rb] * 20000  # 1.3 billion rows of references to one batch: endless for this bench
        return lambda: MemorySource(many)
    root = C.write_parquet_dir(os.path.join(tmp, "pq"), "vec", 65536 if quick else 262144, 400)
    return lambda: ParquetSource(str(root))


def run_arm(est: Any, source_factory: Callable[[], Any], every: float | None, seconds: float, warmup: float,
            tmp: str, events: _Events) -> C.Sample:
    from streamfit.daemon import Runner

    ck = tempfile.mkdtemp(prefix="ck-", dir=tmp) if every is not None else None
    stop = anyio.Event()
    marks: list[tuple[tuple[float, float], int]] = []
    meter = C.CpuMeter()
    pauses: list[tuple[float, float]] = []
    state: dict[str, Any] = {"t0": None, "stopped_at": None, "writer": None, "wcpu0": None, "wcpu1": None,
                             "in_window": False}

    def writer_cpu() -> float | None:
        if state["writer"] is None:
            state["writer"] = next((t.native_id for t in threading.enumerate()
                                    if t.name == "streamfit-checkpoint-writer" and t.is_alive()), -1)
        return C.thread_cpu(state["writer"]) if state["writer"] and state["writer"] > 0 else None

    def on_metrics(ev: Any) -> None:
        now = time.perf_counter()
        if state["stopped_at"] is not None:
            return
        marks.append(((now, time.process_time()), ev.rows))
        if state["t0"] is None:
            state["t0"] = now
        elif not state["in_window"] and now - state["t0"] >= warmup:
            state["in_window"] = True
            state["wcpu0"] = writer_cpu() if every is not None else None
        elif now - state["t0"] >= warmup + seconds:
            state["stopped_at"] = now
            state["wcpu1"] = writer_cpu() if every is not None else None
            stop.set()

    runner = Runner(est, source_factory, checkpoint_dir=ck, every_seconds=every, batch_size=BATCH,
                    features=["x"], guard=False)  # no guard: the arms differ only in checkpoints
    _after_each_batch(runner, on_metrics)
    submit = runner._submit  # bench-only timing of the snapshot taken on the event loop

    def timed_submit(wait: bool) -> bool:
        t0 = time.perf_counter()
        ok = submit(wait)
        if ok and state["stopped_at"] is None:
            pauses.append((t0, time.perf_counter() - t0))
        return ok

    runner._submit = timed_submit  # type: ignore[method-assign]
    n_writes = len(events.writes)
    try:
        with meter:
            anyio.run(runner.run, stop)
    finally:
        if ck is not None:
            shutil.rmtree(ck, ignore_errors=True)
    t_first = marks[0][0][0] + warmup
    first = next(i for i, m in enumerate(marks) if m[0][0] >= t_first)
    (a, ra), (b, rb) = marks[first], marks[-1]
    wall = b[0] - a[0]
    in_window = [p for t, p in pauses if a[0] <= t <= b[0]]
    writes = events.writes[n_writes:]
    return C.Sample(rb - ra, wall, {
        **meter.cores(a, b),
        "checkpoints": float(len(in_window)),
        "pause_ms": statistics.median(in_window) * 1e3 if in_window else float("nan"),
        "pause_total_s": sum(in_window),
        "write_ms": statistics.median(writes) * 1e3 if writes else float("nan"),
        "writer_cpu_s": (state["wcpu1"] - state["wcpu0"]) if state["wcpu0"] is not None
        and state["wcpu1"] is not None else 0.0,
    })


def overhead(args: argparse.Namespace, out: Callable[[str], None], log: Callable[[str], None]) -> dict[str, Any]:
    """Run the arms interleaved, print their table and verdict; return what ``--json`` writes (config, arms)."""
    arms = QUICK_ARMS if args.quick else ARMS
    seconds = args.seconds or (1.5 if args.quick else 10.0)
    warmup = 0.3 if args.quick else 1.0
    rounds = args.rounds or (1 if args.quick else 7)
    tmp = tempfile.mkdtemp(prefix="streamfit-bench-checkpoint-")
    events = _Events()
    dlog = logging.getLogger("streamfit.daemon")
    dlog.addHandler(events)
    dlog.setLevel(logging.INFO)
    dlog.propagate = False
    try:
        factory = make_source_factory(args.source, tmp, args.quick)
        est = C.make_estimator("mlp", BATCH, args.threads, args.optimizer)
        for X, y in C.numpy_batches(3, BATCH):
            est.partial_fit(X, y)
        out(f"MLP {'-'.join(map(str, C.MLP_SIZES))}, optimizer {args.optimizer}, batch {BATCH}, source {args.source}, "
            f"Runner with evaluate=True; {rounds} interleaved round(s) of {warmup:.1f} s warm-up + {seconds:.1f} s "
            f"per arm; checkpoints to {tmp} (keep=3)")
        fns = {name: (lambda every=every: run_arm(est, factory, every, seconds, warmup, tmp, events))
               for name, every in arms.items()}
        res = C.interleave(fns, rounds, log=log, verbose=args.verbose)
    finally:
        dlog.removeHandler(events)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = _arm_rows(res, arms)
    _print_arms(rows, out)
    _print_verdict(res, arms, out)
    return {"config": {"quick": args.quick, "model": "mlp", "sizes": list(C.MLP_SIZES), "optimizer": args.optimizer,
                       "batch": BATCH, "source": args.source, "rounds": rounds, "seconds": seconds, "warmup": warmup,
                       "target_slowdown": TARGET_SLOWDOWN}, "arms": rows}


def _num(x: float | None) -> float | None:
    """A figure for JSON: None for a missing or NaN one."""
    return None if x is None or x != x else float(x)


def _arm_rows(res: C.Rounds, arms: dict[str, float | None]) -> list[dict[str, Any]]:
    """Each arm's medians: rows/s, the change against ``none`` [quartiles], checkpoints, pauses, writes, costs."""
    rows = []
    for name, every in arms.items():
        if name in res.errors:
            rows.append({"arm": name, "every_s": every, "error": str(res.errors[name])})
            continue
        samples = res.samples[name]
        ratio = res.ratio(name, "none") if name != "none" else None
        # cost model: the loop stands still during a snapshot; the writer thread's CPU is taken from training,
        # which uses every core (this process's CPU use, ``cores``)
        cost = statistics.median(s.extra["pause_total_s"] / s.seconds
                                 + s.extra.get("writer_cpu_s", 0.0) / (s.seconds * max(1.0, s.extra.get("cpu", 1.0)))
                                 for s in samples) if samples else None
        wcpu = statistics.median(s.extra.get("writer_cpu_s", 0.0) / max(1.0, s.extra["checkpoints"]) * 1e3
                                 for s in samples) if samples else None
        rows.append({"arm": name, "every_s": every, "rows_per_s": _num(res.median_rate(name)),
                     "spread": _num(res.spread(name)), "vs_none": None if ratio is None else [r - 1 for r in ratio],
                     "checkpoints": _num(res.median_extra(name, "checkpoints")),
                     "pause_ms": _num(res.median_extra(name, "pause_ms")),
                     "write_ms": _num(res.median_extra(name, "write_ms")), "writer_cpu_ms": _num(wcpu) or None,
                     "model_cost": _num(cost) or None, "cores": res.median_extra(name, "cpu") or 0.0,
                     "others": res.median_extra(name, "others") or 0.0})
    return rows


def _print_arms(rows: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    W = 14
    out("")
    out(f"{'arm':8s}{'rows/s':>{W}s}{'+-IQR/2':>{W}s}{'vs none':>{W + 8}s}{'ckpts/run':>{W}s}"
        f"{'pause ms':>{W}s}{'write ms':>{W}s}{'writer CPU':>{W}s}{'model cost':>{W}s}{'cores':>{W - 4}s}"
        f"{'others':>{W - 4}s}")
    for r in rows:
        if "error" in r:
            out(f"{r['arm']:8s} ERROR {r['error']}")
            continue
        sp, v, ck, pause, write = r["spread"], r["vs_none"], r["checkpoints"], r["pause_ms"], r["write_ms"]
        wcpu, cost = r["writer_cpu_ms"], r["model_cost"]
        vs = "-" if v is None else f"{v[0] * 100:+.1f}% [{v[1] * 100:+.1f},{v[2] * 100:+.1f}]"
        out(f"{r['arm']:8s}{C.fmt_rate(r['rows_per_s']):>{W}s}{(f'{sp * 100:.1f}%' if sp is not None else '-'):>{W}s}"
            f"{vs:>{W + 8}s}{(f'{ck:.0f}' if ck is not None else '-'):>{W}s}"
            f"{(f'{pause:.2f}' if pause is not None else '-'):>{W}s}"
            f"{(f'{write:.1f}' if write is not None else '-'):>{W}s}"
            f"{(f'{wcpu:.1f} ms' if wcpu else '-'):>{W}s}{(f'{cost * 100:.2f}%' if cost else '-'):>{W}s}"
            f"{r['cores']:>{W - 4}.2f}{r['others']:>{W - 4}.2f}")
    out("vs none: rows/s change against the no-checkpoint arm, median of same-round pairs [quartiles]; pause: the"
        " loop stopped while Runner._submit snapshots the state (per checkpoint, median); write: background"
        " CheckpointStore.save; writer CPU: that thread's CPU per checkpoint; model cost: pauses + writer CPU /"
        " cores used, as a share of the window; cores: this process; others: every other process on the machine")


def _print_verdict(res: C.Rounds, arms: dict[str, float | None], out: Callable[[str], None]) -> None:
    target_arm = "5s" if "5s" in arms else None
    if target_arm and target_arm not in res.errors and res.ratio(target_arm, "none"):
        r = res.ratio(target_arm, "none")
        assert r is not None
        slow = 1 - r[0]
        verdict = "MET" if slow <= TARGET_SLOWDOWN else "MISSED"
        out(f"target: checkpoint every 5 s <= {TARGET_SLOWDOWN:.0%} slower than none: {slow * 100:+.1f}% slower "
            f"(quartiles of the pairs {(1 - r[2]) * 100:+.1f}..{(1 - r[1]) * 100:+.1f}%)  {verdict}")
        r1 = res.ratio("1s", "none")
        if r1:
            out(f"  every 1 s: {(1 - r1[0]) * 100:+.1f}% slower -> about {(1 - r1[0]) * 100 / 5:+.2f}% expected at"
                f" 5 s if the cost is per checkpoint")
        sp = max(res.spread("none") or 0, res.spread(target_arm) or 0)
        if sp > TARGET_SLOWDOWN:
            out(f"  note: rows/s varies by +-{sp * 100:.1f}% between samples of the same arm (half the IQR), more than"
                f" the {TARGET_SLOWDOWN:.0%} target; the cost model column is the sharper estimate")
    for name, e in res.errors.items():
        out(f"ERROR {name}: {e}")


# -- 2. the daemon's RSS -----------------------------------------------------------------------------------------
def rss_run(args: argparse.Namespace, out: Callable[[str], None], log: Callable[[str], None]) -> None:
    import onnx

    total = args.rss_rows
    every = args.rss_every or max(BATCH, total // 40)
    tmp = tempfile.mkdtemp(prefix="streamfit-bench-rss-")
    proc = None
    try:
        t0 = time.perf_counter()
        rows_per_file = 262144
        copies = -(-total // rows_per_file) + 1
        data = C.write_parquet_dir(os.path.join(tmp, "data"), args.rss_layout, rows_per_file, copies)
        model = os.path.join(tmp, "model.onnx")
        onnx.save(C.model_proto(args.rss_model), model)
        ck, health, err_path = os.path.join(tmp, "ck"), os.path.join(tmp, "health.json"), os.path.join(tmp, "serve.log")
        log(f"data: {copies} x {rows_per_file} rows ({args.rss_layout}) in {time.perf_counter() - t0:.1f} s")
        cmd = [sys.executable, "-m", "streamfit.cli", "serve", "--source", f"parquet:{data}", "--model", model,
               "--checkpoint-dir", ck, "--checkpoint-every-seconds", "5", "--health-file", health,
               "--health-interval", "0.1", "--batch-size", str(BATCH), "--optimizer", "sgd",
               "--learning-rate", "constant", "--eta0", str(C.LR), "--penalty", "none", "--no-progress",
               "--log-json", "--max-rows", str(total)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = {**os.environ, "PYTHONPATH": C.ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        out(f"streamfit serve: {C.model_title(args.rss_model)}, batch {BATCH}, {total:,} rows from a followed Parquet "
            f"directory ({args.rss_layout} layout), checkpoint every 5 s; VmRSS every {every:,} rows")
        err = open(err_path, "w")
        t_start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=tmp)
        curve: list[tuple[int, float, float, float, float]] = []  # rows, rss, min and max since last, seconds
        next_rows = 0
        peak = 0.0
        lo_iv, hi_iv = float("inf"), 0.0
        while proc.poll() is None:
            time.sleep(0.02)
            rss = C.rss_mb(proc.pid)
            if rss is None:
                break
            peak = max(peak, rss)
            lo_iv, hi_iv = min(lo_iv, rss), max(hi_iv, rss)
            try:
                with open(health) as f:
                    rows = int(json.load(f).get("rows", 0))
            except (OSError, ValueError):
                continue
            if rows >= next_rows:
                curve.append((rows, rss, lo_iv, hi_iv, time.perf_counter() - t_start))
                lo_iv, hi_iv = float("inf"), 0.0
                next_rows = (rows // every + 1) * every
            if time.perf_counter() - t_start > args.rss_timeout:
                proc.send_signal(signal.SIGTERM)
                log("timeout: SIGTERM sent")
                break
        stdout, _ = proc.communicate(timeout=120)
        err.close()
        elapsed = time.perf_counter() - t_start
        if proc.returncode != 0:
            with open(err_path) as f:
                out(f"serve exited with {proc.returncode}: {f.read()[-3000:]}")
            return
        out(stdout.strip())
        out("")
        out(f"{'rows':>12s}{'VmRSS MiB':>12s}{'min':>9s}{'max':>9s}{'seconds':>10s}   (min/max: every 20 ms since the "
            f"previous line)")
        for rows, rss, lo, hi, t in curve:
            out(f"{rows:>12,d}{rss:>12.1f}{lo:>9.1f}{hi:>9.1f}{t:>10.1f}")
        out(f"peak RSS {peak:.1f} MiB; {total / elapsed:,.0f} rows/s overall ({elapsed:.0f} s including start-up)")
        post = [c for c in curve if c[0] >= 0.2 * total]
        if len(post) >= 8:
            q = len(post) // 4
            quarters = [post[i * q:(i + 1) * q] if i < 3 else post[3 * q:] for i in range(4)]
            peaks = [max(c[3] for c in part) for part in quarters]
            lows = [min(c[2] for c in part) for part in quarters]
            growth = max(peaks[1:]) / peaks[0] - 1
            verdict = "FLAT" if growth <= 0.05 else "GROWING"
            out(f"after warm-up (rows >= {int(0.2 * total):,}), per quarter of the rows: peak RSS "
                f"{' / '.join(f'{x:.0f}' for x in peaks)} MiB, low {' / '.join(f'{x:.0f}' for x in lows)} MiB")
            out(f"peak of later quarters vs the first: {growth * 100:+.1f}% -> {verdict} (no growth beyond 5 %); "
                f"the swing inside a quarter (low to peak, {min(lows):.0f}-{max(peaks):.0f} MiB) is the allocators "
                f"returning freed memory in bursts")
        else:
            out("too few samples after warm-up for a verdict")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


# -- main ------------------------------------------------------------------------------------------------------
# -- 3. delta checkpoints of a large table ------------------------------------------------------------------------
def tables(args: argparse.Namespace, out: Callable[[str], None], log: Callable[[str], None]) -> None:
    import numpy as np
    import pyarrow as pa

    import streamfit
    from streamfit._engine.testing import two_input_model
    from streamfit.daemon import Runner
    from streamfit.sources import MemorySource

    rows = 2 ** 16 if args.quick else args.table_rows
    dim, batch = 16, 1024
    touched = max(batch, int(rows * args.table_spread))
    rng = np.random.default_rng(0)
    subset = rng.permutation(rows)[:touched]
    t0 = time.perf_counter()
    est = streamfit.OnnxRegressor(two_input_model(8, rows, dim=dim, seed=0), optimizer=args.table_optimizer,
                                  learning_rate="constant", eta0=0.01, penalty=None,
                                  inputs={"x": [f"x{j}" for j in range(8)], "ids": "ids"})
    log(f"model of {rows} x {dim} rows built in {time.perf_counter() - t0:.1f} s")
    first = next(iter(_table_batches(subset, touched, batch, seed=2)))
    est.partial_fit(pa.Table.from_batches([first]).drop(["y"]), first.column("y").to_numpy())  # build the trainer before the peak RSS is reset
    state_bytes = sum(a.nbytes for a in est.trainer_.tables.arrays.values()) + sum(
        a.nbytes for st in est.trainer_.tables.state_arrays().values() for a in st.values())

    def batches():
        return _table_batches(subset, touched, batch, seed=1)

    tmp = tempfile.mkdtemp(prefix="bench-tables-")
    ck, pub = os.path.join(tmp, "ck"), os.path.join(tmp, "pub", "model.onnx")
    want = 6  # committed checkpoints: a full, deltas, a full compacted by the writer, deltas
    stop = anyio.Event()
    stamps: list[float] = []
    pauses: list[tuple[str, float]] = []
    runner: Any = None

    def on_metrics(ev: Any) -> None:
        stamps.append(time.perf_counter())
        if runner is not None and runner.checkpoints >= want:
            stop.set()

    runner = Runner(est, lambda: MemorySource(batches()), checkpoint_dir=ck, every_batches=args.table_every,
                    full_every=3, keep=20, publish_path=pub, publish_every=args.publish_every, label="y",
                    batch_size=batch, guard=False)
    _after_each_batch(runner, on_metrics)
    submit = runner._submit

    def timed_submit(wait: bool) -> bool:
        start = time.perf_counter()
        ok = submit(wait)
        if ok:
            pauses.append(("full" if runner._chain_depth == 0 else "delta", time.perf_counter() - start))
        return ok

    runner._submit = timed_submit  # bench-only: the pause of the loop while the snapshot is taken
    writes: list[tuple[float, float]] = []
    save = runner.store.save

    def timed_save(*a: Any, **k: Any) -> Any:  # bench-only: when each checkpoint write ran (writer thread)
        start = time.perf_counter()
        try:
            return save(*a, **k)
        finally:
            writes.append((start, time.perf_counter()))

    runner.store.save = timed_save
    snaps: list[Any] = []
    sparse = est.trainer_.tables
    if hasattr(sparse, "snapshot"):  # copy-on-write fulls: keep each snapshot to report what it saved aside
        take = sparse.snapshot

        def kept_snapshot() -> Any:
            snap = take()
            snaps.append(snap)
            return snap

        sparse.snapshot = kept_snapshot
    events = _Events()
    dlog = logging.getLogger("streamfit.daemon")
    dlog.addHandler(events)
    dlog.setLevel(logging.INFO)
    dlog.propagate = False
    import gc

    gc.collect()
    peak0 = C.rss_mb()
    _reset_peak_rss()
    try:
        anyio.run(runner.run, stop)
    finally:
        dlog.removeHandler(events)
    publisher = runner._publisher
    out(f"== delta checkpoints: a {rows} x {dim} float32 table ({rows * dim * 4 / 2**20:.0f} MiB), "
        f"{args.table_optimizer}, batch {batch}, ids from {touched} rows ({100 * touched / rows:.1f} %) ==")
    out(f"{'checkpoint':<20} {'kind':<6} {'MiB written':>12} {'vs full':>8} {'table rows':>11} {'write s':>8} "
        f"{'loop pause ms':>14}")
    full_bytes = None
    ratios = []
    dirs = sorted(d for d in os.listdir(ck) if d.startswith("ckpt-") and "." not in d)
    for i, name in enumerate(dirs):
        d = os.path.join(ck, name)
        manifest = json.load(open(os.path.join(d, "manifest.json")))
        link = manifest["tables"]
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        if link["kind"] == "full":
            full_bytes = size
        ratio = size / full_bytes if full_bytes else float("nan")
        if link["kind"] == "delta":
            ratios.append(ratio)
        n_rows = max(link["rows"].values()) if link["rows"] else rows
        write = events.writes[i] if i < len(events.writes) else float("nan")
        pause = pauses[i][1] * 1e3 if i < len(pauses) else float("nan")
        out(f"{name:<20} {link['kind']:<6} {size / 2**20:>12.2f} {ratio:>8.3f} {n_rows:>11} {write:>8.3f} "
            f"{pause:>14.1f}")
    gaps = np.diff(np.asarray(stamps)) * 1e3
    windows = [(r.started, r.started + r.seconds) for r in (publisher.results if publisher else [])]
    during = [g for g, t in zip(gaps, stamps[1:]) if any(a <= t and t - g / 1e3 <= b for a, b in windows)]
    snapshot_ms = {kind: max(p for k, p in pauses if k == kind) * 1e3 for kind in ("full", "delta")
                   if any(k == kind for k, _ in pauses)}
    out(f"publications: {len(windows)} (every >= {args.publish_every} s), "
        f"{', '.join(f'{r.seconds:.2f}' for r in publisher.results)} s each, "
        f"{sum(r.patchable for r in publisher.results)} with a patchable delta file "
        f"({os.path.getsize(pub + '.delta.npz') / 2**20:.2f} MiB the last, model {os.path.getsize(pub) / 2**20:.0f} MiB)")
    out(f"batch interval: p50 {np.median(gaps):.2f} ms; longest while a publication was written "
        f"{max(during) if during else float('nan'):.2f} ms over {len(during)} batches; longest overall "
        f"{gaps.max():.1f} ms (the loop's snapshot pause: full {snapshot_ms.get('full', float('nan')):.0f} ms, "
        f"delta {snapshot_ms.get('delta', float('nan')):.1f} ms)")
    during_ck = [g for g, t in zip(gaps, stamps[1:]) if any(a <= t and t - g / 1e3 <= b for a, b in writes)]
    outside = [g for g, t in zip(gaps, stamps[1:]) if not any(a <= t and t - g / 1e3 <= b for a, b in writes)]
    out(f"batch interval while a checkpoint was written: p50 {np.median(during_ck):.2f} ms, max "
        f"{max(during_ck):.1f} ms over {len(during_ck)} batches; outside writes: p50 {np.median(outside):.2f} ms, "
        f"max {max(outside):.1f} ms over {len(outside)} batches" if during_ck and outside else
        "batch interval while a checkpoint was written: no batch overlapped a write")
    if snaps:
        out(f"copy-on-write fulls: rows saved aside per snapshot {', '.join(str(x.saved_rows) for x in snaps)}; "
            f"most held at once {max(x.peak_saved_bytes for x in snaps) / 2**20:.1f} MiB")
    peak = _peak_rss_mb()
    out(f"RSS {C.rss_mb():.0f} MB at the end, {peak0:.0f} MB at the start of the run (model built, tables and "
        f"optimizer state {state_bytes / 2**20:.0f} MiB); peak during the run {peak:.0f} MB: "
        f"+{(peak - peak0) * 2**20 / state_bytes:.2f}x the tables and state above the start")
    if ratios:
        worst = max(ratios)
        out(f"== target: a delta checkpoint of 1 % touched rows writes <= 5 % of a full's bytes: "
            f"{'met' if worst <= 0.05 else 'MISSED'} (worst delta {100 * worst:.2f} %)")
    shutil.rmtree(tmp, ignore_errors=True)


# -- 4. a full checkpoint while training: copy + write against copy-on-write streaming -----------------------------
def cow_ab(args: argparse.Namespace, out: Callable[[str], None], log: Callable[[str], None]) -> None:
    """Steps of a table model on the main thread while a full checkpoint of its tables is written by another:
    (copy) the tables and state copied on the training thread, the copies written (what a full did before);
    (cow) a copy-on-write snapshot streamed by the writer.  Interleaved rounds; per arm: the training thread's
    pause to take the snapshot, the step time while the write runs against the steps before it, the write time,
    and the peak RSS above the start of the round per byte of tables and state."""
    import gc

    import numpy as np

    import streamfit
    from streamfit._engine.testing import two_input_model
    from streamfit.checkpoint import CheckpointStore
    from streamfit.daemon.state import snapshot_tables

    rows = 2 ** 16 if args.quick else args.table_rows
    dim, batch = 16, 1024
    touched = max(batch, int(rows * args.table_spread))
    subset = np.random.default_rng(0).permutation(rows)[:touched]
    est = streamfit.OnnxRegressor(two_input_model(8, rows, dim=dim, seed=0), optimizer=args.table_optimizer,
                                  learning_rate="constant", eta0=0.01, penalty=None)
    g = np.random.default_rng(1)
    data = [({"x": g.standard_normal((batch, 8)).astype(np.float32), "ids": subset[g.integers(0, touched, batch)]},
             g.standard_normal(batch).astype(np.float32)) for _ in range(32)]
    est.partial_fit(*data[0])
    sparse = est.trainer_.tables
    state_bytes = sum(a.nbytes for a in sparse.arrays.values()) + sum(
        a.nbytes for st in sparse.state_arrays().values() for a in st.values())
    tmp = tempfile.mkdtemp(prefix="bench-cow-")
    results: dict[str, list[dict[str, float]]] = {"copy": [], "cow": []}
    k = 0
    for r in range(args.cow_rounds):
        for arm in (("copy", "cow") if r % 2 == 0 else ("cow", "copy")):
            before = []
            for _ in range(20):
                t0 = time.perf_counter()
                est.partial_fit(*data[k % 32])
                before.append(time.perf_counter() - t0)
                k += 1
            gc.collect()
            base = C.rss_mb()
            _reset_peak_rss()
            store = CheckpointStore(os.path.join(tmp, f"{arm}-{r}"), keep=1)
            t0 = time.perf_counter()
            ts = snapshot_tables(est, None, copy=arm == "copy")
            pause = time.perf_counter() - t0
            span: list[float] = []

            def write() -> None:
                a = time.perf_counter()
                store.save(1, ts.model, ts.arrays, {}, tables=ts.tables)
                span.append(time.perf_counter() - a)

            writer = threading.Thread(target=write)
            writer.start()
            during = []
            while writer.is_alive():
                t0 = time.perf_counter()
                est.partial_fit(*data[k % 32])
                during.append(time.perf_counter() - t0)
                k += 1
            writer.join()
            del ts
            gc.collect()
            peak = _peak_rss_mb()
            results[arm].append({"pause": pause, "before": statistics.median(before),
                                 "during": statistics.median(during), "steps": len(during), "write": span[0],
                                 "peak": (peak - base) * 2**20 / state_bytes})
            shutil.rmtree(os.path.join(tmp, f"{arm}-{r}"), ignore_errors=True)
            log(f"round {r} {arm}: {results[arm][-1]}")
    out(f"== a full checkpoint while training: {rows} x {dim} float32 table ({rows * dim * 4 / 2**20:.0f} MiB), "
        f"{args.table_optimizer} ({state_bytes / 2**20:.0f} MiB of tables and state), batch {batch}, "
        f"{args.cow_rounds} interleaved rounds (medians) ==")
    out(f"{'arm':<6} {'pause ms':>9} {'step before ms':>15} {'step during ms':>15} {'during/before':>14} "
        f"{'write s':>8} {'peak RSS +x':>12}")
    for arm, rs in results.items():
        def med(key: str) -> float:
            return statistics.median(x[key] for x in rs)
        out(f"{arm:<6} {med('pause') * 1e3:>9.1f} {med('before') * 1e3:>15.2f} {med('during') * 1e3:>15.2f} "
            f"{statistics.median(x['during'] / x['before'] for x in rs):>14.2f} {med('write'):>8.2f} "
            f"{med('peak'):>12.2f}")
    shutil.rmtree(tmp, ignore_errors=True)


def _table_batches(subset: Any, touched: int, batch: int, seed: int) -> Any:
    import numpy as np
    import pyarrow as pa

    g = np.random.default_rng(seed)
    while True:
        x = g.standard_normal((batch, 8)).astype(np.float32)
        ids = subset[g.integers(0, touched, batch)]
        cols = {f"x{j}": x[:, j] for j in range(8)}
        cols["ids"], cols["y"] = ids.astype(np.int64), (x.sum(axis=1) + (ids % 7) * 0.1).astype(np.float32)
        yield pa.record_batch(cols)


def _reset_peak_rss() -> None:
    """Linux: reset this process's VmHWM to its current RSS (``5`` to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run (< 30 s): short arms, one round")
    p.add_argument("--source", choices=["memory", "parquet"], default="memory")
    p.add_argument("--seconds", type=float, help="measured seconds per arm and round (default 10: two checkpoints"
                                                 " of the 5 s arm in each; --quick 1.5)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 7, --quick 1)")
    p.add_argument("--optimizer", default="sgd", help="estimator optimizer (sgd, adam, ...): adam triples the state")
    p.add_argument("--threads", type=int, help="ORT intra-op threads (default: ORT's)")
    p.add_argument("--rss", action="store_true", help="measure the daemon's RSS over a long stream instead")
    p.add_argument("--rss-rows", type=int, default=10_000_000)
    p.add_argument("--rss-every", type=int, help="rows between RSS samples (default rows / 40)")
    p.add_argument("--rss-model", choices=["linear", "mlp"], default="linear")
    p.add_argument("--rss-layout", choices=sorted(C.LAYOUTS), default="mixed")
    p.add_argument("--rss-timeout", type=float, default=1800.0, help="SIGTERM the daemon after this many seconds")
    p.add_argument("--tables", action="store_true", help="delta checkpoints of a large embedding table instead")
    p.add_argument("--table-rows", type=int, default=2 ** 24, help="rows of the table (x 16 float32; --quick 2^16)")
    p.add_argument("--table-every", type=int, default=50, help="batches between checkpoints")
    p.add_argument("--table-optimizer", default="adagrad")
    p.add_argument("--table-spread", type=float, default=0.01, help="fraction of the rows the ids are drawn from")
    p.add_argument("--publish-every", type=float, default=2.0, help="seconds between publications at most")
    p.add_argument("--cow", action="store_true", help="a full checkpoint while training: copy vs copy-on-write")
    p.add_argument("--cow-rounds", type=int, default=3)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--json", metavar="PATH", help="also write the overhead run's figures as JSON (bench/plots.py "
                                                  "draws them; not with --rss, --tables or --cow)")
    args = p.parse_args(argv)
    if args.json and (args.rss or args.tables or args.cow):
        p.error("--json writes the overhead run only: drop --rss/--tables/--cow")
    env = run_env()
    t0 = time.perf_counter()

    def out(s: str = "") -> None:
        print(s, flush=True)

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    for s in C.header("streamfit checkpoint/daemon benchmark (issue: checkpoints and daemon)",
                      sys.argv[1:] if argv is None else argv):
        out(s)
    if args.quick:
        out("--quick: a smoke run (short arms, one round): the figures below say nothing about performance")
    if args.cow:
        cow_ab(args, out, log)
    elif args.tables:
        tables(args, out, log)
    elif args.rss:
        if args.quick:
            args.rss_rows = min(args.rss_rows, 500_000)
        rss_run(args, out, log)
    else:
        doc = overhead(args, out, log)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"env": {**env, "loadavg_end": list(os.getloadavg())}, **doc}, f, indent=1)
            out(f"wrote {args.json}")
    out(f"total {time.perf_counter() - t0:.0f} s; load average at the end {C.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
