#!/usr/bin/env python
"""Soak of the daemon: ``streamfit serve`` on a live Kafka topic for minutes, as an operator runs it.

    python bench/soak.py                    # dense LinearRegressor, 3,000 rows/s for 420 s (~7.5 min)
    python bench/soak.py --hashed           # hashed LogisticRegression (FTRL, 2^20 buckets, 20 strings), 90 s
    python bench/soak.py --quick            # smoke run, a few seconds of stream (CI)
    python bench/soak.py --json /tmp/soak.json --duration 120 --rate 5000
    python bench/soak.py --duration 60 --json docs/benchmarks/data/soak.json   # the committed run (~1.5 min)

A tansu broker on 127.0.0.1 (memory storage) and a one-partition topic; a producer thread paced at
``--rate`` rows/s sends Arrow IPC messages of ``--rows-per-message`` rows, about ``--bad-fraction`` of them
bad (in turn: undecodable bytes, a feature column missing, a feature column of the wrong type, a null
label in one row); the good rows end on a multiple of the batch size plus ``--partial-tail`` (300), a
partial batch the daemon must train while the stream is quiet.  ``streamfit serve`` runs as a subprocess
with a checkpoint every 1 s, ``--keep 3``, ``--publish`` every 2 s, a dead-letter file, a health file,
Prometheus metrics and ``--log-json``.

Once a second the bench samples the daemon: VmRSS, threads (/proc/PID/status), open fds (/proc/PID/fd),
CPU time, the health file and the metrics endpoint (rows trained and source position, set on every batch).
Lag is the age of the oldest row sent and not yet trained (now minus the send time of the message at the
daemon's position; without metrics, the same from the health file at its ``last_batch_at``); lag in rows is
the good rows sent minus the rows trained.  Checkpoint write times come from the daemon's ``checkpoint``
log events.  The stream starts once the daemon has joined its consumer group.

When the stream has been produced (and the daemon has drained it, at most ``--drain`` s), SIGTERM: the
exit code and the time to exit.  Then exactly once: the final checkpoint's row counter equals the good
rows produced, its skip counts equal the bad rows and messages produced (by reason), the dead-letter
file holds one record per bad message with its rows, and the group's committed offset is the end of the
topic.  The table gives the RSS slope in MB/h (least squares over the second half of the run), fds and
threads first/last/max, lag p50/p95 (second half), checkpoint writes p50/p95, the SIGTERM exit, rows/s;
``--json`` writes every figure and the per-second samples.

The figures depend on the machine and its load (printed: CPU model, AVX-512, load average).  On 2 cores
shared with other jobs, the daemon, the broker and the producer compete for CPU: lag and checkpoint times
move with the load; RSS slope, fds and threads should not.  Exit status: 0 when exactly-once holds and the
daemon exited 0 after SIGTERM, 1 otherwise.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402  (puts the repository root on sys.path)
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from _cpu import cpu_model, has_avx512, run_env  # noqa: E402

N_FEATURES = 20
_kafka_log = logging.getLogger("soak.kafka")  # librdkafka's lines (a broker going away at the end) stay quiet
BAD_KINDS = ("undecodable", "missing_column", "wrong_type", "null_label")
#: what the daemon counts each bad kind under: (message reason or None, row reason or None)
BAD_REASONS = {"undecodable": ("undecodable", None), "missing_column": ("missing_column", "missing_column"),
               "wrong_type": ("wrong_type", "wrong_type"), "null_label": (None, "null")}


@dataclass(frozen=True)
class SoakConfig:
    """One soak: the stream, the model and the daemon's schedules."""

    hashed: bool
    duration: float
    rate: float
    rows_per_message: int
    bad_fraction: float
    batch_size: int
    partial_tail: int = 0
    checkpoint_every: float = 1.0
    publish_every: float = 2.0
    keep: int = 3
    buckets: int = 2 ** 20
    drain: float = 60.0
    quiet: float = 5.0
    join_timeout: float = 180.0
    pool: int = 64


# -- the stream --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """One message the producer sends: its bytes, kind (``good`` or a bad kind) and rows."""

    value: bytes
    kind: str
    rows: int

    @property
    def good_rows(self) -> int:
        """Rows the daemon should train: all of a good message, all but one of a null-label one, else none."""
        if self.kind == "good":
            return self.rows
        return self.rows - 1 if self.kind == "null_label" else 0


class Stream:
    """Pre-encoded messages (a pool of good ones cycled, one template per bad kind), so that the producer
    costs little CPU: dense rows are 20 float32 features ``f0..f19`` and a float32 ``y``; hashed rows are 20
    string columns ``c0..c19`` (:class:`streamfit.testing.ClickStream`) and an int64 ``label``."""

    def __init__(self, cfg: SoakConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        n = cfg.rows_per_message
        if cfg.hashed:
            from streamfit.testing import ClickStream

            clicks = ClickStream(seed=seed, n_dense=0, strings=True)
            batches = [clicks.batch(i, n) for i in range(cfg.pool)]
            self.features, self.label = clicks.categorical, "label"
        else:
            w = (self.rng.standard_normal(N_FEATURES) / np.sqrt(N_FEATURES)).astype(np.float32)
            batches = [self._dense(n, w) for _ in range(cfg.pool)]
            self.features, self.label = [f"f{i}" for i in range(N_FEATURES)], "y"
        self.batches = batches
        self.good = [Message(C.ipc_bytes(b), "good", n) for b in batches]
        self.bad = {kind: Message(self._bad(batches[0], kind), kind, 0 if kind == "undecodable" else n)
                    for kind in BAD_KINDS}
        self.every = max(2, round(1 / cfg.bad_fraction)) if cfg.bad_fraction > 0 else 0

    def _dense(self, n: int, w: np.ndarray) -> pa.RecordBatch:
        X = self.rng.standard_normal((n, N_FEATURES), dtype=np.float32)
        y = X @ w + np.float32(0.1) * self.rng.standard_normal(n, dtype=np.float32)
        cols = [pa.array(np.ascontiguousarray(X[:, i])) for i in range(N_FEATURES)] + [pa.array(y.astype(np.float32))]
        return pa.record_batch(cols, names=[f"f{i}" for i in range(N_FEATURES)] + ["y"])

    def _bad(self, batch: pa.RecordBatch, kind: str) -> bytes:
        if kind == "undecodable":
            return b"not an Arrow IPC stream " + self.rng.bytes(64)
        if kind == "missing_column":
            return C.ipc_bytes(batch.drop_columns([self.features[7]]))
        if kind == "wrong_type":  # a list column where a float (dense) or a string (hashed) column is expected
            i = batch.schema.get_field_index(self.features[3])
            wrong = pa.array([[1.0, 2.0]] * batch.num_rows, type=pa.list_(pa.float64()))
            return C.ipc_bytes(batch.set_column(i, self.features[3], wrong))
        assert kind == "null_label"
        i = batch.schema.get_field_index(self.label)
        values = batch.column(i).to_pylist()
        values[batch.num_rows // 2] = None
        return C.ipc_bytes(batch.set_column(i, self.label, pa.array(values, type=batch.schema.field(i).type)))

    def message(self, index: int) -> Message:
        """Message ``index`` of the stream: bad at one index in ``every``, the kinds in turn."""
        if self.every and index % self.every == self.every // 2:
            return self.bad[BAD_KINDS[(index // self.every) % len(BAD_KINDS)]]
        return self.good[index % len(self.good)]

    def plan(self, duration: float, rate: float) -> list[Message]:
        """The messages of ``duration`` s at ``rate`` rows/s, then good ones of fewer rows until the good rows
        are a multiple of the batch size (the stream's end fills its last batch), then ``cfg.partial_tail``
        good rows: a partial batch the daemon must train while the stream is quiet (``--max-batch-wait``)."""
        n = max(1, round(rate * duration / self.cfg.rows_per_message))
        out = [self.message(i) for i in range(n)]
        short = -sum(m.good_rows for m in out) % self.cfg.batch_size + self.cfg.partial_tail
        while short:
            rows = min(short, self.cfg.rows_per_message)
            out.append(Message(C.ipc_bytes(self.batches[0].slice(0, rows)), "good", rows))
            short -= rows
        return out


class Producer(threading.Thread):
    """Sends the stream's messages to partition 0 at ``rate`` rows/s for ``duration`` s; records each
    message's send time and, from the delivery reports, its offset."""

    def __init__(self, bootstrap: str, topic: str, plan: list[Message], rate: float) -> None:
        super().__init__(name="soak-producer", daemon=True)
        from confluent_kafka import Producer as KafkaProducer

        self.producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                       "message.max.bytes": 16 * 2 ** 20}, logger=_kafka_log)
        self.topic, self.plan, self.rate = topic, plan, rate
        self.sent_at: list[float] = []  # wall time (time.time) of each message, by index
        self.good_cum: list[int] = []   # good rows sent up to and including message i
        self.kinds: list[str] = []
        self.offsets: dict[int, int] = {}  # offset -> message index
        self.errors: list[str] = []
        self.behind = 0.0  # the most the producer fell behind its schedule (s)
        self.done = threading.Event()

    def _delivered(self, index: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(f"message {index}: {err}")
            else:
                self.offsets[msg.offset()] = index
        return cb

    def run(self) -> None:
        t0 = time.monotonic()
        good = sent = 0
        try:
            for i, msg in enumerate(self.plan):
                due = t0 + sent / self.rate
                sent += msg.rows
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                else:
                    self.behind = max(self.behind, now - due)
                while True:
                    try:
                        self.producer.produce(self.topic, value=msg.value, partition=0, on_delivery=self._delivered(i))
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                good += msg.good_rows
                self.sent_at.append(time.time())
                self.good_cum.append(good)
                self.kinds.append(msg.kind)
                self.producer.poll(0)
            if self.producer.flush(60):
                self.errors.append("messages left undelivered after 60 s")
        finally:
            self.done.set()

    # -- what was sent ---------------------------------------------------------------------------------------
    def good_rows_by(self, t: float) -> int:
        """Good rows sent by wall time ``t``."""
        k = bisect.bisect_right(self.sent_at, t)
        return self.good_cum[k - 1] if k else 0

    def sent_time_of_offset(self, offset: int) -> float | None:
        index = self.offsets.get(offset)
        return None if index is None else self.sent_at[index]


# -- the daemon --------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics_available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def serve_command(cfg: SoakConfig, stream: Stream, source: str, tmp: str, metrics_port: int | None) -> list[str]:
    """``streamfit serve`` as the soak runs it (the flags an operator would give)."""
    cmd = [sys.executable, "-m", "streamfit.cli", "serve", "--source", source,
           "--checkpoint-dir", os.path.join(tmp, "ckpt"), "--checkpoint-every-seconds", str(cfg.checkpoint_every),
           "--keep", str(cfg.keep), "--publish", os.path.join(tmp, "published", "model.onnx"),
           "--publish-every", str(cfg.publish_every), "--dead-letter", os.path.join(tmp, "dead-letters.jsonl"),
           "--health-file", os.path.join(tmp, "health.json"), "--log-json", "--no-progress", "--on-bad", "skip",
           "--batch-size", str(cfg.batch_size), "--label", stream.label]
    if metrics_port is not None:
        cmd += ["--metrics-port", str(metrics_port)]
    if cfg.hashed:
        cmd += ["--estimator", "LogisticRegression", "--categorical", ",".join(stream.features),
                "--buckets", str(cfg.buckets), "--optimizer", "ftrl", "--eta0", "0.1", "--classes", "0,1"]
    else:
        cmd += ["--estimator", "LinearRegressor", "--features", ",".join(stream.features)]
    return cmd


@dataclass
class Sample:
    """One second of the daemon, as the bench saw it."""

    t: float  # seconds since the daemon started
    rss_mb: float
    fds: int
    threads: int
    cpu_s: float
    rows: int | None = None           # from the health file
    lag_s: float | None = None        # age of the oldest row sent and not yet trained
    lag_rows: int | None = None
    checkpoint_age_s: float | None = None  # from the metrics endpoint
    metric_rows: int | None = None         # rows trained, from the metrics endpoint (set on every batch)
    published_mtime: float | None = None


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def _scrape(port: int) -> dict[str, float]:
    """The metrics endpoint's samples by name (a labelled one as ``name{labels}``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


class Sampler:
    """Once a second: the daemon's /proc figures, its health file and metrics, and lag against the producer."""

    def __init__(self, proc: subprocess.Popen[Any], tmp: str, producer: Producer, metrics_port: int | None) -> None:
        self.proc, self.tmp, self.producer, self.metrics_port = proc, tmp, producer, metrics_port
        self.t0, self.wall0 = time.monotonic(), time.time()
        self.samples: list[Sample] = []
        self.health: dict[str, Any] = {}
        self._health_at: float | None = None
        self.metric_errors = 0
        self.first_batch_t: float | None = None

    def sample(self) -> Sample | None:
        pid = self.proc.pid
        try:
            st = _status(pid)
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            cpu = C.proc_cpu(pid)
        except (OSError, ValueError):
            return None
        s = Sample(time.monotonic() - self.t0, int(st["VmRSS"].split()[0]) / 1024, fds, int(st["Threads"]), cpu)
        try:
            with open(os.path.join(self.tmp, "health.json")) as f:
                health = json.load(f)
        except (OSError, ValueError):
            health = None
        if health is not None:
            self.health = health
            s.rows = int(health.get("rows", 0))
            if self.first_batch_t is None:
                self.first_batch_t = s.t
        m: dict[str, float] = {}
        if self.metrics_port is not None:
            try:
                m = _scrape(self.metrics_port)
            except OSError:
                self.metric_errors += 1
            s.checkpoint_age_s = m.get("streamfit_checkpoint_age_seconds")
            if "streamfit_rows_trained" in m:
                s.metric_rows = int(m["streamfit_rows_trained"])
        offset = m.get('streamfit_source_position{part="partitions.0.offset"}')
        if offset is not None and s.metric_rows is not None:  # where the daemon is now (set on every batch)
            s.lag_s, s.lag_rows = self._lag(time.time(), s.metric_rows, int(offset))
        elif health is not None and health.get("last_batch_at") != self._health_at:  # a new health update
            self._health_at = health.get("last_batch_at")
            try:
                offset = int(health["position"]["partitions"]["0"]["offset"])
            except (KeyError, TypeError, ValueError):
                offset = None
            if offset is not None and self._health_at is not None:
                s.lag_s, s.lag_rows = self._lag(float(self._health_at), int(health.get("rows", 0)), int(offset))
        try:
            s.published_mtime = os.stat(os.path.join(self.tmp, "published", "model.onnx")).st_mtime
        except OSError:
            pass
        self.samples.append(s)
        return s

    def _lag(self, at: float, rows: int, offset: int) -> tuple[float, int]:
        """Lag at wall time ``at`` of a daemon that has trained ``rows`` rows, up to message ``offset``: the age
        of the oldest row sent and not yet trained (the message at ``offset``, if sent by then), and the good
        rows sent by then minus those trained."""
        sent = self.producer.sent_time_of_offset(offset)
        lag_s = 0.0 if sent is None or sent > at else at - sent
        return lag_s, max(0, self.producer.good_rows_by(at) - rows)


# -- the run -----------------------------------------------------------------------------------------------------
@dataclass
class Figures:
    """What the soak measured (``--json`` writes it)."""

    config: dict[str, Any]
    cpu: str
    avx512: bool
    cpus: int | None
    load_start: str
    load_end: str = ""
    rss_slope_mb_per_h: float | None = None
    rss_first_mb: float | None = None
    rss_last_mb: float | None = None
    rss_max_mb: float | None = None
    fds: tuple[int, int, int] | None = None  # first, last, max
    threads: tuple[int, int, int] | None = None
    lag_p50_s: float | None = None
    lag_p95_s: float | None = None
    lag_max_s: float | None = None
    lag_rows_p50: float | None = None
    lag_rows_p95: float | None = None
    checkpoints: int = 0
    checkpoint_write_p50_ms: float | None = None
    checkpoint_write_p95_ms: float | None = None
    checkpoint_write_max_ms: float | None = None
    checkpoint_age_p95_s: float | None = None
    publications_seen: int = 0
    daemon_ready_s: float | None = None  # from its start to a stable group (the stream starts then)
    sigterm_exit_code: int | None = None
    sigterm_exit_s: float | None = None
    rows_trained: int | None = None
    rows_per_s: float | None = None
    daemon_cores: float | None = None
    producer_behind_s: float = 0.0
    produced: dict[str, Any] = field(default_factory=dict)
    quiet: dict[str, Any] = field(default_factory=dict)  # the daemon's state once the stream went quiet
    checks: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _slope_per_hour(ts: list[float], ys: list[float]) -> float | None:
    if len(ts) < 3 or max(ts) - min(ts) <= 0:
        return None
    return float(np.polyfit(np.asarray(ts), np.asarray(ys), 1)[0]) * 3600


def _checkpoint_events(log_path: str) -> list[dict[str, Any]]:
    events = []
    with open(log_path, errors="replace") as f:
        for line in f:
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "checkpoint":
                events.append(ev)
    return events


def _final_manifest(ckpt_dir: str) -> dict[str, Any]:
    """The meta of the newest checkpoint (what a resume would start from), verified by the store."""
    from streamfit.checkpoint import CheckpointStore

    latest = CheckpointStore(ckpt_dir).load_latest()
    if latest is None:
        raise RuntimeError(f"no checkpoint in {ckpt_dir}")
    return dict(latest.meta)


def _committed(bootstrap: str, topic: str, group: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False},
                        logger=_kafka_log)
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def _wait_joined(proc: subprocess.Popen[Any], bootstrap: str, group: str, timeout: float) -> float:
    """Wait until the daemon's consumer group is stable (it has joined and holds the partition); seconds
    since ``proc`` started.  The stream starts then, so lag measures the daemon, not its start-up."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    t0 = time.monotonic()
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_kafka_log)
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode} before joining the group")
        try:
            state = admin.describe_consumer_groups([group])[group].result(5).state
        except Exception:  # noqa: BLE001 - not known to the broker yet
            state = None
        if state == ConsumerGroupState.STABLE:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise RuntimeError(f"the daemon did not join group {group!r} within {timeout:.0f} s")


def run_soak(cfg: SoakConfig, log: Any, keep_dir: bool = False) -> Figures:
    """Run one soak and return its figures (exactly-once checks included)."""
    fig = Figures(config=asdict(cfg), cpu=cpu_model(), avx512=has_avx512(), cpus=os.cpu_count(),
                  load_start=C.load_average())
    tmp = tempfile.mkdtemp(prefix="streamfit-soak-")
    broker = C.Tansu.start()
    proc = None
    err = None
    try:
        topic = broker.create_topic("soak", partitions=1)
        group = "soak"
        stream = Stream(cfg)
        producer = Producer(broker.bootstrap, topic, stream.plan(cfg.duration, cfg.rate), cfg.rate)
        metrics_port = _free_port() if _metrics_available() else None
        if metrics_port is None:
            fig.notes.append("prometheus-client is not installed: no --metrics-port (lag from the health file, no "
                             "checkpoint age; the stream's end is seen by the health file's rows, or --drain s "
                             "without progress)")
        source = (f"kafka://{broker.bootstrap}/{topic}?group={group}&session.timeout.ms=6000"
                  "&heartbeat.interval.ms=500")
        cmd = serve_command(cfg, stream, source, tmp, metrics_port)
        log("daemon: " + " ".join(cmd[2:]))
        env = {**os.environ, "PYTHONPATH": C.ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        log_path = os.path.join(tmp, "serve.log")
        err = open(log_path, "w")
        proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        sampler = Sampler(proc, tmp, producer, metrics_port)
        fig.daemon_ready_s = _wait_joined(proc, broker.bootstrap, group, timeout=cfg.join_timeout)
        log(f"daemon in the group after {fig.daemon_ready_s:.1f} s: producing")
        producer.start()
        t_produce = time.monotonic()
        next_t = time.monotonic()
        drained_at = None
        last_rows, still_since = -1, time.monotonic()
        while proc.poll() is None:
            next_t += 1.0
            time.sleep(max(0.0, next_t - time.monotonic()))
            s = sampler.sample()
            if s is None:
                break
            rows = max(s.rows or 0, s.metric_rows or 0)  # the health file is rewritten at most once a second
            if len(sampler.samples) % 30 == 0:
                log(f"  t={s.t:5.0f} s  rows {rows:>10,}  RSS {s.rss_mb:6.1f} MB  fds {s.fds}  threads "
                    f"{s.threads}  lag {'-' if s.lag_s is None else f'{s.lag_s:.2f} s'}")
            if rows != last_rows:
                last_rows, still_since = rows, time.monotonic()
            if not producer.done.is_set():
                continue
            good = producer.good_cum[-1] if producer.good_cum else 0
            if rows >= good or time.monotonic() - still_since > cfg.drain:
                drained_at = time.monotonic()
                break
        if proc.poll() is None:  # the stream is quiet: what the daemon's state says after a while
            time.sleep(cfg.quiet)
            _quiet_figures(fig, cfg, tmp, producer, broker.bootstrap, topic, group)
        if proc.poll() is not None:
            fig.problems.append(f"the daemon exited with {proc.returncode} before SIGTERM")
        else:
            t_term = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                fig.problems.append("the daemon did not exit within 120 s of SIGTERM (killed)")
                proc.kill()
                proc.wait(10)
            fig.sigterm_exit_s = time.monotonic() - t_term
            fig.sigterm_exit_code = proc.returncode
        err.close()
        err = None
        producer.join(60)
        log(f"drained {0 if drained_at is None else drained_at - t_produce:.0f} s after the producer started; "
            f"SIGTERM -> exit {fig.sigterm_exit_code} in {fig.sigterm_exit_s or 0:.2f} s")
        _summarize(fig, cfg, sampler, producer)
        _checkpoint_figures(fig, log_path)
        _check_exactly_once(fig, cfg, tmp, producer, broker.bootstrap, topic, group)
        if fig.problems or not fig.exactly_once:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-4000:]
            log("daemon log (tail):\n" + tail)
    finally:
        if err is not None:
            err.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        broker.stop()
        if keep_dir:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    fig.load_end = C.load_average()
    return fig


def _summarize(fig: Figures, cfg: SoakConfig, sampler: Sampler, producer: Producer) -> None:
    samples = sampler.samples
    fig.samples = [asdict(s) for s in samples]
    fig.producer_behind_s = producer.behind
    if producer.errors:
        fig.problems += producer.errors[:5]
    if not samples:
        fig.problems.append("no sample of the daemon")
        return
    start = sampler.first_batch_t if sampler.first_batch_t is not None else samples[0].t
    live = [s for s in samples if s.t >= start] or samples
    end = live[-1].t
    half = [s for s in live if s.t >= start + (end - start) / 2]
    fig.rss_slope_mb_per_h = _slope_per_hour([s.t for s in half], [s.rss_mb for s in half])
    fig.rss_first_mb, fig.rss_last_mb = live[0].rss_mb, live[-1].rss_mb
    fig.rss_max_mb = max(s.rss_mb for s in live)
    fig.fds = (live[0].fds, live[-1].fds, max(s.fds for s in live))
    fig.threads = (live[0].threads, live[-1].threads, max(s.threads for s in live))
    # lag while the stream is produced (the quiet tail after it has no new rows to be late)
    t_last_sent = producer.sent_at[-1] - sampler.wall0 if producer.sent_at else end
    lag_half = [s for s in half if s.t <= t_last_sent + 1]
    lags = [s.lag_s for s in lag_half if s.lag_s is not None]
    lag_rows = [float(s.lag_rows) for s in lag_half if s.lag_rows is not None]
    fig.lag_p50_s, fig.lag_p95_s = _pct(lags, 50), _pct(lags, 95)
    fig.lag_max_s = max((s.lag_s for s in live if s.lag_s is not None), default=None)
    fig.lag_rows_p50, fig.lag_rows_p95 = _pct(lag_rows, 50), _pct(lag_rows, 95)
    ages = [s.checkpoint_age_s for s in half if s.checkpoint_age_s is not None]
    fig.checkpoint_age_p95_s = _pct(ages, 95)
    fig.publications_seen = len({s.published_mtime for s in samples if s.published_mtime is not None})
    counted = [(s.t, float(max(s.rows or 0, s.metric_rows or 0))) for s in lag_half]
    slope = _slope_per_hour([t for t, _ in counted], [r for _, r in counted])
    fig.rows_per_s = None if slope is None else slope / 3600
    if len(live) >= 2 and live[-1].t > live[0].t:
        fig.daemon_cores = (live[-1].cpu_s - live[0].cpu_s) / (live[-1].t - live[0].t)


def _checkpoint_figures(fig: Figures, log_path: str) -> None:
    events = _checkpoint_events(log_path)
    fig.checkpoints = len(events)
    ms = [float(e["seconds"]) * 1e3 for e in events if "seconds" in e]
    fig.checkpoint_write_p50_ms, fig.checkpoint_write_p95_ms = _pct(ms, 50), _pct(ms, 95)
    fig.checkpoint_write_max_ms = max(ms, default=None)


def _newest_meta(ckpt_dir: str) -> dict[str, Any] | None:
    """The meta of the newest checkpoint directory as listed (not verified: a look while the daemon runs)."""
    from streamfit.checkpoint import CheckpointStore

    listed = CheckpointStore(ckpt_dir).list()
    if not listed:
        return None
    with open(listed[-1].path / "manifest.json") as f:
        return dict(json.load(f).get("meta", {}))


def _quiet_figures(fig: Figures, cfg: SoakConfig, tmp: str, producer: Producer, bootstrap: str, topic: str,
                   group: str) -> None:
    """``cfg.quiet`` s after the stream's last row was trained, longer than the checkpoint and publish periods:
    does the newest checkpoint hold every row, the group's offset the end, the health file and the published
    model the present?  (Figures, not checks: a daemon that acts only when a batch is trained stays behind.)"""
    q: dict[str, Any] = {"seconds": cfg.quiet, "good_rows": producer.good_cum[-1] if producer.good_cum else 0,
                         "end_offset": max(producer.offsets) + 1 if producer.offsets else 0}
    try:
        meta = _newest_meta(os.path.join(tmp, "ckpt"))
        q["newest_checkpoint_rows"] = None if meta is None else int(meta.get("rows", 0))
    except (OSError, ValueError) as exc:
        q["newest_checkpoint_rows"] = f"unreadable: {exc}"
    try:
        q["committed_offset"] = _committed(bootstrap, topic, group)
    except Exception as exc:  # noqa: BLE001 - a figure
        q["committed_offset"] = f"{type(exc).__name__}: {exc}"
    try:
        with open(os.path.join(tmp, "health.json")) as f:
            health = json.load(f)
        q["health_age_s"] = time.time() - float(health.get("updated_at", 0))
        q["health_rows"] = health.get("rows")
        q["health_idle"] = {k: v for k, v in health.items() if "idle" in k} or None
    except (OSError, ValueError):
        q["health_age_s"] = None
    try:
        q["published_age_s"] = time.time() - os.stat(os.path.join(tmp, "published", "model.onnx")).st_mtime
    except OSError:
        q["published_age_s"] = None
    fig.quiet = q


def _good_rows_before(producer: Producer, offset: int, row: int) -> int:
    """Good rows of the messages before ``offset`` and of the first ``row`` rows of message ``offset``."""
    index = producer.offsets
    total = 0
    for o in range(offset):
        total += producer.plan[index[o]].good_rows
    if row and offset in index:
        msg = producer.plan[index[offset]]
        total += row - (1 if msg.kind == "null_label" and row > msg.rows // 2 else 0) if msg.kind in (
            "good", "null_label") else 0
    return total


def _check_exactly_once(fig: Figures, cfg: SoakConfig, tmp: str, producer: Producer, bootstrap: str, topic: str,
                        group: str) -> None:
    from streamfit import read_dead_letters

    kinds = Counter(producer.kinds)
    n = cfg.rows_per_message
    good = producer.good_cum[-1] if producer.good_cum else 0
    want_msgs: Counter[str] = Counter()
    want_rows: Counter[str] = Counter()
    want_dl: Counter[str] = Counter()
    want_dl_rows: Counter[str] = Counter()
    for kind in BAD_KINDS:
        k = kinds.get(kind, 0)
        msg_reason, row_reason = BAD_REASONS[kind]
        if msg_reason is not None:
            want_msgs[msg_reason] += k
        if row_reason is not None:
            want_rows[row_reason] += k * (n if kind != "null_label" else 1)
        reason = msg_reason or row_reason
        assert reason is not None
        want_dl[reason] += k
        want_dl_rows[reason] += k * (0 if kind == "undecodable" else 1 if kind == "null_label" else n)
    fig.produced = {"messages": len(producer.kinds), "good_rows": good, "kinds": dict(kinds),
                    "bad_rows_by_reason": dict(want_rows), "bad_messages_by_reason": dict(want_msgs)}
    try:
        meta = _final_manifest(os.path.join(tmp, "ckpt"))
    except Exception as exc:  # noqa: BLE001 - reported
        fig.problems.append(f"final checkpoint: {type(exc).__name__}: {exc}")
        fig.checks["final checkpoint readable"] = False
        return
    fig.rows_trained = int(meta.get("rows", -1))
    fig.checks["rows trained == good rows produced"] = fig.rows_trained == good
    got_rows = {k: int(v) for k, v in (meta.get("skipped_rows") or {}).items() if v}
    got_msgs = {k: int(v) for k, v in (meta.get("skipped_messages") or {}).items() if v}
    fig.checks["skipped rows == bad rows, by reason"] = got_rows == {k: v for k, v in want_rows.items() if v}
    fig.checks["skipped messages == bad messages, by reason"] = got_msgs == {k: v for k, v in want_msgs.items() if v}
    if not fig.checks["skipped rows == bad rows, by reason"]:
        fig.problems.append(f"skipped rows {got_rows}, expected {dict(want_rows)}")
    if not fig.checks["skipped messages == bad messages, by reason"]:
        fig.problems.append(f"skipped messages {got_msgs}, expected {dict(want_msgs)}")
    try:
        letters = read_dead_letters(os.path.join(tmp, "dead-letters.jsonl"))
    except OSError:
        letters = []
    dl = Counter(d.reason for d in letters)
    dl_rows: Counter[str] = Counter()
    for d in letters:
        dl_rows[d.reason] += d.rows
    fig.checks["dead letters == bad messages, rows by reason"] = (
        {k: v for k, v in dl.items() if v} == {k: v for k, v in want_dl.items() if v}
        and {k: v for k, v in dl_rows.items() if v} == {k: v for k, v in want_dl_rows.items() if v})
    if not fig.checks["dead letters == bad messages, rows by reason"]:
        fig.problems.append(f"dead letters {dict(dl)} with rows {dict(dl_rows)}, expected {dict(want_dl)} with rows "
                            f"{dict(want_dl_rows)}")
    part = (meta.get("position") or {}).get("partitions", {}).get("0", {})
    try:
        at = _good_rows_before(producer, int(part.get("offset", -1)), int(part.get("row", 0)))
    except (TypeError, ValueError):
        at = -1
    fig.checks["rows trained == good rows before the checkpoint's position"] = fig.rows_trained == at
    if fig.rows_trained != at:
        fig.problems.append(f"the final checkpoint holds {fig.rows_trained:,} rows, its position {part} is after "
                            f"{at:,} good rows: rows lost or repeated")
    try:
        end = max(producer.offsets) + 1 if producer.offsets else 0
        fig.checks["checkpoint position == end of topic"] = int(part.get("offset", -1)) == end \
            and int(part.get("row", -1)) == 0
        committed = _committed(bootstrap, topic, group)
        fig.checks["committed offset == end of topic"] = committed == end
        if committed != end or int(part.get("offset", -1)) != end:
            fig.problems.append(f"end of topic {end}, checkpoint position {part}, committed offset {committed}")
    except Exception as exc:  # noqa: BLE001 - reported
        fig.problems.append(f"committed offset: {type(exc).__name__}: {exc}")
        fig.checks["committed offset == end of topic"] = False
    if not fig.checks["rows trained == good rows produced"]:
        fig.problems.append(f"the final checkpoint holds {fig.rows_trained:,} rows, {good:,} good rows produced")


# -- report ------------------------------------------------------------------------------------------------------
def _f(x: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def report(fig: Figures, cfg: SoakConfig) -> list[str]:
    model = (f"hashed LogisticRegression (FTRL, {cfg.buckets:,} buckets, 20 string columns)" if cfg.hashed
             else "LinearRegressor (20 float32 features)")
    p = fig.produced
    bad = sum(v for k, v in p.get("kinds", {}).items() if k != "good")
    lines = [f"== soak: {model}, batch {cfg.batch_size}, {cfg.rate:,.0f} rows/s for {cfg.duration:.0f} s "
             f"({cfg.rows_per_message} rows per message, {bad} of {p.get('messages', 0):,} messages bad"
             f"{f', a partial batch of {cfg.partial_tail} rows at the end' if cfg.partial_tail else ''})",
             f"cpu: {fig.cpu} (AVX-512: {'yes' if fig.avx512 else 'no'}), {fig.cpus} cpus; load average at start "
             f"{fig.load_start}, at the end {fig.load_end}",
             f"daemon: checkpoint every {cfg.checkpoint_every:g} s, --keep {cfg.keep}, --publish every "
             f"{cfg.publish_every:g} s, dead letters, health file, metrics, --log-json",
             ""]
    rows = [
        ("RSS slope, second half", f"{_f(fig.rss_slope_mb_per_h, '+.1f', ' MB/h')}   "
                                   f"(first {_f(fig.rss_first_mb, '.0f')}, last {_f(fig.rss_last_mb, '.0f')}, "
                                   f"max {_f(fig.rss_max_mb, '.0f')} MB)"),
        ("fds first/last/max", " / ".join(map(str, fig.fds)) if fig.fds else "n/a"),
        ("threads first/last/max", " / ".join(map(str, fig.threads)) if fig.threads else "n/a"),
        ("lag p50 / p95, second half", f"{_f(fig.lag_p50_s, '.2f', ' s')} / {_f(fig.lag_p95_s, '.2f', ' s')}   "
                                       f"(max {_f(fig.lag_max_s, '.2f', ' s')}; rows p50 {_f(fig.lag_rows_p50, ',.0f')}"
                                       f", p95 {_f(fig.lag_rows_p95, ',.0f')})"),
        ("checkpoint writes p50 / p95", f"{_f(fig.checkpoint_write_p50_ms, '.1f', ' ms')} / "
                                        f"{_f(fig.checkpoint_write_p95_ms, '.1f', ' ms')}   "
                                        f"({fig.checkpoints} written, "
                                        f"max {_f(fig.checkpoint_write_max_ms, '.1f', ' ms')}; checkpoint age p95 "
                                        f"{_f(fig.checkpoint_age_p95_s, '.2f', ' s')})"),
        ("publications seen", str(fig.publications_seen)),
        ("daemon start-up", f"{_f(fig.daemon_ready_s, '.1f', ' s')} to join the group (the stream starts then)"),
        ("SIGTERM", f"exit {fig.sigterm_exit_code} in {_f(fig.sigterm_exit_s, '.2f', ' s')}"),
        ("rows/s", f"{_f(fig.rows_per_s, ',.0f')} trained   (daemon {_f(fig.daemon_cores, '.2f')} cores; producer "
                   f"at most {fig.producer_behind_s:.2f} s behind its schedule)"),
    ]
    q = fig.quiet
    if q:
        def age(x: Any) -> str:
            return f"{x:.1f} s" if isinstance(x, float) else str(x)
        rows.append((f"quiet {q['seconds']:g} s after", f"newest checkpoint holds {q.get('newest_checkpoint_rows')} of "
                     f"{q['good_rows']:,} rows; committed offset {q.get('committed_offset')} of {q['end_offset']}; "
                     f"health file {age(q.get('health_age_s'))} old"
                     f"{'' if not q.get('health_idle') else ' ' + json.dumps(q['health_idle'])}; published model "
                     f"{age(q.get('published_age_s'))} old"))
    width = max(len(k) for k, _ in rows) + 2
    lines += [f"{k:<{width}s}{v}" for k, v in rows]
    lines.append("")
    lines.append(f"exactly once: {'OK' if fig.exactly_once else 'FAILED'} -- {p.get('good_rows', 0):,} good rows "
                 f"produced, {_f(fig.rows_trained, ',')} in the final checkpoint; "
                 f"bad rows {p.get('bad_rows_by_reason')}, "
                 f"bad messages {p.get('bad_messages_by_reason')}")
    for name, ok in fig.checks.items():
        lines.append(f"  {'ok  ' if ok else 'FAIL'} {name}")
    for problem in fig.problems:
        lines.append(f"  problem: {problem}")
    for note in fig.notes:
        lines.append(f"note: {note}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 6 s of stream, 3 s quiet, 1 message in 10 bad")
    p.add_argument("--hashed", action="store_true", help="hashed LogisticRegression (FTRL, 2^20 buckets) on 20 "
                                                         "string columns (default duration 90 s)")
    p.add_argument("--duration", type=float, help="seconds of stream (default 420, --hashed 90, --quick 6)")
    p.add_argument("--rate", type=float, default=3000.0, help="rows/s produced (default 3000)")
    p.add_argument("--rows-per-message", type=int, default=100)
    p.add_argument("--bad-fraction", type=float, help="fraction of bad messages (default 0.01, --quick 0.1)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--partial-tail", type=int, default=300, metavar="ROWS",
                   help="after the stream's last full batch, ROWS more good rows (fewer than a batch, default 300), "
                        "which the daemon must train while the stream is quiet (serve's --max-batch-wait) for "
                        "exactly-once to hold")
    p.add_argument("--buckets", type=int, default=2 ** 20, help="--hashed: rows of the hashed table")
    p.add_argument("--drain", type=float, help="once the stream is produced, seconds without progress after which "
                                               "the bench stops waiting for the daemon (default 60, --quick 10)")
    p.add_argument("--quiet", type=float, help="seconds the stream stays quiet before SIGTERM, longer than the "
                                               "checkpoint and publish periods (the state then is reported; default "
                                               "5, --quick 3)")
    p.add_argument("--json", metavar="PATH", help="write every figure and the per-second samples here")
    p.add_argument("--keep-dir", action="store_true", help="keep the run's directory (checkpoints, log)")
    args = p.parse_args(argv)
    if not 0 <= args.partial_tail < args.batch_size:
        p.error(f"--partial-tail must be in [0, --batch-size), got {args.partial_tail}")
    duration = args.duration if args.duration is not None else 6.0 if args.quick else 90.0 if args.hashed else 420.0
    bad_fraction = args.bad_fraction if args.bad_fraction is not None else 0.1 if args.quick else 0.01
    drain = args.drain if args.drain is not None else 10.0 if args.quick else 60.0
    cfg = SoakConfig(hashed=args.hashed, duration=duration, rate=args.rate, rows_per_message=args.rows_per_message,
                     bad_fraction=bad_fraction, batch_size=args.batch_size,
                     partial_tail=args.partial_tail, buckets=args.buckets, drain=drain,
                     quiet=args.quiet if args.quiet is not None else 3.0 if args.quick else 5.0,
                     pool=8 if args.quick else 64)

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    env = run_env()
    for s in C.header("streamfit soak: the daemon on a live Kafka topic", sys.argv[1:] if argv is None else argv):
        print(s, flush=True)
    if args.quick:
        print("--quick: a smoke run (seconds of stream): the figures below say nothing about a soak", flush=True)
    try:
        fig = run_soak(cfg, log, keep_dir=args.keep_dir)
    except C.Unavailable as exc:
        print(f"soak not run: {exc}")
        return 0
    for line in report(fig, cfg):
        print(line, flush=True)
    if args.json:
        doc = {"env": {**env, "loadavg_end": list(os.getloadavg())}, **asdict(fig),
               "config": {**fig.config, "quick": args.quick}, "exactly_once": fig.exactly_once}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"wrote {args.json} (bench/plots.py draws it)", flush=True)
    ok = fig.exactly_once and fig.sigterm_exit_code == 0 and not any("exited" in p for p in fig.problems)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
