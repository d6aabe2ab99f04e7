"""``--max-rows`` (a total over the learners), a followed Parquet directory (issue 22, part 4) and the metrics
history's options with ``--workers``, on a real local Ray cluster (one node on 127.0.0.1, started and stopped
here: ~90 s in all).

Before: the first two were refused (ConfigError), the history's options ignored.  Now a budget stops the run at exactly that many rows, a learner whose
share ends first leaving its quota to the others; a followed directory's new files are read by the learner their
name hashes to.  Every row once: the merged scaler's count equals the rows trained.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from streamfit import LinearRegressor  # noqa: E402
from streamfit.checkpoint import CheckpointStore  # noqa: E402
from streamfit.distributed import DistributedTrainer, LocalRayCluster  # noqa: E402
from tests.distributed._clusters import driven_cluster  # noqa: E402
from streamfit.distributed._shares import file_owner  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

D = 8
ROWS_PER_FILE = 4000
BATCH = 100


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    with driven_cluster(nodes=1, cpus=2) as c:
        yield c


def _table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(0).standard_normal(D)
    X = rng.standard_normal((ROWS_PER_FILE, D)).astype(np.float32)
    y = (X @ w + 0.5 * rng.standard_normal(ROWS_PER_FILE)).astype(np.float32)
    return pa.table({**{f"x{j}": X[:, j] for j in range(D)}, "y": y})


def _write(root: Path, i: int) -> None:
    """File ``part-i`` written under a hidden name, then renamed (a followed directory ignores it until then)."""
    pq.write_table(_table(i), root / f".part-{i:03d}.parquet", row_group_size=1000)
    os.replace(root / f".part-{i:03d}.parquet", root / f"part-{i:03d}.parquet")


def _every_row_once(ckpt: Path, rows: int) -> None:
    latest = CheckpointStore(ckpt).load_latest()
    assert latest.meta["rows"] == rows
    counts = {k: int(v) for k, v in latest.arrays.items() if k.endswith("/count") and not k.startswith("learners/")}
    assert counts and set(counts.values()) == {rows}, counts


def _estimator() -> LinearRegressor:
    return LinearRegressor(optimizer="sgd", learning_rate="constant", eta0=0.05, penalty=None)


def test_max_rows_is_a_total_a_short_share_leaves_its_quota_to_the_others(cluster, tmp_path) -> None:
    """3 files: learner 0 reads 2 (8,000 rows), learner 1 one (4,000).  max_rows 10,050: quotas 5,025 each;
    learner 1's share ends at 4,000, its last 1,025 go to learner 0 (6,050).  Resumed with max_rows 12,000 (all),
    the rest is trained: 12,000 rows, each once."""
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    data.mkdir()
    for i in range(3):
        _write(data, i)

    def run(max_rows: int, resume: bool) -> Any:
        return DistributedTrainer(_estimator(), f"parquet:{data}", workers=2, sync_every_batches=5,
                                  batch_size=BATCH, checkpoint_dir=ckpt, learner_cpus=0.5, max_rows=max_rows,
                                  resume=resume).run()

    first = run(10_050, False)
    assert first.ended_by == "max_rows" and first.rows == 10_050
    assert first.learner_rows == [6_050, 4_000]
    assert first.positions == [{"file": "part-002.parquet", "row": 2_050}, {"file": "part-001.parquet", "row": 4_000}]
    _every_row_once(ckpt, 10_050)
    meta = CheckpointStore(ckpt).load_latest().meta["distributed"]
    assert (meta["max_rows"], meta["quotas"]) == (10_050, [6_050, 4_000])
    again = run(10_050, True)  # the budget is spent: nothing more
    assert again.ended_by == "max_rows" and again.rows == 10_050
    rest = run(12_000, True)
    assert rest.rows == 12_000 and rest.learner_rows == [8_000, 4_000]
    _every_row_once(ckpt, 12_000)


def _cli(args: list[str], cluster: LocalRayCluster) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "streamfit.cli", *args], env={**os.environ,
                            "HOME": str(cluster.home)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_train_workers_follows_a_directory_until_max_rows(cluster, tmp_path) -> None:
    """`streamfit train --workers 2 --follow --max-rows 12,345`: two files at the start (one for each learner, by
    the hash of their names), two more written while it runs; it stops at exactly 12,345 rows (quotas 6,173 and
    6,172: each learner reads into its second file), every row once."""
    data, ckpt, health = tmp_path / "data", tmp_path / "ckpt", tmp_path / "health.json"
    data.mkdir()
    assert [file_owner(f"part-{i:03d}.parquet", 2) for i in range(4)] == [1, 0, 1, 0]
    for i in range(2):
        _write(data, i)
    proc = _cli(["train", "--workers", "2", "--ray-address", cluster.address, "--source", f"parquet:{data}",
                 "--follow", "--max-rows", "12345", "--estimator", "LinearRegressor", "--optimizer", "sgd",
                 "--learning-rate", "constant", "--eta0", "0.05", "--penalty", "none", "--batch-size", str(BATCH),
                 "--sync-every-batches", "5", "--checkpoint-dir", str(ckpt), "--health-file", str(health)], cluster)
    try:
        deadline = time.monotonic() + 180
        while not (health.exists() and json.loads(health.read_text() or "{}").get("rows", 0) >= 2 * ROWS_PER_FILE):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first two files were not trained within 180 s"
            time.sleep(0.2)
        for i in (2, 3):
            _write(data, i)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "trained 12345 rows with 2 learners" in out, out
    _every_row_once(ckpt, 12_345)
    learners = CheckpointStore(ckpt).load_latest().meta["distributed"]["learners"]
    assert [e["position"] for e in learners] == [{"file": "part-003.parquet", "row": 2_173},
                                                  {"file": "part-002.parquet", "row": 2_172}]


def test_cli_train_workers_keeps_the_history_as_asked_and_tensorboard_logs_it(cluster, tmp_path) -> None:
    """--history-dir, --history-every-rows and --tensorboard with --workers (ignored before: the history went
    beside the checkpoints, an interval every 10 s or checkpoint).  Rounds of 2 x 5 x 100 rows: an interval ends at
    the first barrier past every 2,000 rows and at each global checkpoint (every 6 rounds); the health file is
    written every --health-interval."""
    from streamfit.history import read_history

    data, ckpt, hist, tb = tmp_path / "data", tmp_path / "ckpt", tmp_path / "hist", tmp_path / "tb"
    data.mkdir()
    for i in range(4):
        _write(data, i)
    proc = _cli(["train", "--workers", "2", "--ray-address", cluster.address, "--source", f"parquet:{data}",
                 "--estimator", "LinearRegressor", "--optimizer", "sgd", "--learning-rate", "constant", "--eta0",
                 "0.05", "--penalty", "none", "--batch-size", str(BATCH), "--sync-every-batches", "5",
                 "--checkpoint-dir", str(ckpt), "--checkpoint-every-rounds", "6", "--history-dir", str(hist),
                 "--history-every-rows", "2000", "--history-every-seconds", "3600", "--tensorboard", str(tb),
                 "--health-file", str(tmp_path / "health.json"), "--health-interval", "0.2"], cluster)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "trained 16000 rows with 2 learners" in out and "tensorboard" in out.lower(), out
    assert not (ckpt / "history").exists()
    h = read_history(hist)
    # (the last round, where the shares end, trains no row: its interval and the closing one are empty)
    trained = [i for i in h.intervals if i.rows_end > i.rows_start]
    assert [i.rows_end for i in trained] == [2000, 4000, 6000, 8000, 10_000, 12_000, 14_000, 16_000]
    assert h.intervals[-1].rows_end == 16_000 and not h.gaps()
    assert all(i.metrics.get("loss") is not None for i in trained)
    events = list(tb.glob("events*"))
    assert events and events[0].stat().st_size > 0
