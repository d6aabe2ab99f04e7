"""--mlflow / --tensorboard log while the run goes: each interval, as the history writes it, is already in
MLflow's store and TensorBoard's event file when the next record comes (read there with their own readers),
and at the end both hold the same values as the history on disk."""

from __future__ import annotations

import os

import anyio
import pytest

from streamfit import OnnxRegressor
from streamfit.daemon import Runner
from streamfit.history import Interval, read_history
from tests.daemon.helpers import write_model, write_stream

pytest.importorskip("mlflow")
pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


class _Reader:
    """A sink after the trackers: at each interval, reads back what they logged so far."""

    def __init__(self, client, run_id: str, logdir) -> None:
        self.client, self.run_id, self.logdir = client, run_id, logdir
        self.seen: list[tuple[int, list[int], list[int]]] = []  # (interval end, MLflow steps, TensorBoard steps)

    def record(self, record) -> None:
        if not isinstance(record, Interval) or record.idle:
            return
        ea = event_accumulator.EventAccumulator(str(self.logdir))
        ea.Reload()
        tb = [e.step for e in ea.Scalars("rows_per_s")] if "rows_per_s" in ea.Tags()["scalars"] else []
        ml = [m.step for m in self.client.get_metric_history(self.run_id, "rows_per_s")]
        self.seen.append((record.rows_end, sorted(ml), tb))

    def close(self) -> None:
        pass


def test_trackers_log_each_interval_while_the_run_goes(tmp_path):
    from streamfit.report.trackers import MlflowTracker, TensorBoardTracker

    data, total = write_stream(tmp_path / "data", files=2, rows=1024)
    est = OnnxRegressor(str(write_model(tmp_path)), optimizer="adam", learning_rate="constant", eta0=0.01,
                        penalty=None, batch_size=64, threads=1)
    uri = (tmp_path / "mlruns").as_uri()
    ml = MlflowTracker(uri, checkpoint_dir=tmp_path / "ck")
    tb = TensorBoardTracker(tmp_path / "tb")
    reader = _Reader(ml.client, ml.run_id, tmp_path / "tb")
    runner = Runner(est, f"parquet:{data}", batch_size=64, checkpoint_dir=tmp_path / "ck", every_batches=8,
                    history_every_rows=256, history_every_seconds=None, trackers=[ml, tb, reader])
    summary = anyio.run(runner.run)
    assert summary.rows == total

    h = read_history(tmp_path / "ck")
    ends = [i.rows_end for i in h.intervals if not i.idle]  # every 256 rows, and at checkpoints
    assert ends[-1] == total and len(ends) >= total // 256 and len(reader.seen) == len(ends)
    # while the run went: at each interval's end both trackers already held it and every one before
    for k, (end, ml_steps, tb_steps) in enumerate(reader.seen):
        assert end == ends[k] and ml_steps == ends[:k + 1] and tb_steps == ends[:k + 1], (k, end)

    # after: the same values as the history, read with their own readers
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    losses = [(i.rows_end, i.metrics["loss"]) for i in h.intervals if i.metrics.get("loss") is not None]
    history = sorted(ml.client.get_metric_history(ml.run_id, "metrics/loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(s, pytest.approx(v)) for s, v in losses]
    run = ml.client.get_run(ml.run_id)
    assert run.info.status == "FINISHED" and run.data.params["options.batch_size"] == "64"
    assert ml.client.list_artifacts(ml.run_id, "model")[0].path == "model/model.onnx"
    ea = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    events = ea.Scalars("metrics/loss")
    assert [e.step for e in events] == [s for s, _ in losses]
    assert [e.value for e in events] == pytest.approx([v for _, v in losses], rel=1e-6)  # float32 events
    checkpoints = sorted({c.rows for i in h.intervals for c in i.checkpoints})
    assert sorted(e.step for e in ea.Scalars("checkpoint/bytes")) == checkpoints


def test_a_failing_tracker_never_stops_the_run(tmp_path, caplog):
    class Broken:
        def record(self, record):
            raise ConnectionError("tracking server down")

        def close(self):
            pass

    data, total = write_stream(tmp_path / "data", files=1, rows=512)
    est = OnnxRegressor(str(write_model(tmp_path)), batch_size=64, threads=1)
    runner = Runner(est, f"parquet:{data}", batch_size=64, checkpoint_dir=tmp_path / "ck", history_every_rows=128,
                    trackers=[Broken()])
    with caplog.at_level("WARNING", logger="streamfit.history"):
        summary = anyio.run(runner.run)
    assert summary.rows == total and read_history(tmp_path / "ck").intervals[-1].rows_end == total
    assert any("Broken failed (ConnectionError: tracking server down)" in r.getMessage() for r in caplog.records)


def test_trackers_need_a_history():
    with pytest.raises(ValueError, match="trackers log the run's metrics history"):
        Runner(object(), "parquet:nowhere", trackers=[object()])
