"""The history file on its own: a torn last line is ignored, parts rotate and stay bounded, a resume cuts the
intervals after its checkpoint, the records read back as written."""

from __future__ import annotations

import json

import pytest

from streamfit.history import (CheckpointMark, HistoryLog, HistoryOptions, Interval, Progress, RollbackMark,
                               RunHistory, RunStart, read_history)
from streamfit.history._observer import interval_metrics


def _interval(seq: int, start: int, end: int, **kw) -> Interval:
    return Interval(seq=seq, run=0, batch_start=start, batch_end=end, rows_start=start * 10, rows_end=end * 10,
                    time_start=float(seq), time_end=seq + 1.0, rows_per_s=10.0, **kw)


def test_records_read_back_as_written(tmp_path):
    log = HistoryLog(tmp_path)
    run = RunStart(0, 1.0, 0, 0, None, "parquet:/x", {"options": {"batch_size": 32}})
    a = _interval(0, 0, 4, metrics={"loss": 0.5, "rmse": float("nan")}, skipped_rows={"null": 3},
                  checkpoints=(CheckpointMark(4, 40, 0.01, 1234, "ckpt-000000000004"),),
                  rollbacks=(RollbackMark(50, 3, 30, "loss 1e9", 0.1, ("part-1.parquet",)),), lag={"0": 7})
    log.append(run)
    log.append(a)
    log.close()
    h = read_history(tmp_path)
    assert h.runs == [run]
    assert h.intervals == [Interval(**{**a.__dict__, "metrics": {"loss": 0.5, "rmse": None}})]  # NaN: null


def test_a_torn_last_line_is_ignored_and_cut_on_resume(tmp_path):
    log = HistoryLog(tmp_path)
    log.append(RunStart(0, 1.0, 0, 0))
    for i in range(3):
        log.append(_interval(i, i * 4, i * 4 + 4))
    log.close()
    part = next(tmp_path.glob("history-*.jsonl"))
    full = json.dumps({"schema": 1, "kind": "interval", **_interval(3, 12, 16).__dict__})
    with open(part, "a") as f:
        f.write(full[:len(full) // 2])  # a crash in the middle of a write
    assert [i.seq for i in read_history(tmp_path).intervals] == [0, 1, 2]
    last = HistoryLog(tmp_path).truncate_after(8)
    assert last is not None and last.batch_end == 8
    assert part.read_bytes().endswith(b"\n")  # the torn line and the interval after batch 8 gone
    assert [i.seq for i in read_history(tmp_path).intervals] == [0, 1]


def test_appending_after_a_torn_line_starts_a_new_line(tmp_path):
    log = HistoryLog(tmp_path)
    log.append(_interval(0, 0, 4))
    log.close()
    part = next(tmp_path.glob("history-*.jsonl"))
    with open(part, "a") as f:
        f.write('{"schema": 1, "kind": "inter')
    log = HistoryLog(tmp_path)
    log.append(_interval(1, 4, 8))
    log.close()
    assert [i.seq for i in read_history(tmp_path).intervals] == [0, 1]


def test_parts_rotate_bounded_and_keep_the_run_start(tmp_path):
    log = HistoryLog(tmp_path, max_bytes=2048, keep_parts=3)
    log.append(RunStart(0, 1.0, 0, 0, None, None, {"label": "y"}))
    for i in range(200):
        log.append(_interval(i, i, i + 1))
    log.close()
    parts = sorted(tmp_path.glob("history-*.jsonl"))
    assert len(parts) == 3 and all(p.stat().st_size <= 2048 for p in parts)
    h = read_history(tmp_path)
    assert h.runs[0].config == {"label": "y"}  # copied at the head of each part
    seqs = [i.seq for i in h.intervals]
    assert seqs == list(range(seqs[0], 200)) and seqs[0] > 0  # the oldest parts removed, the rest in order


def test_a_newer_schema_is_refused_by_name(tmp_path):
    (tmp_path / "history-000001.jsonl").write_text(json.dumps({"schema": 99, "kind": "interval"}) + "\n")
    with pytest.raises(ValueError, match="schema 99"):
        read_history(tmp_path)


def test_interval_metrics_from_two_stream_snapshots():
    before = {"rows": 100, "loss": 2.0, "mae": 1.0, "rmse": 1.0}
    after = {"rows": 300, "loss": 1.0, "mae": 0.5, "rmse": 2.0}
    metrics, n = interval_metrics(before, after)
    assert n == 200
    assert metrics["loss"] == pytest.approx((300 * 1.0 - 100 * 2.0) / 200)
    assert metrics["rmse"] == pytest.approx(((300 * 4.0 - 100 * 1.0) / 200) ** 0.5)  # through the squares
    assert interval_metrics({}, {"rows": 10, "loss": 0.3, "accuracy": 0.9}) == ({"loss": 0.3, "accuracy": 0.9}, 10)


def test_rollback_cuts_the_lineage_and_keeps_the_mark(tmp_path):
    state = {"batches": 0, "rows": 0}
    hist = RunHistory(tmp_path, HistoryOptions(every_rows=20, every_seconds=None))
    hist.start(lambda: Progress(state["batches"], state["rows"]), resumed_from=None, source=None, config={})
    for b in range(1, 11):
        state.update(batches=b, rows=b * 10)
        if b == 4:
            hist.boundary()  # a rollback point at batch 4
        hist.batch(state["rows"])
    state.update(batches=4, rows=40)  # diverged at batch 10: back to batch 4
    hist.rollback(at_rows=100, to_step=4, to_rows=40, reason="loss", lr_scale=0.1)
    for b in range(5, 9):
        state.update(batches=b, rows=b * 10)
        hist.batch(state["rows"])
    hist.close()
    h = read_history(tmp_path)
    assert [(i.batch_start, i.batch_end) for i in h.intervals] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [i.seq for i in h.intervals] == [0, 1, 2, 3]
    assert h.intervals[2].rollbacks == (RollbackMark(100, 4, 40, "loss", 0.1),)
    assert not h.gaps()
