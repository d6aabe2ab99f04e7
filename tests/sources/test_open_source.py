from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from streamfit.sources import (IpcSource, IpcTcpSource, KafkaSource, MemorySource, ParquetSource,
                               csv_decoder, json_lines_decoder, open_source)

pytestmark = pytest.mark.anyio


def test_uris_and_objects_map_to_sources(tmp_path) -> None:
    table = pa.table({"id": [1]})
    memory = MemorySource([table])
    assert open_source(memory) is memory
    assert isinstance(open_source(table), MemorySource)
    assert isinstance(open_source(table.to_batches()), MemorySource)
    assert isinstance(open_source(pa.RecordBatchReader.from_batches(table.schema, [])), MemorySource)
    parquet = open_source(f"parquet:{tmp_path}?follow=1&batch_size=128&columns=a,b&poll_interval=0.5")
    assert isinstance(parquet, ParquetSource)
    assert (parquet.follow, parquet.batch_size, parquet.columns, parquet.poll_interval) == \
        (True, 128, ["a", "b"], 0.5)
    assert isinstance(open_source(str(tmp_path / "x.parquet")), ParquetSource)
    assert isinstance(open_source(Path(tmp_path / "x.parquet"), columns=["id"]), ParquetSource)
    assert isinstance(open_source(f"ipc:{tmp_path}/x.arrows"), IpcSource)
    assert isinstance(open_source("ipc:-"), IpcSource)
    assert isinstance(open_source(tmp_path / "x.arrow"), IpcSource)
    tcp = open_source("ipc+tcp://127.0.0.1:0?max_connections=2")
    assert isinstance(tcp, IpcTcpSource) and (tcp.host, tcp.max_connections) == ("127.0.0.1", 2)
    kafka = open_source("kafka://127.0.0.1:9092,127.0.0.1:9093/events?group=g&max_messages=10"
                        "&fetch.wait.max.ms=10", config={"client.id": "me"}, poll_timeout=0.5)
    assert isinstance(kafka, KafkaSource)
    assert (kafka.topic, kafka.group, kafka.max_messages, kafka.poll_timeout) == ("events", "g", 10, 0.5)
    assert kafka.config["bootstrap.servers"] == "127.0.0.1:9092,127.0.0.1:9093"
    assert (kafka.config["fetch.wait.max.ms"], kafka.config["client.id"]) == ("10", "me")
    assert kafka.fetch_ahead == 1 and open_source("kafka://h:1/t?group=g&fetch_ahead=0").fetch_ahead == 0
    assert kafka.config["fetch.queue.backoff.ms"] == 10  # librdkafka's 1000 ms would stall a slow trainer
    assert open_source("kafka://h:1/t?group=g&fetch.queue.backoff.ms=500").config["fetch.queue.backoff.ms"] == "500"


@pytest.mark.parametrize("uri, match", [
    ("s3://bucket/x", "supported: parquet:PATH"),
    ("data.csv", "ipc\\+tcp://HOST:PORT"),
    ("kafka://127.0.0.1:9092/topic", "group=NAME"),
    ("kafka://127.0.0.1:9092/topic?group=g&bogus=1", "Unknown kafka URI option 'bogus'"),
    ("parquet:/x?follow=maybe", "Invalid parquet URI option follow"),
    ("ipc+tcp://127.0.0.1", "expected ipc\\+tcp://HOST:PORT"),
])
def test_bad_uris_say_what_is_supported(uri: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        open_source(uri)


def test_bad_objects() -> None:
    with pytest.raises(TypeError, match="cannot make a source from int"):
        open_source(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options"):
        open_source(MemorySource([]), batch_size=3)
    with pytest.raises(ValueError, match="enable.auto.commit"):
        open_source("kafka://127.0.0.1:9092/t?group=g&enable.auto.commit=true")


def test_text_decoders() -> None:
    schema = pa.schema([("id", pa.int64()), ("x", pa.float32())])
    batch = json_lines_decoder(schema)(b'{"id": 1, "x": 2, "extra": 0}\n{"id": 2, "x": 0.5}\n')
    assert batch.schema == schema and batch.num_rows == 2
    assert csv_decoder(schema)(b"id,x\n1,2.5\n3,4\n").to_pydict() == {"id": [1, 3], "x": [2.5, 4.0]}
    assert csv_decoder(schema, header=False)(b"7,1\n").to_pydict() == {"id": [7], "x": [1.0]}
    with pytest.raises(ValueError, match="Unknown decoder"):
        KafkaSource("127.0.0.1:1", "t", group="g", decoder="xml")
