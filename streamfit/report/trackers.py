"""The trackers users already have, fed from a run's metrics history: MLflow and TensorBoard.

Both replay the same records (:func:`scalars`): per interval, at the step of the rows trained by its end, the
progressive metrics, rows/s, the learning-rate scale, skips by reason, lag per partition, and each checkpoint's
write time and size.  MLflow also gets the run's parameters (its configuration, flattened) and the model of
the newest checkpoint as an artifact.  Extras: ``[mlflow]`` (mlflow-skinny), ``[tensorboard]`` (tensorboardX).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from streamfit.history import History, read_history

__all__ = ["Scalar", "log_mlflow", "scalars", "write_tensorboard"]


@dataclass(frozen=True)
class Scalar:
    """One value of the history for a tracker: a tag, the rows trained (the step), unix time."""

    tag: str
    value: float
    step: int
    time: float


def scalars(history: History) -> Iterator[Scalar]:
    """The history as scalars, interval by interval (the tags are ``metrics/loss``, ``rows_per_s``, ...)."""
    for iv in history.intervals:
        step, t = iv.rows_end, iv.time_end
        if iv.rows_end > iv.rows_start:
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


def write_tensorboard(checkpoint_dir: str | os.PathLike[str], logdir: str | os.PathLike[str]) -> str:
    """Write the history of ``checkpoint_dir`` as TensorBoard scalar events in ``logdir``; returns ``logdir``."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("--tensorboard needs tensorboardX: pip install 'streamfit[tensorboard]'") from exc
    history = _history(checkpoint_dir)
    writer = SummaryWriter(logdir=os.fspath(logdir))
    try:
        for s in scalars(history):
            writer.add_scalar(s.tag, s.value, global_step=s.step, walltime=s.time)
        if history.runs:
            text = "\n".join(f"    {k} = {v}" for k, v in sorted(_flat(history.runs[-1].config).items()))
            writer.add_text("config", text, global_step=0)
    finally:
        writer.close()
    return os.fspath(logdir)


def log_mlflow(checkpoint_dir: str | os.PathLike[str], tracking_uri: str, experiment: str = "streamfit") -> str:
    """Log the run of ``checkpoint_dir`` to MLflow at ``tracking_uri`` (a new MLflow run in ``experiment``):
    parameters, the metrics history, the newest checkpoint's model.  Returns the MLflow run id.

    A file store (``file:`` URI or a path) is what the MLflow client alone can write; MLflow 3 keeps it behind
    ``MLFLOW_ALLOW_FILE_STORE``, set here for that URI since it was asked for by name."""
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("--mlflow needs an MLflow client: pip install 'streamfit[mlflow]' (mlflow-skinny)") from exc
    root = Path(checkpoint_dir)
    history = _history(root)
    if "://" not in tracking_uri or tracking_uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=root.resolve().name,
                            tags={"streamfit.checkpoint_dir": str(root.resolve())})
    run_id = run.info.run_id
    try:
        params = _flat(history.runs[-1].config) if history.runs else {}
        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            client.log_batch(run_id, params=items[i:i + 100])
        metrics = [Metric(s.tag, s.value, int(s.time * 1000), s.step) for s in scalars(history)]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i:i + 1000])
        _log_model(client, run_id, root)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id)
    return str(run_id)


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
