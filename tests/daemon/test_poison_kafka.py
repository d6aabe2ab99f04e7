"""`streamfit serve` on Kafka with a poison message, bad input and a dead-letter topic (the real tansu broker)."""

from __future__ import annotations

import json
import signal
import socket
import urllib.request

import numpy as np
import pyarrow as pa
import pytest

from streamfit.testing import ipc_bytes
from tests.daemon.helpers import record_batches, write_model
from tests.daemon.test_serve import _final_weights, _health, _serve, _wait

pytestmark = pytest.mark.kafka


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_topic(broker, topic: str, n: int) -> list:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"read-{topic}",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = []
    try:
        while len(out) < n:
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(out)} of {n} dead letters in {topic}"
            if msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


def test_serve_quarantines_a_poison_message_to_a_dead_letter_topic(tmp_path, kafka_broker):
    good = record_batches(2, 1024)  # 16 messages of 128 rows
    y = good[5].column("y").to_numpy().copy()
    y[20] = 1e30  # one finite huge value in one cell (of the message's first batch): the loss becomes inf
    poison = good[5].set_column(good[5].schema.get_field_index("y"), "y", pa.array(y, pa.float32()))
    bad_row = good[9].slice(0, 33).to_pydict()
    bad_row["x1"][7] = float("nan")
    values = [ipc_bytes(b) for b in good[:5]] + [ipc_bytes(poison), b"not arrow at all"] \
        + [ipc_bytes(b) for b in good[6:9]] + [ipc_bytes(pa.record_batch(bad_row, schema=good[0].schema)),
                                               ipc_bytes(good[0].slice(0, 0))] + [ipc_bytes(b) for b in good[9:]]
    topic, dlq = kafka_broker.create_topic(), kafka_broker.create_topic()
    kafka_broker.produce(topic, values, partition=0)
    trained = 15 * 128 + 32 + 127  # the poison message's other 127 rows too

    model = write_model(tmp_path)
    ck, health, port = tmp_path / "ck", tmp_path / "health.json", _free_port()
    source = f"kafka://{kafka_broker.bootstrap}/{topic}?group=g-{topic}&session.timeout.ms=2000"
    proc = _serve(source, model, ck, health, ["--checkpoint-every-seconds", "0.3", "--on-bad", "skip",
                                              "--dead-letter", f"kafka://{kafka_broker.bootstrap}/{dlq}",
                                              "--metrics-port", str(port)])
    _wait(lambda: _health(health).get("rows", 0) >= trained, proc, what="training past the poison message")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]

    _, meta = _final_weights(ck)
    # not replayed forever: 2 rollbacks lowering the rate, at most 7 halving the message's rows in the batch that
    # diverged (a live stream's batches fall where the messages arrive: up to 128 rows), 1 quarantine
    assert meta["rows"] == trained and 4 <= meta["rollbacks"] <= 10
    assert meta["skipped_rows"] == {"poison": 1, "non_finite": 1}
    assert meta["skipped_messages"] == {"undecodable": 1, "empty_batch": 1}
    assert meta["poison"]["quarantined"] == []
    row = {"partitions": {"0": {"offset": 5, "row": 20}}}
    assert [(r["message"], r["row"]["partitions"]) for r in meta["poison"]["quarantined_rows"]] == [
        (f"{topic}/0/5", row["partitions"])]
    assert meta["estimator"]["state"]["trainer"]["lr_scale"] == 1.0  # restored, not 1e-23
    assert 'streamfit_messages_skipped{reason="undecodable"} 1.0' in body
    assert 'streamfit_rows_skipped{reason="poison"} 1.0' in body
    assert 'streamfit_rows_skipped{reason="non_finite"} 1.0' in body
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    [quarantine] = [e for e in events if e.get("event") == "quarantine"]
    assert [r["message"] for r in quarantine["rows_quarantined"]] == [f"{topic}/0/5"]

    letters = _read_topic(kafka_broker, dlq, 4)
    heads = [dict((k, v.decode()) for k, v in m.headers()) for m in letters]
    assert [h["streamfit.errors.reason"] for h in heads] == ["poison", "undecodable", "non_finite", "empty_batch"]
    positions = [json.loads(h["streamfit.errors.position"])["partitions"]["0"] for h in heads]
    assert positions == [{"offset": 5, "row": 20}, {"offset": 7, "row": 0}, {"offset": 10, "row": 7},
                         {"offset": 12, "row": 0}]
    rows = pa.ipc.open_stream(letters[0].value()).read_all()
    assert rows.num_rows == 1 and rows.column("y").to_numpy()[0] == np.float32(1e30)
    assert letters[1].value() == b"not arrow at all" and heads[1]["streamfit.errors.format"] == "raw"
    assert np.isnan(pa.ipc.open_stream(letters[2].value()).read_all().column("x1").to_numpy()).tolist() == [True]
    # messages without rows are named by the source: the position is the one after them
    assert [(h.get("streamfit.errors.source.partition"), h.get("streamfit.errors.source.offset")) for h in heads] \
        == [("0", None), ("0", "6"), ("0", None), ("0", "11")]
    assert heads[0]["streamfit.errors.source.message"] == f"{topic}/0/5"
