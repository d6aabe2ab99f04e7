"""Observability of a run: a health file, structured log lines and optional Prometheus metrics."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["HealthFile", "JsonFormatter", "Metrics", "log_event"]

logger = logging.getLogger("streamfit.daemon")


def log_event(event: str, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured log line: ``event`` plus fields (the JSON formatter prints them all)."""
    logger.log(level, message, extra={"event": event, "fields": fields})


class JsonFormatter(logging.Formatter):
    """Log records as one JSON object per line (time, level, logger, event, message, fields)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {"time": round(record.created, 3), "level": record.levelname,
                                "logger": record.name, "message": record.getMessage()}
        if hasattr(record, "event"):
            data["event"] = record.event
        data.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class HealthFile:
    """A small JSON file rewritten atomically (at most every ``interval`` s): when the last batch trained, the
    newest durable checkpoint, and whether the stream is idle (``idle``, ``idle_since``: the Runner rewrites it
    while no batch arrives too)."""

    def __init__(self, path: str | os.PathLike[str], interval: float = 1.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self._last = 0.0

    def update(self, force: bool = False, **fields: Any) -> None:
        now = time.time()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        data = {"updated_at": now, **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".health-", dir=self.path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, default=str)
        os.replace(tmp, self.path)


class Metrics:
    """Prometheus metrics on 127.0.0.1 (needs the ``[metrics]`` extra: prometheus-client).

    Parameters
    ----------
    port, host
        Where the Prometheus endpoint listens (``port=0``: a free port).
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        try:
            import prometheus_client as prom
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError("--metrics-port needs prometheus-client: pip install 'streamfit[metrics]'") from exc
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.rows = prom.Gauge("streamfit_rows_trained", "rows trained (total, across restarts)", registry=r)
        self.batches = prom.Gauge("streamfit_batches_trained", "batches trained", registry=r)
        self.skipped = prom.Gauge("streamfit_rows_skipped", "rows skipped as bad input", ["reason"], registry=r)
        self.skipped_messages = prom.Gauge("streamfit_messages_skipped", "whole messages skipped (undecodable, "
                                           "empty_batch, poison, ...)", ["reason"], registry=r)
        self.lr_scale = prom.Gauge("streamfit_lr_scale", "learning-rate scale (lowered by rollbacks, recovers)",
                                   registry=r)
        self.loss = prom.Gauge("streamfit_progressive_loss", "progressive loss over the recent window", registry=r)
        self.rows_per_s = prom.Gauge("streamfit_rows_per_second", "training throughput", registry=r)
        self.ckpt_age = prom.Gauge("streamfit_checkpoint_age_seconds", "seconds since the last durable checkpoint",
                                   registry=r)
        self.ckpt_seconds = prom.Gauge("streamfit_checkpoint_write_seconds", "duration of the last checkpoint write",
                                       registry=r)
        self.position = prom.Gauge("streamfit_source_position", "source position (row or offset)", ["part"],
                                   registry=r)
        self.rollbacks = prom.Gauge("streamfit_rollbacks", "divergence rollbacks", registry=r)
        self.last_batch = prom.Gauge("streamfit_last_batch_timestamp", "unix time of the last trained batch",
                                     registry=r)
        self.server, self.thread = prom.start_http_server(port, addr=host, registry=r)
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
