"""`streamfit serve` as a real process: SIGKILL at several points, restart with --resume, same weights.

The reference is an uninterrupted `streamfit train` over the same rows; every interrupted run must end
with the same weights (float noise only) and exactly the stream's row count.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from streamfit.checkpoint import CheckpointStore
from tests.daemon.helpers import read_health as _health
from tests.daemon.helpers import record_batches, write_model, write_stream
from tests.daemon.helpers import run_cli as _cli
from tests.daemon.helpers import wait_for as _wait

FILES, ROWS = 4, 2048  # 8192 rows, 256 batches of 32
TRAIN_OPTS = ["--batch-size", "32", "--optimizer", "adam", "--learning-rate", "constant", "--eta0", "0.005",
              "--penalty", "none", "--threads", "1", "--no-progress"]


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def _final_weights(ck: Path) -> tuple[dict, dict]:
    ckpt = CheckpointStore(ck).load_latest()
    weights = {k: v for k, v in ckpt.arrays.items() if k.startswith("trainer/weights/")}
    return weights, ckpt.meta


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    data, total = write_stream(root, FILES, ROWS)
    model = write_model(root)
    proc = _cli("train", "--source", f"parquet:{data}", "--model", str(model), "--checkpoint-dir",
                str(root / "ck"), *TRAIN_OPTS)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    weights, meta = _final_weights(root / "ck")
    assert meta["rows"] == total
    return weights, total


def _serve(source: str, model: Path, ck: Path, health: Path, extra=(), env=None) -> subprocess.Popen:
    return _cli("serve", "--source", source, "--model", str(model), "--checkpoint-dir", str(ck),
                "--checkpoint-every-batches", "8", "--health-file", str(health), "--health-interval", "0",
                "--log-json", *TRAIN_OPTS, *extra, env=env)


def _interrupted_run(tmp_path: Path, source: str, total: int, kill_points: list[str]) -> tuple[dict, dict, str]:
    model = write_model(tmp_path)
    ck, health = tmp_path / "ck", tmp_path / "health.json"
    resume: list[str] = []
    for point in kill_points:
        if point == "step":  # somewhere in the middle of training
            proc = _serve(source, model, ck, health, resume)
            start = _health(health).get("rows", 0)
            _wait(lambda: _health(health).get("rows", 0) >= start + 320, proc, what="training progress")
        else:  # a named point of the checkpoint write (the writer thread parks there)
            marker = tmp_path / f"marker-{point}"
            env = {"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"{point}:{marker}"}
            proc = _serve(source, model, ck, health, resume, env=env)
            _wait(marker.exists, proc, what=f"checkpoint point {point}")
        _kill(proc)
        resume = ["--resume"]
    proc = _serve(source, model, ck, health, resume)
    _wait(lambda: _health(health).get("rows", 0) >= total, proc, what="the whole stream")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    weights, meta = _final_weights(ck)
    return weights, meta, err


def _assert_same(weights: dict, reference: dict) -> None:
    assert sorted(weights) == sorted(reference)
    for name, w in reference.items():
        np.testing.assert_allclose(weights[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_sigterm_writes_a_final_checkpoint_and_exits_0(tmp_path):
    data, total = write_stream(tmp_path, 1, 1024)
    model = write_model(tmp_path)
    health = tmp_path / "health.json"
    proc = _serve(f"parquet:{data}", model, tmp_path / "ck", health, ["--checkpoint-every-batches", "1000"])
    _wait(lambda: _health(health).get("rows", 0) >= total, proc, what="the stream")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    _, meta = _final_weights(tmp_path / "ck")
    assert meta["rows"] == total
    events = [json.loads(line).get("event") for line in err.splitlines() if line.startswith("{")]
    assert events[0] == "start" and "checkpoint" in events and events[-1] == "shutdown"


def test_parquet_kills_at_several_points_resume_exactly(tmp_path, reference):
    ref_weights, total = reference
    data, _ = write_stream(tmp_path, FILES, ROWS)
    weights, meta, err = _interrupted_run(tmp_path, f"parquet:{data}", total,
                                          ["step", "files_written", "step", "renamed"])
    assert meta["rows"] == total and meta["batches"] == total // 32
    _assert_same(weights, ref_weights)
    assert '"event": "resume"' in err


@pytest.mark.kafka
def test_kafka_kills_resume_exactly_and_commit_offsets(tmp_path, reference, kafka_broker):
    ref_weights, total = reference
    topic = kafka_broker.create_topic(partitions=1)  # one partition: a deterministic order to compare with
    kafka_broker.produce_batches(topic, record_batches(FILES, ROWS), partition=0)
    source = f"kafka://{kafka_broker.bootstrap}/{topic}?group=g-{topic}&session.timeout.ms=2000"
    weights, meta, err = _interrupted_run(tmp_path, source, total, ["step", "files_written", "step"])
    assert meta["rows"] == total
    _assert_same(weights, ref_weights)
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": f"g-{topic}"})
    try:
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()
    assert committed == len(record_batches(FILES, ROWS))  # every message committed, after the final checkpoint


def test_second_signal_exits_at_once(tmp_path):
    data, total = write_stream(tmp_path, 1, 1024)
    model = write_model(tmp_path)
    health = tmp_path / "health.json"
    marker = tmp_path / "marker"
    # the final checkpoint write parks in the writer thread: only a second signal can end the process
    proc = _serve(f"parquet:{data}", model, tmp_path / "ck", health, ["--checkpoint-every-batches", "100000"],
                  env={"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"files_written:{marker}"})
    _wait(lambda: _health(health).get("rows", 0) >= total, proc, what="the stream")
    proc.send_signal(signal.SIGTERM)
    _wait(marker.exists, proc, what="the final checkpoint write")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM
