"""`streamfit serve` of a model with an embedding table, SIGKILLed while a delta checkpoint is written and right
after one is committed: the resumed runs end with the weights and counters of an uninterrupted run."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np

from streamfit.checkpoint import CheckpointStore
from tests.daemon.test_serve import _cli, _health, _kill, _wait
import time

from tests.daemon.test_table_checkpoints import write_table_model, write_table_stream

FILES, ROWS = 16, 256  # a file is 4 batches: one checkpoint's worth

OPTS = ["--batch-size", "64", "--optimizer", "adagrad", "--learning-rate", "constant", "--eta0", "0.05",
        "--penalty", "none", "--threads", "1", "--no-progress", "--no-check", "--label", "y",
        "--input", "x=x0,x1,x2", "--input", "ids=ids", "--checkpoint-every-batches", "4", "--full-every", "3"]


def _final(ck: Path) -> tuple[dict, dict]:
    ckpt = CheckpointStore(ck).load_latest()
    return {k: v for k, v in ckpt.arrays.items() if k.startswith("trainer/")}, ckpt.meta


def _kind(path: str) -> str:
    return json.loads((Path(path) / "manifest.json").read_text())["tables"]["kind"]


def test_serve_killed_during_and_after_a_delta_write_resumes_exactly(tmp_path):
    data, model = write_table_stream(tmp_path, FILES, ROWS), write_table_model(tmp_path)
    total = FILES * ROWS
    ref = _cli("train", "--source", f"parquet:{data}", "--model", str(model), "--checkpoint-dir",
               str(tmp_path / "ref"), *OPTS)
    _, err = ref.communicate(timeout=120)
    assert ref.returncode == 0, err
    ref_weights, ref_meta = _final(tmp_path / "ref")
    assert ref_meta["rows"] == total

    # the stream arrives file by file, so the run is still training when the writer parks at the kill point
    src = tmp_path / "landing"
    src.mkdir()
    ck, health = tmp_path / "ck", tmp_path / "health.json"
    resumed_from = []
    resume: list[str] = []
    files = sorted(data.iterdir())

    def feed_until(marker: Path, proc) -> None:
        """One more file at a time until the writer parks at the kill point (checkpoints come with batches)."""
        for f in files:
            if (src / f.name).exists():
                continue
            (src / f.name.replace(".parquet", ".tmp")).write_bytes(f.read_bytes())
            (src / f.name.replace(".parquet", ".tmp")).rename(src / f.name)
            fed = ROWS * len(list(src.glob("*.parquet")))
            _wait(lambda: marker.exists() or _health(health).get("rows", 0) >= fed, proc, what=f"{fed} rows")
            deadline = time.monotonic() + 0.3  # the writer of the checkpoint those rows made due
            while time.monotonic() < deadline and not marker.exists() and proc.poll() is None:
                time.sleep(0.01)
            if marker.exists():
                return
        _wait(marker.exists, proc, what=f"checkpoint point {marker.name}")

    for point in ("delta_written", "delta_committed"):
        marker = tmp_path / f"marker-{point}"
        health.unlink(missing_ok=True)  # the killed run's is stale
        proc = _cli("serve", "--source", f"parquet:{src}", "--model", str(model), "--checkpoint-dir", str(ck),
                    "--health-file", str(health), "--health-interval", "0", "--log-json", *OPTS, *resume,
                    env={"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"{point}:{marker}"})
        feed_until(marker, proc)
        assert len(list(src.glob("*.parquet"))) < FILES, "the stream ran out before the kill point"
        _kill(proc)
        err = proc.stderr.read()
        resumed_from += [json.loads(line)["checkpoint"] for line in err.splitlines()
                         if line.startswith("{") and json.loads(line).get("event") == "resume"
                         and "checkpoint" in json.loads(line)]
        resume = ["--resume"]
    assert resumed_from and _kind(resumed_from[-1]) in ("full", "delta")
    # killed right after a delta was committed: the next run resumes from that delta
    newest = CheckpointStore(ck).load_latest()
    assert newest.link is not None and newest.link.kind == "delta"
    for f in files:
        if not (src / f.name).exists():
            (src / f.name).write_bytes(f.read_bytes())
    health.unlink(missing_ok=True)
    proc = _cli("serve", "--source", f"parquet:{src}", "--model", str(model), "--checkpoint-dir", str(ck),
                "--health-file", str(health), "--health-interval", "0", "--log-json", *OPTS, *resume)
    _wait(lambda: _health(health).get("rows", 0) >= total, proc, what="the whole stream")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    resumes = [json.loads(line) for line in err.splitlines()
               if line.startswith("{") and json.loads(line).get("event") == "resume" and "checkpoint" in line]
    assert resumes and resumes[0]["checkpoint"] == str(newest.path)
    weights, meta = _final(ck)
    assert meta["rows"] == total and meta["batches"] == ref_meta["batches"]
    assert meta["skipped_rows"] == ref_meta["skipped_rows"]
    assert sorted(weights) == sorted(ref_weights)
    for name, w in ref_weights.items():
        np.testing.assert_allclose(weights[name], w, rtol=1e-6, atol=1e-7, err_msg=name)
