"""train_stream's history (the ``history_dir`` option): a real run's intervals read back hold the progressive
loss of their batches (against the loop's own per-batch metrics), and a second run given the same directory
continues the history without gap or duplicate interval; an idle interval (no rows) is marked and logs no
throughput."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from streamfit import LinearRegressor, train_stream_sync
from streamfit.history import HistoryOptions, Progress, RunHistory, read_history
from streamfit.report.trackers import interval_scalars
from streamfit.sources.memory import MemorySource


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y})


def _run(est, table, directory, events):
    return train_stream_sync(est, MemorySource(table), batch_size=100, history_dir=str(directory),
                             history_every_rows=500, history_every_seconds=None,
                             on_metrics=lambda e: events.append((e.rows, e.batch_metrics)))


def _interval_losses(events, intervals, rows_before=0):
    """Each interval's loss from the loop's own per-batch metrics: evaluated rows weighted."""
    out = []
    for iv in intervals:
        inside = [(m["loss"], m["rows"]) for rows, m in events if iv.rows_start < rows + rows_before <= iv.rows_end]
        n = sum(r for _, r in inside)
        out.append(sum(loss * r for loss, r in inside) / n if n else None)
    return out


def test_train_stream_keeps_a_history_that_a_second_run_continues(tmp_path):
    table = _table(4000)
    est = LinearRegressor(learning_rate=0.05, random_state=0)
    first: list = []
    summary = _run(est, table.slice(0, 2000), tmp_path / "h", first)
    h = read_history(tmp_path / "h")
    assert summary.rows == 2000 and len(h.runs) == 1 and h.runs[0].config["options"]["batch_size"] == 100
    assert [(i.batch_start, i.batch_end, i.rows_start, i.rows_end) for i in h.intervals] == \
        [(5 * k, 5 * k + 5, 500 * k, 500 * k + 500) for k in range(4)]
    assert [i.metrics["loss"] for i in h.intervals] == pytest.approx(_interval_losses(first, h.intervals))
    assert sum(i.evaluated_rows for i in h.intervals) == summary.stream_metrics["rows"]
    assert h.intervals[-1].metrics["loss"] < h.intervals[0].metrics["loss"]  # it learns

    second: list = []
    _run(est, table.slice(2000), tmp_path / "h", second)  # the same estimator goes on: the history too
    h2 = read_history(tmp_path / "h")
    assert [r.run for r in h2.runs] == [0, 1] and (h2.runs[1].batches, h2.runs[1].rows) == (20, 2000)
    assert h2.intervals[:4] == h.intervals  # the first run's records untouched
    assert not h2.gaps() and [i.seq for i in h2.intervals] == list(range(8))
    assert [(i.run, i.batch_start, i.rows_end) for i in h2.intervals[4:]] == \
        [(1, 20 + 5 * k, 2500 + 500 * k) for k in range(4)]
    assert len({(i.batch_start, i.batch_end) for i in h2.intervals}) == len(h2.intervals)  # none twice
    assert [i.metrics["loss"] for i in h2.intervals[4:]] == \
        pytest.approx(_interval_losses(second, h2.intervals[4:], rows_before=2000))


def test_train_stream_without_history_dir_writes_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_stream_sync(LinearRegressor(), MemorySource(_table(300)), batch_size=100)
    assert list(tmp_path.iterdir()) == []


def test_an_interval_without_rows_is_idle_and_logs_no_throughput(tmp_path):
    # the run's end writes an interval for a checkpoint that became durable after its last batch
    state = {"batches": 4, "rows": 400}
    h = RunHistory(None, HistoryOptions(every_rows=None, every_seconds=None), directory=tmp_path)
    h.start(lambda: Progress(state["batches"], state["rows"], stream_metrics={"rows": 0}), resumed_from=None,
            source=None, config={})
    state.update(batches=8, rows=800)
    h.boundary(sync=True)  # a checkpoint is taken at batch 8
    (tmp_path / "ckpt-8").mkdir()
    h.checkpoint(8, 800, 0.25, tmp_path / "ckpt-8")  # ... and becomes durable after the last batch
    h.close()
    ivs = read_history(tmp_path).intervals
    assert [(i.rows_start, i.rows_end, i.idle) for i in ivs] == [(400, 800, False), (800, 800, True)]
    assert [c.step for c in ivs[1].checkpoints] == [8]
    tags = {s.tag for s in interval_scalars(ivs[1])}
    assert tags == {"checkpoint/write_seconds", "checkpoint/bytes"}  # no rows/s of 0, no metrics
    assert "rows_per_s" in {s.tag for s in interval_scalars(ivs[0])}
