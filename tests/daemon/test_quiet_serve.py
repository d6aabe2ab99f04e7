"""`streamfit serve` on a live Kafka topic that goes quiet (the real broker, a real process): time drives the
checkpoints, publishing, offset commits and the health file, and a partial batch is trained after
``--max-batch-wait`` and resumed exactly after a kill."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from streamfit.checkpoint import CheckpointStore
from tests.daemon.helpers import read_health, record_batches, run_cli, wait_for, write_model
from tests.kafka_group import committed_offset

pytestmark = pytest.mark.kafka

BATCH = 256
OPTS = ["--batch-size", str(BATCH), "--optimizer", "adam", "--learning-rate", "constant", "--eta0", "0.005",
        "--penalty", "none", "--threads", "1", "--no-progress", "--log-json"]


def _serve(broker, topic: str, tmp_path: Path, *extra: str):
    source = f"kafka://{broker.bootstrap}/{topic}?group=g-{topic}&session.timeout.ms=2000"
    return run_cli("serve", "--source", source, "--model", str(write_model(tmp_path)), "--checkpoint-dir",
                   str(tmp_path / "ck"), "--health-file", str(tmp_path / "health.json"), *OPTS, *extra)


def _events(err: str, name: str) -> list[dict]:
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == name]


def test_a_quiet_daemon_checkpoints_publishes_and_commits_its_last_row(tmp_path, kafka_broker):
    topic = kafka_broker.create_topic(partitions=1)
    messages = record_batches(1, 640)  # 5 messages of 128 rows: two full batches of 256, 128 rows left over
    kafka_broker.produce_batches(topic, messages, partition=0)
    health, published = tmp_path / "health.json", tmp_path / "published.onnx"
    # the serve default of --max-batch-wait trains the 128 rows; checkpoints and publications every second
    proc = _serve(kafka_broker, topic, tmp_path, "--checkpoint-every-seconds", "1", "--publish", str(published),
                  "--publish-every", "1", "--health-interval", "0.1")

    def settled() -> bool:
        h = read_health(health)
        return (h.get("rows") == 640 and h.get("checkpoint_rows") == 640 and h.get("idle") is True
                and committed_offset(kafka_broker, topic, f"g-{topic}") == len(messages))

    wait_for(settled, proc, timeout=240, what="the last row checkpointed and committed while the topic is quiet")
    newest = CheckpointStore(tmp_path / "ck").load_latest()
    assert newest is not None and newest.meta["rows"] == 640
    assert read_health(health)["last_checkpoint"] == str(newest.path)
    wait_for(lambda: published.is_file() and published.read_bytes() == newest.model_bytes, proc, timeout=60,
             what="the newest checkpoint's model published")
    h = read_health(health)
    assert h["idle"] is True and h["last_batch_at"] <= h["idle_since"] <= h["updated_at"]
    # quiet for longer than two checkpoint periods (paced by the daemon's own health updates): nothing new, no
    # new checkpoint; the final one at SIGTERM is skipped too (it would hold nothing new)
    quiet_from = h["updated_at"]
    wait_for(lambda: read_health(health).get("updated_at", 0) > quiet_from + 2.5, proc, what="a quiet spell")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    steps = [e["step"] for e in _events(err, "checkpoint")]
    # one checkpoint per step at most (batches 256, 256, 128, unless the broker paused longer than the wait)
    assert steps == sorted(set(steps)) and steps[-1] == newest.meta["batches"], steps
    assert CheckpointStore(tmp_path / "ck").load_latest().path == newest.path


def test_a_partial_batch_is_trained_after_the_wait_and_a_kill_after_it_resumes_exactly(tmp_path, kafka_broker):
    topic = kafka_broker.create_topic(partitions=1)
    messages = record_batches(1, 500, seed=3)  # 128, 128, 128, 116 rows
    first, rest = messages[:1], messages[1:]
    kafka_broker.produce_batches(topic, first, partition=0)
    health = tmp_path / "health.json"
    wait = ["--max-batch-wait", "0.3", "--checkpoint-every-seconds", "0.5", "--health-interval", "0"]
    proc = _serve(kafka_broker, topic, tmp_path, *wait)
    # 128 rows, half a batch: trained while the source stays open, then checkpointed
    wait_for(lambda: read_health(health).get("checkpoint_rows") == 128, proc, timeout=240,
             what="the partial batch trained and checkpointed")
    assert read_health(health)["rows"] == 128 and read_health(health)["batches"] == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    kafka_broker.produce_batches(topic, rest, partition=0)
    proc = _serve(kafka_broker, topic, tmp_path, *wait, "--resume")
    wait_for(lambda: read_health(health).get("checkpoint_rows") == 500, proc, timeout=240,
             what="the rest of the topic trained and checkpointed")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    (resumed,) = [e for e in _events(err, "resume") if "rows" in e]
    assert resumed["rows"] == 128 and resumed["batches"] == 1
    meta = CheckpointStore(tmp_path / "ck").load_latest().meta
    # every row once: 128 before the kill (one partial batch), 372 after it (a full batch and a partial one,
    # unless the broker paused longer than the wait in between)
    assert meta["rows"] == 500 and meta["batches"] >= 3
    assert meta["position"]["partitions"] == {"0": {"offset": 4, "row": 0}}
    assert committed_offset(kafka_broker, topic, f"g-{topic}") == len(messages)
