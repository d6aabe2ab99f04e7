"""The coordinator: N learner actors on a Ray cluster, synchronized by parameter mixing, with global checkpoints.

Why this scheme.  A streamfit step takes microseconds to a millisecond; a synchronous round trip between
Ray actors takes milliseconds.  Averaging gradients every step (synchronous data-parallel SGD) would make
the round trip the bottleneck by orders of magnitude, so learners train locally and mix their weights
every K batches or T seconds (local SGD / iterative parameter mixing, as Vowpal Wabbit's AllReduce mode):
one round trip per K steps.  The mixing goes through Ray's object store and this coordinator (a star: each
learner's arrays up, the mixed arrays put once and fetched once per node), not ``ray.util.collective``
(its CPU backend needs torch) nor sockets of our own: it needs no process group to re-form when a learner
dies, and at the model sizes streamfit trains (kB to a few MB) the star costs milliseconds per round
(``bench/scaleout.py`` measures it, and projects where a tree or ring would pay off).

Exactly once.  A global checkpoint is written at a barrier: the mixed state plus every learner's source
position and local state, in streamfit's checkpoint format (atomic, checksummed).  Kafka offsets are
committed, by each learner for its own partitions, only once a checkpoint covering them is durable.  If a
learner dies, the coordinator restarts the whole group from the last durable global checkpoint (Ray
restarts the dead actor; the survivors drop what they trained since): rounds are deterministic, so the
final model equals an uninterrupted run's.  If the coordinator dies, a new job with ``resume=True``
continues from the checkpoint directory.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from streamfit.checkpoint import AsyncCheckpointWriter, CheckpointStore
from streamfit.daemon.guard import DivergenceGuard
from streamfit.daemon.health import HealthFile, Metrics, log_event
from streamfit.daemon.state import restore_estimator
from streamfit.distributed._averaging import mix
from streamfit.distributed._budget import redeal_quotas, start_quotas
from streamfit.distributed._learner import Learner
from streamfit.distributed._messages import ARRAY_REF as _REF
from streamfit.distributed._messages import LearnerState, RoundReport, StartFrom
from streamfit.distributed._messages import array_refs as _refs
from streamfit.distributed._shares import Share, plan_shares
from streamfit.distributed._watch import DEFAULT_LEARNER_TIMEOUT, Fault, LearnerHungError, Watch
from streamfit.exceptions import ResumeError, StreamfitError
from streamfit.history import HistoryOptions, HistorySink, Progress, RunHistory

__all__ = ["DistributedTrainer", "DistributedSummary", "RoundStats"]


#: the synchronization period when none is given: rounds of this many batches (deterministic, so a restart from
#: a global checkpoint trains the same rounds).  bench/scaleout.py --sweep (2 learners, batch 256, linear d=100):
#: synchronizing is 68 % of a round's time at 1 batch, 28 % at 16, 20 % at 64, 7 % at 256; 64 batches keep a
#: divergence's replay short (it goes back to the last round) and mix often
DEFAULT_SYNC_EVERY_BATCHES = 64
#: with rounds of batches, a learner without input this long (s) ends its round at its last trained batch (its
#: weight in the mix is the rows it trained in the round), so a quiet partition does not hold the others up
IDLE_ROUND_SECONDS = 1.0
#: test hook: ``"R:POINT:MARKER"`` arms checkpoint/'s pause (``STREAMFIT_CHECKPOINT_TEST_PAUSE=POINT:MARKER``) for
#: the global checkpoints of round R on, so a test can SIGKILL the coordinator between the files of one of them
PAUSE_ROUND_ENV = "STREAMFIT_DISTRIBUTED_TEST_PAUSE"


class LearnerLostError(StreamfitError):
    """A learner died more often than ``max_restarts`` allows."""


@dataclass(frozen=True)
class RoundStats:
    """One synchronization round as the coordinator saw it (passed to ``on_round``)."""

    round: int
    rows: int                   # total trained rows after the round
    round_rows: int
    sync_seconds: float         # from the first report to the last learner released (mixing, transfers)
    wait_seconds: float         # from the round's requests to the last report (training + skew)
    synced_bytes: int           # bytes of arrays sent up by the learners + mixed arrays sent down
    ended: bool
    checkpoint: bool


@dataclass
class DistributedSummary:
    """What a distributed run did (``rows``/``batches`` summed over learners, resumed rows included)."""

    rows: int
    batches: int
    rounds: int
    positions: list[Any]
    checkpoints: int
    last_checkpoint: str | None
    restarts: int
    resumed_from: str | None
    ended_by: str
    rows_per_s: float = 0.0
    learner_rows: list[int] = field(default_factory=list)
    skipped_rows: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    sync_seconds: float = 0.0   # summed over rounds
    synced_bytes: int = 0
    skipped_messages: dict[str, int] = field(default_factory=dict)
    rollbacks: int = 0          # divergence rollbacks, summed over learners
    learner_rollbacks: list[int] = field(default_factory=list)
    #: the poison rows the learners quarantined (``{"learner", "message", "row", "from_end"}``)
    quarantined_rows: list[dict[str, Any]] = field(default_factory=list)
    #: the learners lost (died, hung) and replaced, in order; each cost one group restart
    faults: list[Fault] = field(default_factory=list)


@dataclass
class _RunState:
    """What one :meth:`DistributedTrainer.run` carries from round to round."""

    t0: float
    round: int = 0
    mixed: Mapping[str, np.ndarray] | None = None
    reports: list[RoundReport] = field(default_factory=list)
    rows_at_start: int = 0
    ended_by: str = "end"
    sync_seconds: float = 0.0
    synced_bytes: int = 0


class DistributedTrainer:
    """Train one ``estimator`` with ``workers`` learner actors on a Ray cluster, each on its share of ``source``.

    ``source`` is a Kafka URI (partitions dealt to learners) or a Parquet directory/file list (files dealt
    round-robin).  Learners synchronize every ``sync_every_batches`` batches or ``sync_every_seconds``
    seconds (at most one of them; neither: every :data:`DEFAULT_SYNC_EVERY_BATCHES` batches, and a learner
    without input for ``idle_round_seconds`` on a live stream, ``finite=False``, ends its round where it is);
    ``sync_optimizer`` mixes optimizer state too.  ``finite=True`` (train)
    stops at the end of every share (Kafka: the partitions' ends when the run reaches them), ``False``
    (serve) runs until ``stop_event`` is set.  Checkpoints every ``checkpoint_every_rounds`` rounds or
    ``checkpoint_every_seconds`` seconds, and always at the end.  ``ray_address``: an existing cluster;
    ``None`` uses the Ray instance this process is connected to, or starts a local one on 127.0.0.1.
    ``loop_options`` go to each learner's stream loop (features, label, batch_size, on_bad, ...).

    ``guard`` (on by default: ``True``, or a :class:`~streamfit.daemon.guard.DivergenceGuard`; ``False``: none)
    gives every learner the single learner's divergence guard: a learner whose batch diverges rolls back to
    its state at the last round and trains on, the others are not held up; its poison rows are quarantined
    (:mod:`streamfit.daemon.poison`).  ``dead_letter``: a JSON-lines path (each learner writes its own file,
    ``NAME.learner-I.jsonl``, exactly once as for one learner) or a ``kafka://`` topic (shared, at least once).

    ``history`` (:class:`~streamfit.history.HistoryOptions`), ``history_dir``, ``trackers``: the run's metrics
    history (beside the checkpoints by default) as for one learner, of the totals, cut at round barriers.
    ``health_interval``: seconds between health-file writes.  ``max_rows``: stop once this many rows are trained in all (over learners and resumes), each learner's last
    batch cut short; a learner whose share ends first leaves its quota to the others
    (:mod:`streamfit.distributed._budget`).

    A learner lost (its process killed, its node lost: Ray restarts it on a node with room) or hung (it left
    the coordinator's ping unanswered for ``learner_timeout`` seconds, :mod:`streamfit.distributed._watch`;
    None: never declared hung) restarts the group from the last global checkpoint, at most ``max_restarts``
    times in a run.
    """

    def __init__(self, estimator: Any, source: str, *, workers: int = 2, sync_every_batches: int | None = None,
                 sync_every_seconds: float | None = None, sync_optimizer: bool = True, finite: bool = True,
                 checkpoint_dir: "str | Path | None" = None, checkpoint_every_rounds: int | None = None,
                 checkpoint_every_seconds: float | None = None, keep: int = 3, resume: bool = False,
                 ray_address: str | None = None, learner_cpus: float = 1.0, max_restarts: int = 3,
                 health_path: "str | Path | None" = None, metrics: Metrics | None = None,
                 source_options: Mapping[str, Any] | None = None,
                 on_round: Callable[["DistributedTrainer", RoundStats], None] | None = None,
                 guard: "DivergenceGuard | bool" = True, dead_letter: str | None = None,
                 idle_round_seconds: float | None = IDLE_ROUND_SECONDS,
                 learner_timeout: float | None = DEFAULT_LEARNER_TIMEOUT, max_rows: int | None = None,
                 history: HistoryOptions | None = None, history_dir: "str | Path | None" = None,
                 trackers: Sequence[HistorySink] = (), health_interval: float = 1.0, **loop_options: Any) -> None:
        sync_every_batches = _check_args(source, workers, sync_every_batches, sync_every_seconds, resume,
                                         checkpoint_dir, learner_timeout, idle_round_seconds, max_rows)
        self.max_rows = max_rows
        self._quotas: list[int] | None = None   # each learner's row quota (max_rows dealt, _budget)
        self._saved_quotas: list[int] | None = None
        for unsupported in ("progress", "on_batch", "on_metrics", "stop_event"):
            if loop_options.pop(unsupported, None) not in (None, False):
                raise ValueError(f"{unsupported} is not supported by distributed training")
        self.estimator = estimator
        self.source = source
        self.workers = workers
        self.sync_every_batches, self.sync_every_seconds = sync_every_batches, sync_every_seconds
        self.sync_optimizer = bool(sync_optimizer)
        self.finite = bool(finite)
        self._init_outputs(checkpoint_dir, keep, health_path, health_interval, metrics, history, history_dir,
                           trackers)
        if self.store is not None and checkpoint_every_rounds is None and checkpoint_every_seconds is None:
            checkpoint_every_rounds = 1
        self.checkpoint_every_rounds, self.checkpoint_every_seconds = checkpoint_every_rounds, checkpoint_every_seconds
        self.resume = resume
        self.ray_address = ray_address
        self.learner_cpus = learner_cpus
        self.max_restarts = max_restarts
        self._progress = Progress(0, 0)
        self.source_options = dict(source_options or {})
        self.on_round = on_round
        self.loop_options = loop_options
        self.guard = guard if isinstance(guard, DivergenceGuard) else DivergenceGuard() if guard else None
        self.learner_timeout = learner_timeout
        self.faults: list[Fault] = []
        # a finite run's learner without input has ended its share (it reports so): only a live stream (serve, a
        # followed directory: _spawn) waits
        self._idle_live = idle_round_seconds if sync_every_batches is not None else None
        self.idle_round_seconds = self._idle_live if not finite else None
        self.dead_letter = dead_letter
        self.learners: list[Any] = []
        self.shares: list[Share] = []
        self.restarts = 0
        self.checkpoints = 0
        self.last_checkpoint: str | None = None
        self._cluster: Any = None
        self._writer: AsyncCheckpointWriter | None = None
        self._pending: dict[int, list[Any]] = {}  # checkpoint round -> positions, written but not yet committed
        self._committed_round = -1
        self._last_ckpt_time = time.monotonic()
        self._learner_gauge: Any = None

    def _init_outputs(self, checkpoint_dir: "str | Path | None", keep: int, health_path: "str | Path | None",
                      health_interval: float, metrics: Metrics | None, history: HistoryOptions | None,
                      history_dir: "str | Path | None", trackers: Sequence[HistorySink]) -> None:
        """Where the run writes: the checkpoint store, the health file, the metrics history (and its trackers)."""
        self.store = CheckpointStore(checkpoint_dir, keep=keep) if checkpoint_dir is not None else None
        self.health = HealthFile(health_path, health_interval) if health_path is not None else None
        self.metrics = metrics
        #: the metrics history beside the global checkpoints, or in ``history_dir``: the run's totals, its steps
        #: are rounds (an interval ends at the first barrier past ``every_rows``/``every_seconds``)
        self.history = RunHistory(checkpoint_dir, history, directory=history_dir, sinks=trackers) \
            if checkpoint_dir is not None or history_dir is not None else None
        self.trackers = list(trackers)
        if self.trackers and self.history is None:
            raise ValueError("trackers log the run's metrics history: give a checkpoint_dir or a history_dir")

    # -- Ray -----------------------------------------------------------------------------------------------
    def connect(self) -> Any:
        """Connect to Ray (``ray_address``, the instance this process is in, or a new local one); returns ``ray``.

        ``ray.init`` installs signal handlers in the driver: install your own after this.
        """
        return self._connect()

    def _connect(self) -> Any:
        import ray

        if ray.is_initialized():
            return ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.ray_address is not None:
            host = self.ray_address.rpartition(":")[0].removeprefix("ray://")
            if host in ("127.0.0.1", "localhost"):  # a cluster on this machine's loopback: stay on it
                from streamfit.distributed._cluster import connect_loopback

                connect_loopback(self.ray_address)
            else:
                ray.init(address=self.ray_address, logging_level="ERROR")
        else:
            import tempfile

            from streamfit.distributed._cluster import LocalRayCluster

            root = tempfile.mkdtemp(prefix="streamfit-ray-")
            self._cluster = LocalRayCluster(root, nodes=1, cpus=max(os.cpu_count() or 1, int(self.workers *
                                                                                         self.learner_cpus)))
            self._cluster.connect()
            log_event("ray", f"started a local Ray instance at {self._cluster.address}", address=self._cluster.address)
        return ray

    def learner_pids(self) -> list[int]:
        """Worker process ids of the learners (as they are now)."""
        import ray

        return list(ray.get([a.pid.remote() for a in self.learners]))

    def _spawn(self, ray: Any) -> None:
        actor = ray.remote(Learner)
        # held by the coordinator for the whole run: Ray re-reads an actor's constructor arguments to restart it
        self._template_ref = model = ray.put(_shippable(self.estimator))
        self.learners = [
            actor.options(num_cpus=self.learner_cpus, max_restarts=self.max_restarts, max_task_retries=0,
                          scheduling_strategy="SPREAD", name=None).remote(
                share, model, self.loop_options, self.sync_every_batches, self.sync_every_seconds,
                self.sync_optimizer, self.finite, self.guard,
                None if self.dead_letter is None else learner_dead_letter(self.dead_letter, share.index),
                self.store is not None,
                self._idle_live if not self.finite or share.follow else None)
            for share in self.shares]

    # -- checkpoints -----------------------------------------------------------------------------------------
    def _initial(self) -> tuple[list[StartFrom], int, Mapping[str, np.ndarray] | None]:
        """Start points: from the newest valid global checkpoint (resume) or from scratch."""
        if self.store is not None and not self.resume and self.store.list():
            raise ResumeError(f"{self.store.root} already holds checkpoints: resume from them (--resume) or "
                                  "use an empty checkpoint directory")
        self.shares = plan_shares(self.source, self.workers, self.source_options)
        if self.resume:
            loaded = self._load()
            if loaded is not None:
                return loaded
            log_event("resume", "no checkpoint to resume from: starting fresh",
                      root=str(self.store.root) if self.store is not None else None)
        return [StartFrom() for _ in self.shares], 0, None

    def _load(self) -> tuple[list[StartFrom], int, Mapping[str, np.ndarray] | None] | None:
        assert self.store is not None
        ckpt = self.store.load_latest()
        if ckpt is None:
            return None
        dist = ckpt.meta.get("distributed")
        if not isinstance(dist, Mapping):
            raise ResumeError(f"{ckpt.path} is not a distributed (global) checkpoint")
        saved = [entry["share"] for entry in dist["learners"]]
        self._saved_quotas = None
        if saved != [s.describe() for s in self.shares]:  # another number of learners, or the source changed
            redealt = self._redeal(ckpt, dist)
            self.shares, starts = redealt.shares, redealt.starts
        else:
            starts = self._starts(ckpt, dist)
            if dist.get("max_rows") == self.max_rows and dist.get("quotas") is not None:
                self._saved_quotas = [int(q) for q in dist["quotas"]]  # the same deal as before the stop
        mixed = {k: v for k, v in ckpt.arrays.items() if not k.startswith("learners/")}
        self._resumed_from: str | None = str(ckpt.path)
        self.last_checkpoint = str(ckpt.path)
        self._committed_round = int(dist["round"])
        log_event("resume", f"resumed from {ckpt.path.name}: round {dist['round']}, {ckpt.meta['rows']} rows",
                  checkpoint=str(ckpt.path), rows=ckpt.meta["rows"], positions=ckpt.meta.get("position"))
        return starts, int(dist["round"]), mixed or None

    def _redeal(self, ckpt: Any, dist: Mapping[str, Any]) -> Any:
        """The checkpoint's learners re-dealt to this run's (elastic resume); the dead-letter files of learners
        that are no more cut back to what the checkpoint covers."""
        from streamfit.distributed._elastic import redeal

        entries = list(dist["learners"])
        if any(e["share"].get("follow") for e in entries) or any(s.follow for s in self.shares):
            raise ResumeError(f"{ckpt.path} was written by {len(entries)} learner(s) on a followed Parquet directory "
                              f"(or this run follows one): resume it with --workers {len(entries)} (its files are "
                              "dealt by a hash of their names among that many learners)")
        try:
            redealt = redeal(entries, ckpt.arrays, self.shares)
        except KeyError as exc:
            raise ResumeError(f"{ckpt.path}: a learner entry lacks {exc} (written by an older streamfit?)") from exc
        if self.dead_letter is not None:
            from streamfit._stream.deadletter import open_dead_letter

            for j, entry in enumerate(entries[len(self.shares):], start=len(self.shares)):
                if entry.get("dead_letter") and "://" not in self.dead_letter:
                    sink = open_dead_letter(learner_dead_letter(self.dead_letter, j))
                    sink.restore(entry["dead_letter"])
                    sink.close()
        log_event("resume", f"{ckpt.path.name} was written by {len(entries)} learner(s): its source re-dealt to "
                  f"{len(self.shares)} with every partition's and file's position",
                  checkpoint=str(ckpt.path), was=len(entries), now=len(self.shares),
                  shares=[s.describe() for s in redealt.shares])
        return redealt

    def _starts(self, ckpt: Any, dist: Mapping[str, Any]) -> list[StartFrom]:
        """Each learner's start point, as the checkpoint holds it (the same shares)."""
        starts = []
        for entry in dist["learners"]:
            state = None
            if entry.get("state") is not None:
                refs = _refs(entry["state"]["tree"])
                state = LearnerState(entry["state"]["class"], entry["state"]["tree"],
                                     {r: ckpt.arrays[r] for r in refs})
            starts.append(StartFrom(state, entry.get("position"), int(entry["rows"]), int(entry["batches"]),
                                    int(entry["evaluated_rows"]), float(entry["loss_sum"]),
                                    dict(entry.get("skipped_rows", {})), dict(entry.get("skipped_messages", {})),
                                    int(entry.get("rollbacks", 0)), entry.get("poison"), entry.get("dead_letter")))
        return starts

    def _checkpoint_due(self, round_: int) -> bool:
        if self.store is None:
            return False
        if self.checkpoint_every_rounds is not None and round_ % self.checkpoint_every_rounds == 0:
            return True
        return (self.checkpoint_every_seconds is not None
                and time.monotonic() - self._last_ckpt_time >= self.checkpoint_every_seconds)

    def _contents(self, round_: int, reports: list[RoundReport], mixed: Mapping[str, np.ndarray] | None
                  ) -> tuple[bytes, dict[str, np.ndarray], dict[str, Any]]:
        """Model bytes, arrays and meta of the global checkpoint at this barrier."""
        arrays: dict[str, np.ndarray] = dict(mixed or {})
        learners, model, top = [], b"", None
        for rep in reports:
            entry: dict[str, Any] = {"share": self.shares[rep.learner].describe(), "rows": rep.rows,
                                     "batches": rep.batches, "position": rep.position, "ended": rep.ended,
                                     "evaluated_rows": rep.evaluated_rows, "loss_sum": rep.loss_sum,
                                     "skipped_rows": dict(rep.skipped_rows),
                                     "skipped_messages": dict(rep.skipped_messages), "rollbacks": rep.rollbacks,
                                     "poison": rep.poison, "dead_letter": rep.dead_letter, "state": None}
            if rep.state is not None:
                own = {k: v for k, v in rep.state.arrays.items() if k not in arrays}
                rename = {k: f"learners/{rep.learner}/{k}" for k in own}
                arrays.update({rename[k]: v for k, v in own.items()})
                tree = _rename_refs(rep.state.tree, rename)
                entry["state"] = {"class": rep.state.cls, "tree": tree}
                if top is None:
                    top = {"class": rep.state.cls, "state": tree}
            learners.append(entry)
        if top is not None:
            restore_estimator(self.estimator, top, arrays)  # the mixed model, also what train exports
            model = self.estimator.to_onnx().SerializeToString()
        rows = sum(r.rows for r in reports)
        evaluated = sum(r.evaluated_rows for r in reports)
        skipped = _sum_counts(r.skipped_rows for r in reports)
        meta = {"rows": rows, "batches": sum(r.batches for r in reports),
                "position": {"learners": [r.position for r in reports]}, "estimator": top,
                "source": self.source, "skipped_rows": skipped,
                "skipped_messages": _sum_counts(r.skipped_messages for r in reports),
                "rollbacks": sum(r.rollbacks for r in reports),
                "poison": {"quarantined_rows": _quarantined_rows(reports),
                           "quarantined": sorted({q for r in reports for q in (r.poison or {}).get("quarantined", ())})},
                "metrics": {"stream": {"rows": evaluated,
                                       "loss": sum(r.loss_sum for r in reports) / evaluated if evaluated else None}},
                "distributed": {"round": round_, "workers": self.workers, "learners": learners,
                                "max_rows": self.max_rows, "quotas": self._quotas,
                                "sync": {"every_batches": self.sync_every_batches,
                                         "every_seconds": self.sync_every_seconds,
                                         "optimizer": self.sync_optimizer}}}
        return model, arrays, meta

    def _durable_positions(self) -> list[Any] | None:
        """The learners' positions in the newest global checkpoint that became durable since the last call (to
        commit now); that checkpoint is logged and counted, its round and the earlier ones forgotten."""
        assert self._writer is not None
        result = self._writer.last_result
        if result is None or result.step not in self._pending:
            return None
        positions = self._pending[result.step]
        done = [s for s in self._pending if s <= result.step]
        for step in done:
            del self._pending[step]
        self.checkpoints += len(done)  # one write at a time: every earlier one finished before this one
        self.last_checkpoint = str(result.path)
        self._committed_round = result.step
        log_event("checkpoint", f"global checkpoint {result.path.name} written in {result.seconds * 1e3:.1f} ms",
                  path=str(result.path), round=result.step, seconds=result.seconds)
        if self.metrics is not None:
            self.metrics.ckpt_seconds.set(result.seconds)
        if self.history is not None:
            self.history.checkpoint(result.step, None, result.seconds, result.path)
        return positions

    # -- the run ------------------------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event | None = None) -> DistributedSummary:
        """Train until every share ends (``finite``) or ``stop_event`` is set; final checkpoint; a summary."""
        ray = self._connect()
        self._resumed_from = None
        run = _RunState(time.perf_counter())
        try:
            self._begin(ray, run)
            while not self._round(ray, run, stop_event):
                pass
            self._finish(ray)
        finally:
            self._teardown(ray)
        return self._summary(run)

    def _begin(self, ray: Any, run: _RunState) -> None:
        """Start points (a resume's or fresh), the history, the writer, the learner actors started."""
        starts, run.round, run.mixed = self._initial()
        run.rows_at_start = sum(s.rows for s in starts)
        self._initial_starts = list(starts)
        self._initial_round, self._initial_mixed = run.round, run.mixed
        self._progress = _progress(run.round, starts)
        if self.history is not None:
            self.history.start(lambda: self._progress, resumed_from=self._resumed_from, source=self.source,
                               config=self._history_config())
        if self.store is not None:
            self._writer = AsyncCheckpointWriter(self.store)
        self._spawn(ray)
        self._quotas = self._start_quotas(starts)
        # not watched: an actor being created (a process started, streamfit imported) answers no ping yet
        ray.get([a.start.remote(s, None if self._quotas is None else self._quotas[i])
                 for i, (a, s) in enumerate(zip(self.learners, starts))])
        log_event("start", f"{self.workers} learners on {self.source}",
                  shares=[s.describe() for s in self.shares], round=run.round)

    def _round(self, ray: Any, run: _RunState, stop_event: threading.Event | None) -> bool:
        """One synchronization round: the reports, the mix, the learners released, a global checkpoint when due;
        True once it was the last.  A learner lost restarts the group (the round is not counted)."""
        from ray.exceptions import RayActorError

        round_ = run.round + 1
        ckpt = self._checkpoint_due(round_) or (stop_event is not None and stop_event.is_set())
        t_req = time.perf_counter()
        try:
            reports = self._gather(ray, [a.next_round.remote(round_, ckpt) for a in self.learners], stop_event)
            ended = all(r.ended for r in reports)
            budget_done = self.max_rows is not None and sum(r.rows for r in reports) >= self.max_rows
            final = ended or budget_done or (stop_event is not None and stop_event.is_set())
            if final and not ckpt:  # the last state is always kept (and checkpointed when there is a store)
                ckpt = self.store is not None
                reports = self._wait(ray, [a.next_round.remote(round_, True) for a in self.learners])
            t_rep = time.perf_counter()
            new = self._release(ray, round_, reports, run.mixed)
        except (RayActorError, LearnerHungError) as exc:
            self._lost(ray, exc, round_)
            run.round, run.mixed = self._recover(ray, exc)
            return False
        t_done = time.perf_counter()
        run.round, run.reports = round_, reports
        if new is not None:  # None: nobody trained this round, every learner holds the last mix
            run.mixed = new
        up = sum(r.synced_bytes for r in reports)
        down = 0 if new is None else sum(int(a.nbytes) for a in new.values()) * len(self.learners)
        run.sync_seconds += t_done - t_rep
        run.synced_bytes += up + down
        if not final and not any(r.round_rows for r in reports):
            ckpt = False  # an idle round (sync_every_seconds, no input): nothing new to save
        self._progress = _progress(round_, reports)
        if ckpt and self._writer is not None:
            self._submit_checkpoint(round_, reports, run.mixed)
        elif final:
            self._contents(round_, reports, run.mixed)  # leaves the mixed model in self.estimator
        stats = RoundStats(round_, sum(r.rows for r in reports), sum(r.round_rows for r in reports),
                           t_done - t_rep, t_rep - t_req, up + down, ended, ckpt)
        self._observe(stats, reports, time.perf_counter() - run.t0, run.rows_at_start)
        if self.history is not None:
            self.history.batch(stats.rows)
        if self.on_round is not None:
            self.on_round(self, stats)
        if final:
            run.ended_by = "end" if ended else "max_rows" if budget_done else "stop"
        return final

    def _release(self, ray: Any, round_: int, reports: list[RoundReport], mixed: Mapping[str, np.ndarray] | None
                 ) -> Mapping[str, np.ndarray] | None:
        """Mix the reports, send the mix (and the positions a durable checkpoint lets them commit) to every
        learner, which then trains its next round; the new mix (None: nobody trained)."""
        new = mix([r.synced for r in reports], [r.round_rows for r in reports], mixed)
        ref = ray.put(new) if new is not None else None
        commits = self._durable_positions() if self._writer is not None else None
        quotas = self._quotas
        if quotas is not None:
            quotas = self._quotas = redeal_quotas(quotas, [r.rows for r in reports], [r.ended for r in reports])
        refused = self._wait(ray, [a.apply.remote(round_, ref, None if commits is None else commits[i],
                                                  None if quotas is None else quotas[i])
                                   for i, a in enumerate(self.learners)])
        if commits is not None:
            self._log_refused(commits, refused)
        return new

    def _start_quotas(self, starts: list[StartFrom]) -> list[int] | None:
        """The learners' row quotas from their start points (those a checkpoint saved with the same budget)."""
        if self.max_rows is None:
            return None
        saved, self._saved_quotas = self._saved_quotas, None
        if saved is not None and len(saved) == len(starts):
            return saved
        return start_quotas(self.max_rows, [s.rows for s in starts])

    def _submit_checkpoint(self, round_: int, reports: list[RoundReport],
                           mixed: Mapping[str, np.ndarray] | None) -> None:
        """The global checkpoint of this barrier, handed to the writer (its history interval on disk first)."""
        assert self._writer is not None
        if self.history is not None:
            self.history.boundary(sync=True)
        model, arrays, meta = self._contents(round_, reports, mixed)
        _arm_pause(round_)
        self._writer.submit(round_, model, arrays, meta, wait=True)
        self._pending[round_] = [r.position for r in reports]
        self._last_ckpt_time = time.monotonic()

    def _finish(self, ray: Any) -> None:
        """The last checkpoint durable, its offsets committed, the learners closed."""
        if self._writer is not None:
            self._writer.flush()
            commits = self._durable_positions()
            if commits is not None:
                answers = iter(self._wait(ray, [a.commit.remote(p) if p is not None else None
                                                for a, p in zip(self.learners, commits)]))
                self._log_refused(commits, [None if p is None else next(answers) for p in commits])
        self._wait(ray, [a.close.remote() for a in self.learners])

    def _log_refused(self, positions: Sequence[Any], refusals: Sequence[str | None]) -> None:
        """Log as a warning each learner's commit (of ``positions``, the checkpoint :meth:`_durable_positions` just
        gave; ``refusals`` per learner, None: committed) that its source refused.  The run goes on: that learner's
        next commit carries the offsets (a position names every partition it trained), and a resumed run starts
        at the checkpoint's positions, not the group's."""
        for learner, (position, refusal) in enumerate(zip(positions, refusals)):
            if refusal is not None:
                log_event("commit", f"learner {learner}: commit of global checkpoint {self._committed_round} "
                          f"refused ({refusal}): its next checkpoint's commit carries these offsets",
                          level=logging.WARNING, learner=learner, round=self._committed_round, position=position,
                          error=refusal)

    def _teardown(self, ray: Any) -> None:
        """Whatever happened: history and writer closed, the actors killed, a local Ray instance stopped."""
        if self.history is not None:
            self.history.close()
        if self._writer is not None:
            self._writer.close()
        for a in self.learners:
            ray.kill(a, no_restart=True)
        self.learners = []
        self._template_ref = None
        if self._cluster is not None:
            ray.shutdown()
            self._cluster.stop()
            self._cluster = None

    def _summary(self, run: _RunState) -> DistributedSummary:
        reports, round_, ended_by = run.reports, run.round, run.ended_by
        elapsed = time.perf_counter() - run.t0
        rows = sum(r.rows for r in reports)
        evaluated = sum(r.evaluated_rows for r in reports)
        summary = DistributedSummary(
            rows, sum(r.batches for r in reports), round_, [r.position for r in reports], self.checkpoints,
            self.last_checkpoint, self.restarts, self._resumed_from, ended_by,
            (rows - run.rows_at_start) / elapsed if elapsed > 0 else 0.0, [r.rows for r in reports],
            _sum_counts(r.skipped_rows for r in reports),
            {"stream": {"rows": evaluated, "loss": sum(r.loss_sum for r in reports) / evaluated if evaluated else None}},
            run.sync_seconds, run.synced_bytes, _sum_counts(r.skipped_messages for r in reports),
            sum(r.rollbacks for r in reports), [r.rollbacks for r in reports], _quarantined_rows(reports),
            list(self.faults))
        log_event("shutdown", f"stopped ({ended_by}): {rows} rows in {round_} rounds, {self.checkpoints} global "
                  f"checkpoint(s), {self.restarts} restart(s)", rows=rows, rounds=round_, ended_by=ended_by,
                  last_checkpoint=self.last_checkpoint)
        return summary

    def _gather(self, ray: Any, refs: list[Any], stop_event: threading.Event | None) -> list[RoundReport]:
        """The round's reports; a stop request ends the round early (idle learners report at once)."""
        asked = False

        def on_poll() -> None:
            nonlocal asked
            if not asked and stop_event is not None and stop_event.is_set():
                for a in self.learners:
                    a.request_barrier.remote()
                asked = True

        return self._wait(ray, refs, on_poll)

    def _wait(self, ray: Any, refs: list[Any], on_poll: Callable[[], None] | None = None) -> list[Any]:
        """The results of one call per learner (``None``: no call to that one), the learners watched meanwhile:
        :class:`~streamfit.distributed._watch.LearnerHungError` for one that stops answering."""
        calls = [(i, a, r) for i, (a, r) in enumerate(zip(self.learners, refs)) if r is not None]
        return Watch(ray, self.learner_timeout).wait(calls, on_poll)

    def _lost(self, ray: Any, exc: BaseException, round_: int) -> None:
        """Note the learner lost; a hung one is killed (Ray restarts it) before the group restarts."""
        if isinstance(exc, LearnerHungError):
            self.faults.append(Fault(exc.learner, "hung", round_, exc.seconds))
            log_event("hung", f"learner {exc.learner} did not answer for {exc.seconds:.1f} s "
                      f"(learner_timeout {self.learner_timeout:g} s): killing it for a restart",
                      level=logging.WARNING, learner=exc.learner, seconds=exc.seconds, round=round_)
            ray.kill(self.learners[exc.learner], no_restart=False)
        else:
            dead = getattr(exc, "actor_id", None)
            learner = next((i for i, a in enumerate(self.learners) if dead and a._actor_id.hex() == dead), -1)
            self.faults.append(Fault(learner, "died", round_))

    def _recover(self, ray: Any, exc: BaseException) -> tuple[int, Mapping[str, np.ndarray] | None]:
        """A learner died: restart every learner from the last durable global checkpoint (or the start)."""
        from ray.exceptions import RayActorError

        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise LearnerLostError(f"a learner died {self.restarts} times (max_restarts={self.max_restarts}): "
                                   f"{exc}") from exc
        if self._writer is not None:
            self._writer.flush()  # an in-flight write becomes durable (or raises) first
            self._durable_positions()  # its offsets are committed with the next checkpoint's, which covers them
        resumed_from = self._resumed_from
        loaded = self._load() if self.store is not None else None
        self._resumed_from = resumed_from
        if loaded is None:
            starts, round_, mixed = self._initial_starts, self._initial_round, self._initial_mixed
        else:
            starts, round_, mixed = loaded
        self._pending.clear()
        self._quotas = self._start_quotas(starts)
        self._progress = _progress(round_, starts)
        if self.history is not None:  # the rounds after the checkpoint are trained again
            self.history.rewind(round_)
        log_event("recovery", f"a learner died ({type(exc).__name__}); restarting all {self.workers} from "
                  f"{'the last global checkpoint' if loaded else 'the start'} (round {round_})",
                  level=logging.WARNING, round=round_, restarts=self.restarts, error=str(exc)[:500])
        deadline = time.monotonic() + 120
        while True:
            try:
                ray.get([a.start.remote(s, None if self._quotas is None else self._quotas[i])
                         for i, (a, s) in enumerate(zip(self.learners, starts))])
                break
            except RayActorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the dead actor is being restarted by Ray
        return round_, mixed

    def _history_config(self) -> dict[str, Any]:
        """The run's configuration as the history keeps it."""
        est = self.estimator
        return {"estimator": type(est).__name__,
                "params": est.get_params(deep=False) if hasattr(est, "get_params") else {},
                "options": dict(self.loop_options), "workers": self.workers,
                "sync": {"every_batches": self.sync_every_batches, "every_seconds": self.sync_every_seconds,
                         "optimizer": self.sync_optimizer},
                "checkpoints": {"every_rounds": self.checkpoint_every_rounds,
                                "every_seconds": self.checkpoint_every_seconds}}

    def _observe(self, stats: RoundStats, reports: list[RoundReport], elapsed: float, rows_at_start: int) -> None:
        rate = (stats.rows - rows_at_start) / elapsed if elapsed > 0 else 0.0
        log_event("round", f"round {stats.round}: {stats.rows} rows, sync {stats.sync_seconds * 1e3:.1f} ms",
                  level=logging.DEBUG, round=stats.round, rows=stats.rows, sync_seconds=stats.sync_seconds,
                  synced_bytes=stats.synced_bytes)
        learners = [{"rows": r.rows, "batches": r.batches, "position": r.position, "ended": r.ended,
                     "loss": r.loss_sum / r.evaluated_rows if r.evaluated_rows else None,
                     "skipped_rows": dict(r.skipped_rows), "skipped_messages": dict(r.skipped_messages),
                     "rollbacks": r.rollbacks, "lr_scale": r.lr_scale, "quarantined_rows": len(r.quarantined_rows)}
                    for r in reports]
        skipped = _sum_counts(r.skipped_rows for r in reports)
        skipped_messages = _sum_counts(r.skipped_messages for r in reports)
        rollbacks = sum(r.rollbacks for r in reports)
        if self.health is not None:
            self.health.update(stats.ended, last_batch_at=time.time(), rows=stats.rows, round=stats.round, rows_per_s=rate,
                               last_checkpoint=self.last_checkpoint, learners=learners, skipped_rows=skipped,
                               skipped_messages=skipped_messages, rollbacks=rollbacks)
        if self.metrics is not None:
            m = self.metrics
            m.rows.set(stats.rows)
            m.batches.set(sum(r.batches for r in reports))
            m.rows_per_s.set(rate)
            m.last_batch.set(time.time())
            m.ckpt_age.set(time.monotonic() - self._last_ckpt_time)
            m.rollbacks.set(rollbacks)
            for reason, count in skipped.items():
                m.skipped.labels(reason).set(count)
            for reason, count in skipped_messages.items():
                m.skipped_messages.labels(reason).set(count)
            if self._learner_gauge is None:
                import prometheus_client as prom

                self._learner_gauge = {
                    "rows": prom.Gauge("streamfit_learner_rows_trained", "rows trained by each learner",
                                       ["learner"], registry=m.registry),
                    "rollbacks": prom.Gauge("streamfit_learner_rollbacks", "divergence rollbacks of each learner",
                                            ["learner"], registry=m.registry),
                    "skipped": prom.Gauge("streamfit_learner_rows_skipped", "rows each learner skipped, by reason",
                                          ["learner", "reason"], registry=m.registry)}
            gauges = self._learner_gauge
            for i, r in enumerate(reports):
                gauges["rows"].labels(str(i)).set(r.rows)
                gauges["rollbacks"].labels(str(i)).set(r.rollbacks)
                for reason, count in r.skipped_rows.items():
                    gauges["skipped"].labels(str(i), reason).set(count)


def _check_args(source: Any, workers: Any, sync_every_batches: Any, sync_every_seconds: Any, resume: bool,
                checkpoint_dir: Any, learner_timeout: Any, idle_round_seconds: Any, max_rows: Any) -> int | None:
    """Refuse invalid arguments of :class:`DistributedTrainer`; the rounds' batches (the default when no period)."""
    if sync_every_batches is not None and sync_every_seconds is not None:
        raise ValueError("give one of sync_every_batches and sync_every_seconds, not both")
    if sync_every_batches is None and sync_every_seconds is None:
        sync_every_batches = DEFAULT_SYNC_EVERY_BATCHES
    if sync_every_batches is not None and (isinstance(sync_every_batches, bool) or sync_every_batches < 1):
        raise ValueError(f"Invalid sync_every_batches: {sync_every_batches!r}, expected an int >= 1")
    if sync_every_seconds is not None and not sync_every_seconds > 0:
        raise ValueError(f"Invalid sync_every_seconds: {sync_every_seconds!r}, expected seconds > 0")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Invalid workers: {workers!r}, expected an int >= 1")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir")
    if not isinstance(source, str):
        raise TypeError(f"source must be a URI or path string, got {type(source).__name__}")
    if learner_timeout is not None and not learner_timeout > 0:
        raise ValueError(f"Invalid learner_timeout: {learner_timeout!r}, expected seconds > 0 or None")
    if idle_round_seconds is not None and not idle_round_seconds > 0:
        raise ValueError(f"Invalid idle_round_seconds: {idle_round_seconds!r}, expected seconds > 0 or None")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0):
        raise ValueError(f"Invalid max_rows: {max_rows!r}, expected None or an int >= 0")
    return sync_every_batches  # type: ignore[no-any-return]


def _progress(round_: int, learners: Any) -> Progress:
    """The history's counters from the learners' reports (or start points): rows, evaluated rows and loss sums
    are cumulative, over resumes too."""
    learners = list(learners)
    evaluated = sum(r.evaluated_rows for r in learners)
    loss = sum(r.loss_sum for r in learners) / evaluated if evaluated else None
    return Progress(round_, sum(r.rows for r in learners), _sum_counts(r.skipped_rows for r in learners), {},
                    {"rows": evaluated, "loss": loss} if evaluated else {})


def _arm_pause(round_: int) -> None:
    """The test hook of :data:`PAUSE_ROUND_ENV` (the writer before this one is done: ``submit`` waits for it)."""
    spec = os.environ.get(PAUSE_ROUND_ENV)
    if spec:
        from streamfit.checkpoint._fs import PAUSE_ENV

        at, _, point = spec.partition(":")
        if round_ >= int(at):
            os.environ[PAUSE_ENV] = point


def _quarantined_rows(reports: list[RoundReport]) -> list[dict[str, Any]]:
    """The learners' quarantined poison rows, each with its learner."""
    return [{"learner": r.learner, **row} for r in reports for row in r.quarantined_rows]


def learner_dead_letter(spec: str, learner: int) -> str:
    """Learner ``learner``'s dead-letter sink: its own file beside the path given (``NAME.learner-I.jsonl``), or
    the one Kafka topic (``kafka://``) every learner writes to."""
    if "://" in spec:
        return spec
    path = Path(spec)
    return str(path.with_name(f"{path.stem}.learner-{learner}{path.suffix}"))


def _shippable(estimator: Any) -> Any:
    """A copy of the estimator to send to the learners, holding its ONNX model bytes instead of a local path."""
    model = getattr(estimator, "model", None)
    if isinstance(model, (str, os.PathLike)) and Path(model).is_file():
        shipped = copy.deepcopy(estimator)
        shipped.model = Path(model).read_bytes()
        return shipped
    return estimator


def _rename_refs(tree: Any, rename: Mapping[str, str]) -> Any:
    if isinstance(tree, dict):
        if set(tree) == {_REF}:
            return {_REF: rename.get(tree[_REF], tree[_REF])}
        return {k: _rename_refs(v, rename) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_rename_refs(v, rename) for v in tree]
    return tree


def _sum_counts(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + int(v)
    return out

