"""``streamfit train|serve --workers N``: the distributed run a configuration describes (called by the CLI)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Sequence

from streamfit.daemon.signals import signals_handled
from streamfit.distributed._coordinator import DistributedSummary, DistributedTrainer

__all__ = ["run_distributed"]


#: options of one learner's run that a ``--workers`` run does not have, and what to use instead
_NOT_WITH_WORKERS = {
    "checkpoint_every_batches": "--checkpoint-every-rounds R (a global checkpoint is written at a round's barrier)",
    "publish": "streamfit export CHECKPOINT_DIR -o MODEL.onnx (the newest global checkpoint's mixed model)",
    "publish_every": "streamfit export (no --publish with --workers)",
    "full_every": "nothing: a global checkpoint is always full",
}


def _refuse_unsupported(cfg: Any, serve: bool) -> None:
    """An option of one learner's run given to a ``--workers`` run is refused, naming it (never ignored)."""
    from streamfit.daemon.config import RunConfig
    from streamfit.exceptions import ConfigError

    defaults = RunConfig()
    for name, instead in _NOT_WITH_WORKERS.items():
        if getattr(cfg, name) != getattr(defaults, name):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} is not supported with --workers {cfg.workers} (scale-out on Ray); use {instead}")
    if cfg.stream.progress and not serve:
        raise ConfigError(f"--progress is not supported with --workers {cfg.workers}: the learners draw no bar; "
                          "watch --health-file (rows, per learner) or --metrics-port")


def _trainer(cfg: Any, serve: bool, trackers: Sequence[Any] = ()) -> DistributedTrainer:
    from streamfit.daemon.config import build_estimator
    from streamfit.daemon.guard import guard_of
    from streamfit.daemon.health import Metrics
    from streamfit.exceptions import ConfigError

    if cfg.source is None:
        raise ConfigError("no source given: --source URI (or 'source = ...' in the config file)")
    _refuse_unsupported(cfg, serve)
    opts = cfg.stream
    source_options = dict(cfg.source_options)
    if cfg.follow or (serve and cfg.source.startswith("parquet:")):  # as one learner: serve follows a directory
        source_options.setdefault("follow", True)
    metrics = Metrics(cfg.metrics_port) if cfg.metrics_port is not None else None
    # every loop option goes to the learners' loops as given (the estimator holds the inputs mapping; the
    # learners draw no progress bar); the task resolved as the estimator was built
    loop = {k: v for k, v in opts.loop_options().items() if k not in ("inputs", "progress", "max_rows", "dead_letter")}
    loop["task"] = opts.resolved_task
    return DistributedTrainer(
        build_estimator(cfg), cfg.source, workers=opts.workers, sync_every_batches=opts.sync_every_batches,
        sync_every_seconds=opts.sync_every_seconds, sync_optimizer=opts.sync_optimizer, finite=not serve,
        checkpoint_dir=cfg.checkpoint_dir, checkpoint_every_rounds=opts.checkpoint_every_rounds,
        checkpoint_every_seconds=cfg.checkpoint_every_seconds, keep=cfg.keep, resume=cfg.resume,
        ray_address=opts.ray_address, health_path=cfg.health_file, metrics=metrics,
        source_options=source_options, guard=guard_of(opts) or False, max_rows=opts.max_rows,
        dead_letter=opts.dead_letter if isinstance(opts.dead_letter, str) else None,
        learner_timeout=opts.learner_timeout, history=opts.history_options(), history_dir=opts.history_dir,
        trackers=trackers, health_interval=cfg.health_interval, **loop)


def run_distributed(cfg: Any, serve: bool, preflight: Any = None, trackers: Sequence[Any] = ()) -> DistributedSummary:
    """Run; ``serve`` trains until SIGTERM/SIGINT (then a final global checkpoint and commits), a second
    signal exits at once; ``train`` stops at the end of every share and writes ``cfg.output``.
    ``preflight(model, task, loss, optimizer)`` checks the model first (the CLI's, unless ``--no-check``);
    ``trackers`` (the CLI's ``--mlflow``, ``--tensorboard``) log the run's history as it is written."""
    if preflight is not None and getattr(cfg, "check", False) and cfg.model is not None:
        from streamfit.exceptions import ModelError

        result = preflight(cfg.model, cfg.task, cfg.loss, cfg.optimizer)
        if not result.ok:
            raise ModelError(result.message())
    trainer = _trainer(cfg, serve, trackers)
    trainer.connect()  # before our signal handlers: ray.init installs its own
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        logging.getLogger("streamfit.daemon").info(
            "signal %s: finishing the current round, then a final global checkpoint", signal.Signals(signum).name)
        stop.set()

    try:
        with signals_handled(on_signal) if serve else contextlib.nullcontext():
            summary = trainer.run(stop)
    finally:
        if trainer.metrics is not None:
            trainer.metrics.close()
    if cfg.output and hasattr(trainer.estimator, "trainer_"):
        import onnx

        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        onnx.save(trainer.estimator.to_onnx(), cfg.output)
    print(f"trained {summary.rows} rows with {cfg.workers} learners in {summary.rounds} rounds "
          f"({summary.rows_per_s:,.0f} rows/s; per learner {summary.learner_rows}); "
          f"synchronization {summary.sync_seconds:.2f} s, {summary.synced_bytes / 1e6:.2f} MB"
          + (f"; progressive loss {summary.metrics['stream']['loss']:.4g}"
             if summary.metrics.get("stream", {}).get("loss") is not None else ""))
    if summary.restarts:
        print(f"learner group restarts from a global checkpoint: {summary.restarts}")
    if summary.last_checkpoint:
        print(f"global checkpoint: {summary.last_checkpoint}")
    if cfg.output:
        print(f"model written to {cfg.output}")
    for tracker in trainer.trackers:  # where each logged the run (as one learner's run says it)
        said = getattr(tracker, "summary", None)
        if callable(said):
            print(said())
    return summary
