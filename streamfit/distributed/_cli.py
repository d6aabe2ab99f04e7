"""``streamfit train|serve --workers N``: the distributed run a configuration describes (called by the CLI)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from streamfit.distributed._coordinator import DistributedSummary, DistributedTrainer

__all__ = ["run_distributed"]


def _trainer(cfg: Any, serve: bool) -> DistributedTrainer:
    from streamfit.daemon.config import build_estimator
    from streamfit.daemon.guard import guard_of
    from streamfit.daemon.health import Metrics
    from streamfit.exceptions import ConfigError

    if cfg.source is None:
        raise ConfigError("no source given: --source URI (or 'source = ...' in the config file)")
    if cfg.follow:
        raise ConfigError("--workers: a followed Parquet directory cannot be shared among learners (drop --follow)")
    opts = cfg.stream
    if opts.max_rows is not None:
        raise ConfigError("--workers: --max-rows is not supported (each learner trains its whole share)")
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
        source_options=dict(cfg.source_options), guard=guard_of(opts) or False,
        dead_letter=opts.dead_letter if isinstance(opts.dead_letter, str) else None,
        learner_timeout=opts.learner_timeout, **loop)


def run_distributed(cfg: Any, serve: bool, preflight: Any = None) -> DistributedSummary:
    """Run; ``serve`` trains until SIGTERM/SIGINT (then a final global checkpoint and commits), a second
    signal exits at once; ``train`` stops at the end of every share and writes ``cfg.output``.
    ``preflight(model, task, loss, optimizer)`` checks the model first (the CLI's, unless ``--no-check``)."""
    if preflight is not None and getattr(cfg, "check", False) and cfg.model is not None:
        from streamfit.exceptions import ModelError

        result = preflight(cfg.model, cfg.task, cfg.loss, cfg.optimizer)
        if not result.ok:
            raise ModelError(result.message())
    trainer = _trainer(cfg, serve)
    trainer.connect()  # before our signal handlers: ray.init installs its own
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if serve:
        def on_signal(signum: int, frame: Any) -> None:
            if stop.is_set():
                os._exit(128 + signum)
            logging.getLogger("streamfit.daemon").info(
                "signal %s: finishing the current round, then a final global checkpoint", signal.Signals(signum).name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        summary = trainer.run(stop)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
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
    return summary
