"""Skipped input: empty and schema-only messages counted (or raised), counts and dead letters settled with
the batch whose position passes them, and the dead-letter sinks (JSON lines; Kafka in tests/daemon)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from sklearn.linear_model import SGDRegressor

from streamfit._stream import Rebatcher, train_stream_sync
from streamfit._columns.plan import ColumnPlan
from streamfit._stream.deadletter import JsonLinesDeadLetter, read_dead_letters
from streamfit.exceptions import BadInputError
from streamfit.sources import IpcSource, KafkaSource
from streamfit.sources._base import SourceBatch
from streamfit.testing import ipc_bytes


def _batch(start: int, n: int, bad: tuple[int, ...] = ()) -> pa.RecordBatch:
    x = np.arange(start, start + n, dtype=np.float32)
    x[list(bad)] = np.nan
    return pa.record_batch({"x": x, "y": np.arange(start, start + n, dtype=np.float32) * 2})


def _sb(batch: pa.RecordBatch, index: int) -> SourceBatch:
    return SourceBatch(batch, lambda r: {"batch": index, "row": r}, where=f"batch {index}")


def test_skips_travel_with_the_batch_whose_position_passes_them():
    rb = Rebatcher(4, ColumnPlan(), on_bad="skip")
    out = list(rb.push(_sb(_batch(0, 12, bad=(1, 6, 9, 11)), 0)))  # good rows 0,2,3,4 | 5,7,8,10 | -
    assert [b.position for b in out] == [{"batch": 0, "row": 5}, {"batch": 0, "row": 11}]
    assert [[(s.reason, s.rows, s.position) for s in b.skipped] for b in out] == [
        [("non_finite", 1, {"batch": 0, "row": 1})], [("non_finite", 2, {"batch": 0, "row": 6})]]
    assert rb.skipped_rows == {"non_finite": 4}  # read: all four; settled so far: three
    out = list(rb.push(SourceBatch(None, lambda r: {"batch": 2, "row": 0}, where="batch 1",
                                   error=BadInputError("garbage", reason="undecodable"), raw=b"\x00garbage")))
    assert out == []
    out = list(rb.push(_sb(_batch(10, 4), 2)))
    [b] = out  # row 9 of batch 0 and the undecodable message are behind this batch's position
    assert [(s.reason, s.rows, s.message) for s in b.skipped] == [("non_finite", 1, False), ("undecodable", 0, True)]
    assert b.skipped[1].raw == b"\x00garbage"
    list(rb.flush())
    assert rb.end_skipped == ()


def test_trailing_skips_are_settled_at_the_end_and_go_to_the_dead_letter_file(tmp_path):
    from streamfit.sources.memory import MemorySource

    table = pa.Table.from_batches([_batch(0, 64, bad=(3,)), _batch(64, 64, bad=(100 - 64, 127 - 64))])
    path = tmp_path / "dead.jsonl"
    summary = train_stream_sync(SGDRegressor(), MemorySource(table), batch_size=16, on_bad="skip",
                                dead_letter=str(path))
    assert summary.skipped_rows == {"non_finite": 3} and summary.rows == 125
    letters = read_dead_letters(path)
    assert [(d.reason, d.rows, d.position, d.column) for d in letters] == [
        ("non_finite", 1, {"batch": 0, "row": 3}, "x"), ("non_finite", 1, {"batch": 1, "row": 36}, "x"),
        ("non_finite", 1, {"batch": 1, "row": 63}, "x")]  # the last one after the last trained row
    assert letters[2].table().column("y").to_pylist() == [254.0]


def test_json_lines_sink_rewinds_and_restores_to_a_checkpoint(tmp_path):
    from streamfit._stream.skips import Skipped

    def skip(i):
        return Skipped("null", 1, False, {"row": i}, f"row {i}", "x", "null", batch=_batch(i, 1))

    sink = JsonLinesDeadLetter(tmp_path / "d.jsonl")
    sink.hold = True
    sink.write([skip(0), skip(1)])
    state = sink.sync()
    assert state["records"] == 2
    mark = sink.mark()
    sink.write([skip(2)])
    sink.rewind(mark)  # a rollback: record 2 will be written again by the replay
    sink.write([skip(2), skip(3)])
    sink.sync()
    assert [d.position["row"] for d in read_dead_letters(tmp_path / "d.jsonl")] == [0, 1, 2, 3]
    again = JsonLinesDeadLetter(tmp_path / "d.jsonl")  # a resumed process at the first checkpoint
    again.restore(state)
    assert [d.position["row"] for d in read_dead_letters(tmp_path / "d.jsonl")] == [0, 1]
    with pytest.raises(RuntimeError, match="already written"):
        again.rewind(0)


def test_empty_ipc_record_batches_are_counted_or_raised(tmp_path):
    path = tmp_path / "s.arrows"
    empty = _batch(0, 0)
    with pa.ipc.new_stream(str(path), empty.schema) as w:
        for b in (_batch(0, 8), empty, _batch(8, 8)):
            w.write_batch(b)
    events = []
    summary = train_stream_sync(SGDRegressor(), IpcSource(str(path)), batch_size=4, on_bad="skip",
                                on_metrics=events.append)
    assert summary.rows == 16 and summary.skipped_messages == {"empty_batch": 1}
    # metric events carry the counts behind their position: the empty batch is behind batch 3 (rows 8..11)
    assert [e.skipped_messages for e in events] == [{}, {"empty_batch": 1}, {"empty_batch": 1}]
    with pytest.raises(BadInputError, match="empty record batch") as info:
        train_stream_sync(SGDRegressor(), IpcSource(str(path)), batch_size=4, on_bad="raise")
    assert info.value.reason == "empty_batch" and info.value.position == {"batch": 2, "row": 0}


@pytest.mark.kafka
def test_schema_only_kafka_messages_are_counted_or_raised(kafka_broker):
    topic = kafka_broker.create_topic()
    schema_only = pa.BufferOutputStream()
    with pa.ipc.new_stream(schema_only, _batch(0, 1).schema):
        pass  # a stream with a schema and no batch
    kafka_broker.produce(topic, [ipc_bytes(_batch(0, 8)), schema_only.getvalue().to_pybytes(),
                                 ipc_bytes(_batch(0, 0)), ipc_bytes(_batch(8, 8))], partition=0)

    def source(group):
        return KafkaSource(kafka_broker.bootstrap, topic, group=group, config=kafka_broker.consumer_config)

    summary = train_stream_sync(SGDRegressor(), source("g-skip"), batch_size=4, on_bad="skip", max_rows=16)
    assert summary.rows == 16 and summary.skipped_messages == {"empty_batch": 2}
    with pytest.raises(BadInputError, match="empty record batch") as info:
        train_stream_sync(SGDRegressor(), source("g-raise"), batch_size=4, on_bad="raise", max_rows=16)
    assert info.value.position["partitions"]["0"] == {"offset": 2, "row": 0}
