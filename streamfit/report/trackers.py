"""The trackers users already have, fed from a run's metrics history: MLflow and TensorBoard.

Both log the same scalars of each interval (:func:`interval_scalars`): at the step of the rows trained by its
end, the progressive metrics, rows/s, the learning-rate scale, skips by reason, lag per partition, and each
checkpoint's write time and size.  MLflow also gets the run's parameters (its configuration, flattened) and the
model of the newest checkpoint as an artifact.  :class:`TensorBoardTracker` and :class:`MlflowTracker` are
history sinks (:class:`~streamfit.history.HistorySink`): given to a run (``streamfit train|serve --mlflow URI
--tensorboard DIR``, ``Runner(trackers=...)``) they log each interval as the history writes it, so the curves
grow while the run goes; :func:`write_tensorboard` and :func:`log_mlflow` replay a finished history through them
(``streamfit report --mlflow/--tensorboard``).  A live tracker sees the intervals as written: after a rollback or
a resume the rows trained again are logged again at the same steps (the history on disk keeps one lineage).
Extras: ``[mlflow]`` (mlflow-skinny), ``[tensorboard]`` (tensorboardX).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from streamfit.history import History, Interval, RunStart, read_history

__all__ = ["MlflowTracker", "Scalar", "TensorBoardTracker", "interval_scalars", "log_mlflow", "scalars",
           "write_tensorboard"]


@dataclass(frozen=True)
class Scalar:
    """One value of the history for a tracker: a tag, the rows trained (the step), unix time."""

    tag: str
    value: float
    step: int
    time: float


def interval_scalars(iv: Interval) -> Iterator[Scalar]:
    """One interval as scalars (the tags are ``metrics/loss``, ``rows_per_s``, ...); an idle interval (no rows
    trained: :attr:`~streamfit.history.Interval.idle`) has no throughput, metrics nor learning-rate scale."""
    step, t = iv.rows_end, iv.time_end
    if not iv.idle:
        yield Scalar("rows_per_s", float(iv.rows_per_s), step, t)
        for name, value in sorted(iv.metrics.items()):
            if value is not None:
                yield Scalar(f"metrics/{name}", float(value), step, t)
        if iv.lr_scale is not None:
            yield Scalar("lr_scale", float(iv.lr_scale), step, t)
    for reason, n in sorted(iv.skipped_rows.items()):
        yield Scalar(f"skipped_rows/{reason}", float(n), step, t)
    for part, lag in sorted(iv.lag.items()):
        yield Scalar(f"lag/partition_{part}", float(lag), step, t)
    for c in iv.checkpoints:
        yield Scalar("checkpoint/write_seconds", float(c.seconds), c.rows, t)
        yield Scalar("checkpoint/bytes", float(c.bytes), c.rows, t)
    for r in iv.rollbacks:
        yield Scalar("rollbacks/at_rows", float(r.at_rows), r.to_rows, t)


def scalars(history: History) -> Iterator[Scalar]:
    """The history as scalars, interval by interval."""
    for iv in history.intervals:
        yield from interval_scalars(iv)


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        elif value is not None:
            out[name] = str(value)[:500]
    return out


def _history(checkpoint_dir: str | os.PathLike[str]) -> History:
    history = read_history(checkpoint_dir)
    if not history.runs and not history.intervals:
        raise ValueError(f"{checkpoint_dir} holds no metrics history (history/history-*.jsonl)")
    return history


class TensorBoardTracker:
    """Writes the history's intervals as TensorBoard scalar events in ``logdir`` as they come; each start's
    configuration as text.  Each interval is on disk before :meth:`record` returns (tensorboardX's synchronous
    event-file writer: its ``SummaryWriter`` queues events to a thread, a flush does not wait for them), so
    TensorBoard, or its ``EventAccumulator``, reads it while the run goes."""

    name = "tensorboard"

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        try:
            from tensorboardX.event_file_writer import EventsWriter
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError("--tensorboard needs tensorboardX: pip install 'streamfit[tensorboard]'") from exc
        self.logdir = os.fspath(logdir)
        Path(self.logdir).mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(os.path.join(self.logdir, "events"))

    def record(self, record: Interval | RunStart) -> None:
        if isinstance(record, RunStart):
            self.config(record.config, step=record.rows)
            return
        from tensorboardX.summary import scalar

        for s in interval_scalars(record):
            self._write(scalar(s.tag, s.value), s.step, s.time)
        self._writer.flush()

    def config(self, config: Mapping[str, Any], step: int = 0) -> None:
        """A run's configuration, flattened, as the text ``config``."""
        import time

        from tensorboardX.summary import text

        body = "\n".join(f"    {k} = {v}" for k, v in sorted(_flat(config).items()))
        self._write(text("config", body), step, time.time())
        self._writer.flush()

    def _write(self, summary: Any, step: int, walltime: float) -> None:
        from tensorboardX.proto import event_pb2

        self._writer.write_event(event_pb2.Event(summary=summary, step=int(step), wall_time=float(walltime)))

    def close(self) -> None:
        self._writer.close()

    def summary(self) -> str:
        return f"tensorboard: {self.logdir}"


class MlflowTracker:
    """Logs a run to MLflow at ``tracking_uri`` (a new MLflow run in ``experiment``): the parameters of its first
    start, each interval's metrics as they come, and at :meth:`close` the newest checkpoint's model (of
    ``checkpoint_dir``) as ``model/model.onnx``.

    A file store (``file:`` URI or a path) is what the MLflow client alone can write; MLflow 3 keeps it behind
    ``MLFLOW_ALLOW_FILE_STORE``, set here for that URI since it was asked for by name."""

    name = "mlflow"

    def __init__(self, tracking_uri: str, *, checkpoint_dir: str | os.PathLike[str] | None = None,
                 experiment: str = "streamfit") -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError("--mlflow needs an MLflow client: pip install 'streamfit[mlflow]' (mlflow-skinny)") \
                from exc
        if "://" not in tracking_uri or tracking_uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.client = client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        root = self.checkpoint_dir.resolve() if self.checkpoint_dir is not None else None
        run = client.create_run(experiment_id, run_name=root.name if root is not None else "streamfit",
                                tags={"streamfit.checkpoint_dir": str(root)} if root is not None else {})
        self.run_id = str(run.info.run_id)
        self._params = False

    def record(self, record: Interval | RunStart) -> None:
        if isinstance(record, RunStart):
            if not self._params:  # MLflow's parameters do not change: the first start's
                self.params(record.config)
            return
        self._log_metrics(list(interval_scalars(record)))

    def params(self, config: Mapping[str, Any]) -> None:
        """The run's parameters: ``config`` flattened (``options.batch_size``, ...)."""
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(_flat(config).items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        self._params = True

    def _log_metrics(self, values: list[Scalar]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(s.tag, s.value, int(s.time * 1000), s.step) for s in values]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self, status: str = "FINISHED") -> None:
        """The newest checkpoint's model as an artifact (on success), then the MLflow run ends with ``status``."""
        try:
            if status == "FINISHED" and self.checkpoint_dir is not None:
                _log_model(self.client, self.run_id, self.checkpoint_dir)
        except BaseException:
            self.client.set_terminated(self.run_id, "FAILED")
            raise
        self.client.set_terminated(self.run_id, status)

    def summary(self) -> str:
        return f"mlflow: {self.run_id}"


def write_tensorboard(checkpoint_dir: str | os.PathLike[str], logdir: str | os.PathLike[str]) -> str:
    """Write the history of ``checkpoint_dir`` as TensorBoard scalar events in ``logdir``; returns ``logdir``."""
    history = _history(checkpoint_dir)
    tracker = TensorBoardTracker(logdir)
    try:
        for iv in history.intervals:
            tracker.record(iv)
        if history.runs:
            tracker.config(history.runs[-1].config)
    finally:
        tracker.close()
    return tracker.logdir


def log_mlflow(checkpoint_dir: str | os.PathLike[str], tracking_uri: str, experiment: str = "streamfit") -> str:
    """Log the run of ``checkpoint_dir`` to MLflow at ``tracking_uri`` (a new MLflow run in ``experiment``):
    parameters (of its last start), the metrics history, the newest checkpoint's model.  Returns the run id."""
    history = _history(checkpoint_dir)
    tracker = MlflowTracker(tracking_uri, checkpoint_dir=checkpoint_dir, experiment=experiment)
    try:
        if history.runs:
            tracker.params(history.runs[-1].config)
        tracker._log_metrics(list(scalars(history)))  # in batches of 1000, not one call per interval
    except BaseException:
        tracker.close("FAILED")
        raise
    tracker.close()
    return tracker.run_id


def _log_model(client: Any, run_id: str, root: Path) -> None:
    """The newest valid checkpoint's model, as ``model/model.onnx``."""
    from streamfit.checkpoint import CheckpointStore

    ckpt = CheckpointStore(root).load_latest()
    if ckpt is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(ckpt.model_bytes)
        client.log_artifact(run_id, str(path), artifact_path="model")
