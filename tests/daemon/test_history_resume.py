"""The metrics history of `streamfit serve` survives SIGKILL and resume: no gap, no duplicate interval.

Each process is killed once the history holds intervals after its newest durable checkpoint (the tail a
resume trains again), or while a checkpoint is half written; the resumed run cuts that tail and writes it
again, so the final history's intervals meet end to start from row 0 to the stream's last row.
"""

from __future__ import annotations

import signal
from pathlib import Path

from streamfit.checkpoint import CheckpointStore
from streamfit.history import read_history
from tests.daemon.helpers import read_health as _health
from tests.daemon.helpers import run_cli as _cli
from tests.daemon.helpers import wait_for as _wait
from tests.daemon.helpers import write_model, write_stream
from tests.daemon.test_serve import TRAIN_OPTS, _kill

FILES, ROWS = 4, 2048  # 8192 rows, 256 batches of 32


def _serve(source: str, model: Path, ck: Path, health: Path, extra=(), env=None):
    return _cli("serve", "--source", source, "--model", str(model), "--checkpoint-dir", str(ck),
                "--checkpoint-every-batches", "16", "--history-every-rows", "96", "--health-file", str(health),
                "--health-interval", "0", "--log-json", *TRAIN_OPTS, *extra, env=env)


def _tail_past_checkpoint(ck: Path, batches: int) -> bool:
    """The history holds intervals ``batches`` past the newest durable checkpoint."""
    latest = CheckpointStore(ck).list()
    if not latest:
        return False
    try:
        intervals = read_history(ck).intervals
    except (OSError, ValueError):
        return False
    return bool(intervals) and intervals[-1].batch_end >= latest[-1].step + batches


def test_history_survives_sigkill_and_resume_without_gap_or_duplicate(tmp_path):
    data, total = write_stream(tmp_path, FILES, ROWS)
    model = write_model(tmp_path)
    ck, health = tmp_path / "ck", tmp_path / "health.json"
    resume: list[str] = []
    cut = 0  # intervals the killed processes wrote after their newest durable checkpoint
    for point in ("step", "files_written"):
        if point == "step":
            proc = _serve(f"parquet:{data}", model, ck, health, resume)
            start = _health(health).get("rows", 0)
            _wait(lambda: _health(health).get("rows", 0) >= start + 320 and _tail_past_checkpoint(ck, 6), proc,
                  what="intervals after the newest checkpoint")
        else:  # the writer parks after writing the files, before the rename: that checkpoint never lands
            marker = tmp_path / f"marker-{point}"
            proc = _serve(f"parquet:{data}", model, ck, health, resume,
                          env={"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"{point}:{marker}"})
            _wait(marker.exists, proc, what=f"checkpoint point {point}")
        _kill(proc)
        newest = CheckpointStore(ck).list()[-1].step
        cut += sum(1 for i in read_history(ck).intervals if i.batch_end > newest)
        resume = ["--resume"]
    assert cut > 0  # the kills did leave a tail to cut
    proc = _serve(f"parquet:{data}", model, ck, health, resume)
    _wait(lambda: _health(health).get("rows", 0) >= total, proc, what="the whole stream")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err

    h = read_history(ck)
    assert [r.run for r in h.runs] == [0, 1, 2]
    intervals = h.intervals
    assert [i.seq for i in intervals] == list(range(len(intervals)))
    assert intervals[0].batch_start == 0 and intervals[0].rows_start == 0
    assert not h.gaps(), h.gaps()
    assert all(a.rows_end == b.rows_start for a, b in zip(intervals, intervals[1:]))
    assert intervals[-1].rows_end == total and intervals[-1].batch_end == total // 32
    # every trained row in exactly one interval; every row after the first batch evaluated in one
    assert sum(i.rows_end - i.rows_start for i in intervals) == total
    assert sum(i.evaluated_rows for i in intervals) == total - 32
    assert {i.run for i in intervals} == {0, 1, 2} - {r.run for r in h.runs if _no_rows(h, r.run)}
    durable = {c.step for i in intervals for c in i.checkpoints}
    assert CheckpointStore(ck).list()[-1].step in durable
    assert all(i.metrics.get("loss") is not None for i in intervals if i.evaluated_rows)


def _no_rows(h, run: int) -> bool:
    return not any(i.run == run and i.batch_end > i.batch_start for i in h.intervals)
