#!/usr/bin/env python
"""Scale-out benchmark: streamfit.distributed on a local 2-node Ray cluster (both nodes on 127.0.0.1).

    python bench/scaleout.py            # about 2 minutes on 2 cores
    python bench/scaleout.py --quick    # smoke run (CI)
    python bench/scaleout.py --quick --json docs/benchmarks/data/scaleout.json   # bench/plots.py draws it

For the linear model (d=100) and the MLP 100-256-256-1 (plain SGD, batch 2048), from a Parquet directory
(one FixedSizeList<float32,100> column, files dealt to the learners):

* rows/s of one process (``train_stream_sync``, no Ray), of 1 learner actor and of 2 learner actors (one per
  node, 1 CPU each), synchronizing every ``--sync-every`` batches; learner rates are measured from the end of
  the first round to the end of the run (actor start-up excluded).  This machine has 2 cores shared by both
  nodes, the coordinator and the Parquet reads: 2 learners are not expected to reach 2x.
* the synchronization cost per round: median wall time from the last learner's report to the last learner
  released (fetching the states through the object store, mixing, putting and fetching the mix), and bytes
  moved (learners' arrays up + the mix down to each learner), with and without Adam's moments.
* a projection, on paper, of M machines (one learner each) from the measured compute per row and the
  measured sync cost: printed with its assumptions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402  (puts the repository root on sys.path)
from _cpu import run_env  # noqa: E402

BATCH = 2048


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def single_rate(kind: str, data: str) -> float:
    from streamfit import train_stream_sync

    summary = train_stream_sync(C.make_estimator(kind, BATCH), f"parquet:{data}", batch_size=BATCH,
                                features=["x"], evaluate=True)
    return summary.rows / summary.elapsed


def distributed(kind: str, data: str, workers: int, sync_every: int, optimizer: str = "sgd") -> dict:
    from streamfit.distributed import DistributedTrainer

    marks: list[tuple[float, int]] = []
    stats: list = []

    def on_round(trainer, s) -> None:
        marks.append((time.perf_counter(), s.rows))
        stats.append(s)

    est = C.make_estimator(kind, BATCH, optimizer=optimizer)
    summary = DistributedTrainer(est, f"parquet:{data}", workers=workers, sync_every_batches=sync_every,
                                 sync_optimizer=True, batch_size=BATCH, features=["x"], on_round=on_round).run()
    (t1, r1), (t2, r2) = marks[0], marks[-1]
    full = [s for s in stats if not s.ended]  # rounds where every learner trained (not the tail)
    return {"rows": summary.rows, "rate": (r2 - r1) / (t2 - t1) if t2 > t1 else float("nan"),
            "sync_ms": statistics.median(s.sync_seconds for s in full) * 1e3 if full else float("nan"),
            "bytes": statistics.median(s.synced_bytes for s in full) if full else 0, "rounds": len(stats)}


def sweep(data: str, batch: int, periods: list[int]) -> None:
    """The default synchronization period: rows/s of 2 learners and the share of a round spent synchronizing, for
    each ``sync_every_batches`` in ``periods``, the linear model (its plain-SGD updates at this rate barely depend
    on the weights, so its loss says nothing about the period: not printed)."""
    from streamfit import train_stream_sync
    from streamfit.distributed import DistributedTrainer

    single = train_stream_sync(C.make_estimator("linear", batch), f"parquet:{data}", batch_size=batch,
                               features=["x"], evaluate=True)
    print(f"\nsynchronization period, linear d=100, batch {batch}: one process {single.rows / single.elapsed / 1e3:,.0f}K "
          "rows/s")
    for k in periods:
        marks: list[tuple[float, int]] = []
        stats: list = []

        def on_round(trainer, s) -> None:
            marks.append((time.perf_counter(), s.rows))
            stats.append(s)

        summary = DistributedTrainer(C.make_estimator("linear", batch), f"parquet:{data}", workers=2,
                                     sync_every_batches=k, batch_size=batch, features=["x"], evaluate=True,
                                     on_round=on_round).run()
        (t1, r1), (t2, r2) = marks[0], marks[-1]
        full = [s for s in stats if not s.ended]
        sync = statistics.median(s.sync_seconds for s in full) * 1e3 if full else float("nan")
        wait = sum(s.wait_seconds for s in full)
        share = sum(s.sync_seconds for s in full) / max(wait + sum(s.sync_seconds for s in full), 1e-9)
        print(f"  every {k:>4} batches: {(r2 - r1) / (t2 - t1) / 1e3:>7,.0f}K rows/s, {len(stats):>5} rounds, sync "
              f"{sync:5.2f} ms/round ({share:4.0%} of the rounds' time), {summary.rows} rows")


def project(c_row: float, a0: float, a1: float, state_bytes: float, k_rows: int, bandwidth: float) -> list[dict]:
    """Rows/s of M learners: M*K*B rows per round of K*B*c compute + sync(M) (see the printed assumptions)."""
    out = []
    for m in (4, 8, 16, 32, 64):
        star = a0 + a1 * m + 2 * m * state_bytes / bandwidth  # every state through the coordinator's link
        ring = a0 + (m - 1) * a1 + 2 * (m - 1) / m * state_bytes / bandwidth  # 2(M-1) hops of a1/2
        compute = k_rows * c_row
        out.append({"machines": m, "star_rows_per_s": m * k_rows / (compute + star), "star_sync_ms": star * 1e3,
                    "star_sync_share": star / (compute + star), "ring_rows_per_s": m * k_rows / (compute + ring),
                    "ideal_rows_per_s": m / c_row})
    return out


def measure(kind: str, tmp: str, files: int, rows_per_file: int, sync_every: int) -> dict:
    """One model: one process, 1 and 2 learner actors, 2 with Adam; printed, and returned for ``--json``."""
    data = str(C.write_parquet_dir(os.path.join(tmp, f"data-{kind}"), "vec", rows_per_file, files))
    one_proc = single_rate(kind, data)
    d1 = distributed(kind, data, 1, sync_every)
    d2 = distributed(kind, data, 2, sync_every)
    adam = distributed(kind, data, 2, sync_every, optimizer="adam")
    assert d1["rows"] == d2["rows"] == files * rows_per_file
    print(f"\n{C.model_title(kind)}")
    print(f"  one process, no Ray      {one_proc / 1e3:>8,.0f}K rows/s")
    print(f"  1 learner actor          {d1['rate'] / 1e3:>8,.0f}K rows/s  ({d1['rate'] / one_proc:.2f}x one "
          f"process)   sync {d1['sync_ms']:.2f} ms/round, {d1['bytes'] / 1e3:,.1f} kB/round")
    print(f"  2 learner actors         {d2['rate'] / 1e3:>8,.0f}K rows/s  ({d2['rate'] / d1['rate']:.2f}x 1 "
          f"learner)   sync {d2['sync_ms']:.2f} ms/round, {d2['bytes'] / 1e3:,.1f} kB/round")
    print(f"  2 learners, Adam (+moments) {adam['rate'] / 1e3:>5,.0f}K rows/s  "
          f"sync {adam['sync_ms']:.2f} ms/round, {adam['bytes'] / 1e3:,.1f} kB/round")
    return {"kind": kind, "title": C.model_title(kind), "rows_per_file": rows_per_file, "one_process": one_proc,
            "one_learner": d1, "two_learners": d2, "two_learners_adam": adam}


def print_projection(results: list[dict], sync_every: int, bandwidth: float) -> None:
    """The paper projection of M machines from each model's measured figures, with its assumptions; each
    result gets its ``projection`` (the fitted constants and the rows/s per M)."""
    print("\nProjection on paper for M machines, one learner each (NOT measured):")
    print("  assumptions: compute per row c = 1 / (1-learner-actor rate) measured above (one core per learner,")
    print("  the input read included); the per-round fixed cost a0 + a1*M fitted to the 1- and 2-learner sync")
    print(f"  times measured here (loopback RPCs); every state crosses a {bandwidth / 1e9:.2f} GB/s link "
          "(star: M states up and M down")
    print("  through the coordinator; ring allreduce: 2(M-1)/M states per link, 2(M-1) hops of a1/2 each);")
    print("  rounds of K batches; learners")
    print("  equally fast (a straggler's delay adds to every round); no input bottleneck at the source.")
    k_rows = sync_every * BATCH
    for r in results:
        d1, d2 = r["one_learner"], r["two_learners"]
        c_row = 1 / d1["rate"]
        a1 = max((d2["sync_ms"] - d1["sync_ms"]) / 1e3, 0.0)
        a0 = max(d1["sync_ms"] / 1e3 - a1, 0.0)
        state = d2["bytes"] / 4  # per learner, one direction (2 learners, up + down)
        print(f"\n{r['title']}: c = {c_row * 1e6:.2f} us/row, state {state / 1e3:,.1f} kB, "
              f"a0 = {a0 * 1e3:.2f} ms, a1 = {a1 * 1e3:.2f} ms/learner, K*B = {k_rows} rows")
        rows = project(c_row, a0, a1, state, k_rows, bandwidth)
        for x in rows:
            print(f"  M={x['machines']:>2}: star {x['star_rows_per_s'] / 1e3:>9,.0f}K rows/s "
                  f"(sync {x['star_sync_ms']:6.1f} ms = {x['star_sync_share']:4.0%} of a round)   "
                  f"ring allreduce {x['ring_rows_per_s'] / 1e3:>9,.0f}K rows/s   "
                  f"ideal {x['ideal_rows_per_s'] / 1e3:>9,.0f}K")
        r["projection"] = {"c_us_per_row": c_row * 1e6, "state_kb": state / 1e3, "a0_ms": a0 * 1e3,
                           "a1_ms": a1 * 1e3, "k_rows": k_rows, "bandwidth": bandwidth, "machines": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small data, one model: a smoke run")
    parser.add_argument("--sync-every", type=int, default=8, help="batches between synchronizations")
    parser.add_argument("--bandwidth", type=float, default=1.25e9, help="bytes/s per machine link (projection)")
    parser.add_argument("--sweep", action="store_true", help="only the sweep of synchronization periods (the "
                        "default --sync-every-batches), at the CLI's default batch of 256 rows")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/plots.py draws them; "
                                                       "not with --sweep)")
    args = parser.parse_args()
    if args.json and args.sweep:
        parser.error("--json writes the scale-out run only, not --sweep")
    from streamfit.distributed import LocalRayCluster

    env = run_env()
    if args.sweep:
        print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        with tempfile.TemporaryDirectory(prefix="sf-scaleout-") as tmp:
            with LocalRayCluster(os.path.join(tmp, "ray"), nodes=2, cpus=1) as cluster:
                cluster.connect()
                data = str(C.write_parquet_dir(os.path.join(tmp, "data"), "vec", 131072, 4))
                sweep(data, 256, [1, 4, 16, 64, 256])
                import ray

                ray.shutdown()
        return

    kinds = ["linear"] if args.quick else ["linear", "mlp"]
    files = 4 if args.quick else 8
    rows = {"linear": 16384 if args.quick else 262144, "mlp": 65536}  # per file: a few seconds per run
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; Parquet {files} files "
          f"({', '.join(f'{k} {rows[k]:,} rows each' for k in kinds)}); batch {BATCH}, sync every {args.sync_every} "
          "batches")
    with tempfile.TemporaryDirectory(prefix="sf-scaleout-") as tmp:
        t0 = time.perf_counter()
        with LocalRayCluster(os.path.join(tmp, "ray"), nodes=2, cpus=1) as cluster:
            cluster.connect()
            up = time.perf_counter() - t0
            print(f"local Ray cluster (head + 1 node, 1 CPU each, 127.0.0.1) up in {up:.1f} s")
            results = [measure(kind, tmp, files, rows[kind], args.sync_every) for kind in kinds]
            import ray

            ray.shutdown()
    print_projection(results, args.sync_every, args.bandwidth)
    if args.json:
        doc = {"env": {**env, "loadavg_end": list(os.getloadavg())},
               "config": {"quick": args.quick, "files": files, "batch": BATCH, "sync_every": args.sync_every,
                          "nodes": 2, "cpus_per_node": 1, "cluster_up_s": up}, "results": results}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
