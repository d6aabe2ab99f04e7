"""Skipped input across SIGKILL and resume: counts per reason and dead letters exactly as an uninterrupted run.

Bad rows are spread over every record batch, so whenever a checkpoint is written the reader has already
dropped bad rows ahead of the checkpoint's position; they must be counted (and dead-lettered) once, by
the run that trains past them.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from streamfit._stream.deadletter import read_dead_letters
from tests.daemon.helpers import N_FEATURES, write_model
from tests.daemon.test_serve import TRAIN_OPTS, _cli, _final_weights, _health, _kill, _serve, _wait

FILES, ROWS = 4, 2048


def _write_bad_stream(root: Path, seed: int = 3) -> tuple[Path, int]:
    """Parquet files with nulls, NaNs and infs in ~3% of the rows, and one file that is not Parquet."""
    data = root / "data"
    data.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    good = 0
    for i in range(FILES):
        X = rng.standard_normal((ROWS, N_FEATURES)).astype(np.float32)
        y = (X.sum(axis=1) + np.sin(X[:, 0])).astype(np.float32)
        nan_rows = rng.choice(ROWS - 1, 40, replace=False)  # the last row is good: the last batch passes them all
        X[nan_rows[:20], 1] = np.nan
        y[nan_rows[20:]] = np.inf
        null = np.zeros(ROWS, bool)
        null[rng.choice(np.setdiff1d(np.arange(ROWS - 1), nan_rows), 24, replace=False)] = True
        cols = {f"x{j}": pa.array(X[:, j], mask=null if j == 3 else None) for j in range(N_FEATURES)}
        cols["y"] = pa.array(y)
        pq.write_table(pa.table(cols), data / f"part-{i:03d}.parquet", row_group_size=512)
        good += ROWS - 64  # 62 batches of 32 (serve never trains a last partial batch: it waits for more)
        if i == 1:
            (data / f"part-{i:03d}b.parquet").write_bytes(b"not parquet at all" * 10)
    return data, good


def _letters(path: Path) -> Counter:
    return Counter((d.reason, d.rows, json.dumps(d.position, sort_keys=True), d.payload) for d in read_dead_letters(path))


def test_skip_counts_and_dead_letters_exact_after_kills(tmp_path):
    model = write_model(tmp_path)
    ref_root = tmp_path / "ref"
    ref_data, good = _write_bad_stream(ref_root)
    proc = _cli("train", "--source", f"parquet:{ref_data}", "--model", str(model), "--checkpoint-dir",
                str(ref_root / "ck"), "--on-bad", "skip", "--dead-letter", str(ref_root / "dead.jsonl"), *TRAIN_OPTS)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    _, ref_meta = _final_weights(ref_root / "ck")
    assert ref_meta["rows"] == good
    assert ref_meta["skipped_rows"] == {"non_finite": 40 * FILES, "null": 24 * FILES}
    assert ref_meta["skipped_messages"] == {"undecodable": 1}
    ref_letters = _letters(ref_root / "dead.jsonl")
    assert sum(n for (_, rows, _, _), n in ref_letters.items() if rows) and len(ref_letters) > 10

    data, _ = _write_bad_stream(tmp_path / "run")
    ck, health, dead = tmp_path / "ck", tmp_path / "health.json", tmp_path / "dead.jsonl"
    extra = ["--on-bad", "skip", "--dead-letter", str(dead), "--checkpoint-every-batches", "5"]
    resume: list[str] = []
    for point in ("files_written", "step", "files_written"):  # the first: before any checkpoint is durable
        if point == "step":
            proc = _serve(f"parquet:{data}", model, ck, health, [*extra, *resume])
            start = _health(health).get("rows", 0)
            _wait(lambda: _health(health).get("rows", 0) >= start + 1000, proc, what="training progress")
        else:
            marker = tmp_path / f"marker-{point}"
            proc = _serve(f"parquet:{data}", model, ck, health, [*extra, *resume],
                          env={"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"{point}:{marker}"})
            _wait(marker.exists, proc, what=f"checkpoint point {point}")
        _kill(proc)
        resume = ["--resume"]
    proc = _serve(f"parquet:{data}", model, ck, health, [*extra, *resume])
    _wait(lambda: _health(health).get("rows", 0) >= good, proc, what="the whole stream")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    _, meta = _final_weights(ck)
    assert meta["rows"] == good
    assert meta["skipped_rows"] == ref_meta["skipped_rows"]  # exact per reason, not +155..+900
    assert meta["skipped_messages"] == ref_meta["skipped_messages"]
    assert _letters(dead) == ref_letters  # every dead letter exactly once
