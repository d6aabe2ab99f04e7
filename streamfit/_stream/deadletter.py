"""Dead-letter sinks: input dropped by policy (bad rows, bad or empty messages, poison messages) is kept,
with its position and reason, in a JSON-lines file or a Kafka topic, instead of vanishing.

Each record carries the dropped rows as an Arrow IPC stream (or the raw bytes of a message that could
not be decoded), so nothing is lost and the rows can be replayed once fixed.  Records are buffered and
written by :meth:`DeadLetterSink.sync`, which a checkpointing run calls *before* it writes the checkpoint
that moves past them: a checkpoint never covers a dead letter that is not durable.

Guarantees across a crash: the file sink is exactly-once (a resumed run truncates the file to the
length its checkpoint recorded, then writes again what came after); the Kafka sink is at-least-once
(records synced for a checkpoint that never became durable are produced again after the restart; the
``streamfit.errors.position`` header and the message key identify them).
"""

from __future__ import annotations

import abc
import base64
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

import pyarrow as pa

from streamfit.exceptions import SourceError
from streamfit.sources._base import Position
from streamfit._stream.skips import Skipped

__all__ = ["DeadLetter", "DeadLetterSink", "JsonLinesDeadLetter", "KafkaDeadLetter", "open_dead_letter",
           "read_dead_letters"]

logger = logging.getLogger("streamfit.stream")

#: records buffered before a sink that is not held by a checkpointing run writes them out.
_AUTOSYNC_RECORDS = 1000


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter: why (``reason``, ``error``), where (``position`` of its first row, ``where``,
    ``column``), how much (``rows``; ``message`` = a whole message) and the data: ``payload`` in
    ``format`` ``"arrow_ipc"`` (the dropped rows) or ``"raw"`` (the undecodable bytes), or ``None``.

    Attributes
    ----------
    reason, error
        Why: the skip's reason (``"null"``, ``"undecodable"``, ``"poison"``...) and its message.
    rows, message
        How many rows, and whether they are a whole message.
    position, where, column
        The source position of its first row (after it for a message without rows), a readable place, the
        column at fault (if one is).
    format, payload
        ``"arrow_ipc"`` (``payload`` is the dropped rows as an Arrow IPC stream), ``"raw"`` (the undecodable
        bytes) or None (no payload).
    source
        What the source said of the message (Kafka: partition, offset, key, timestamp), if anything.
    """

    reason: str
    rows: int
    message: bool
    position: Position
    where: str
    column: str | None
    error: str
    format: str | None
    payload: bytes | None
    source: Mapping[str, Any] | None = None  # the source's name of the message (Kafka partition, offset)

    @classmethod
    def from_skipped(cls, s: Skipped) -> "DeadLetter":
        """The dead letter of a skip: its rows as an Arrow IPC payload, or the undecodable bytes.

        Parameters
        ----------
        s
            The :class:`~streamfit.Skipped` input.
        """
        batch = s.row_batch()
        if batch is not None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            fmt, payload = "arrow_ipc", sink.getvalue().to_pybytes()
        elif s.raw is not None:
            fmt, payload = "raw", bytes(s.raw)
        else:
            fmt, payload = None, None
        source = {k: v for k, v in s.source.items() if isinstance(v, (str, int, float, bool))}
        return cls(s.reason, s.rows, s.message, dict(s.position), s.where, s.column, s.text, fmt, payload,
                   source or None)

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "rows": self.rows, "message": self.message, "position": self.position,
                "where": self.where, "column": self.column, "error": self.error, "format": self.format,
                "source": self.source,
                "payload": None if self.payload is None else base64.b64encode(self.payload).decode("ascii")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "DeadLetter":
        """A dead letter from its JSON form (:meth:`to_json`, a line of a JSON-lines sink).

        Parameters
        ----------
        data
            The decoded JSON object.
        """
        payload = data.get("payload")
        return cls(data["reason"], int(data["rows"]), bool(data["message"]), data["position"], data["where"],
                   data.get("column"), data.get("error", ""), data.get("format"),
                   None if payload is None else base64.b64decode(payload), data.get("source"))

    def table(self) -> pa.Table | None:
        """The dropped rows (``format == "arrow_ipc"``), else None."""
        if self.format != "arrow_ipc" or self.payload is None:
            return None
        return pa.ipc.open_stream(pa.py_buffer(self.payload)).read_all()


class DeadLetterSink(abc.ABC):
    """Where skipped input goes.  ``write`` buffers; ``sync`` makes everything written durable and returns
    the sink's state for a checkpoint; ``rewind`` forgets records written after a mark (a rollback);
    ``restore`` aligns the sink with a checkpoint's state on resume.

    ``hold=True`` (set by a checkpointing run): records wait for ``sync``; otherwise the sink writes them
    out on its own every ``_AUTOSYNC_RECORDS`` records.
    """

    def __init__(self) -> None:
        self._buffer: list[DeadLetter] = []
        self.records = 0  # records written so far (durable: records - len(buffer))
        self.hold = False

    def write(self, skips: Iterable[Skipped]) -> None:
        """Buffer a dead letter of each skip (written out by :meth:`sync`, or on its own when not held).

        Parameters
        ----------
        skips
            :class:`~streamfit.Skipped` input, in stream order.
        """
        for s in skips:
            self._buffer.append(DeadLetter.from_skipped(s))
            self.records += 1
        if not self.hold and len(self._buffer) >= _AUTOSYNC_RECORDS:
            self.sync()

    def mark(self) -> int:
        """A point to :meth:`rewind` to."""
        return self.records

    def rewind(self, mark: int) -> None:
        """Forget the records written after ``mark`` (they are not durable yet).

        Parameters
        ----------
        mark
            What :meth:`mark` returned.
        """
        drop = self.records - mark
        if drop > len(self._buffer):
            raise RuntimeError(f"cannot rewind the dead-letter sink to record {mark}: records up to "
                               f"{self.records - len(self._buffer)} are already written")
        if drop > 0:
            del self._buffer[len(self._buffer) - drop:]
            self.records = mark

    def sync(self) -> dict[str, Any]:
        """Write every buffered record durably; the sink's state, for the checkpoint that covers them."""
        if self._buffer:
            self._flush(self._buffer)
            self._buffer = []
        return self.state()

    @abc.abstractmethod
    def _flush(self, records: list[DeadLetter]) -> None:
        """Write ``records`` durably (fsync, broker acknowledgement)."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """JSON-able state of the durable part (saved in checkpoints)."""

    def restore(self, state: Mapping[str, Any] | None) -> None:
        """On resume: continue from a checkpoint's :meth:`state` (``None``: a fresh run).

        Parameters
        ----------
        state
            A checkpoint's :meth:`state` of this sink, or None.
        """
        if state:
            self.records = int(state.get("records", 0))

    def close(self) -> None:
        self.sync()


class JsonLinesDeadLetter(DeadLetterSink):
    """Dead letters appended to a file, one JSON object per line (rows as base64 Arrow IPC stream bytes).

    Exactly-once across crashes with a checkpointing run: :meth:`restore` truncates the file to the
    length the checkpoint recorded (what came later is written again by the resumed run).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"dead-letter path {str(self.path)!r} is a directory, expected a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._size = self.path.stat().st_size if self.path.exists() else 0

    def _flush(self, records: list[DeadLetter]) -> None:
        data = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in records).encode()
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            self._size = f.tell()

    def state(self) -> dict[str, Any]:
        return {"kind": "file", "path": str(self.path), "records": self.records - len(self._buffer),
                "bytes": self._size}

    def restore(self, state: Mapping[str, Any] | None) -> None:
        super().restore(state)
        if not state or state.get("kind") != "file" or "bytes" not in state:
            return
        size = int(state["bytes"])
        current = self.path.stat().st_size if self.path.exists() else 0
        if current > size:
            with open(self.path, "r+b") as f:
                f.truncate(size)
                f.flush()
                os.fsync(f.fileno())
            logger.info("dead-letter file %s: dropped %d bytes written after the checkpoint (they are written "
                        "again as the stream is replayed)", self.path, current - size)
        elif current < size:
            logger.warning("dead-letter file %s is shorter (%d bytes) than the checkpoint recorded (%d): records "
                           "were lost outside streamfit", self.path, current, size)
        self._size = min(current, size)


class KafkaDeadLetter(DeadLetterSink):
    """Dead letters produced to a Kafka topic, as Kafka Connect's ``errors.deadletterqueue`` does: the value
    is the dropped rows (Arrow IPC stream bytes) or the raw message, the headers say why and where
    (``streamfit.errors.reason``, ``.position`` (JSON), ``.where``, ``.column``, ``.message``, ``.rows``,
    ``.format``, and ``.source.partition``/``.source.offset`` etc. when the source names the message).  ``sync`` waits for the broker's acknowledgement of every record (``acks=all``).
    At-least-once across crashes (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, topic: str, *, config: Mapping[str, Any] | None = None,
                 timeout: float = 30.0) -> None:
        super().__init__()
        try:
            import confluent_kafka
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("a Kafka dead-letter topic needs confluent-kafka: pip install 'streamfit[kafka]'") \
                from exc
        if not topic:
            raise ValueError("kafka dead-letter sink: no topic given, expected kafka://HOST:PORT/topic")
        self._kafka = confluent_kafka
        self.topic, self.timeout = topic, timeout
        conf = {"bootstrap.servers": bootstrap_servers, "acks": "all", "linger.ms": 0}
        conf.update(config or {})
        self._producer = confluent_kafka.Producer(conf, logger=logging.getLogger("streamfit.sources.librdkafka"))
        self._produced = 0

    def _flush(self, records: list[DeadLetter]) -> None:
        errors: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for r in records:
            position = json.dumps(r.position, sort_keys=True, default=str)
            headers: list[tuple[str, str | bytes | None]] = [("streamfit.errors.reason", r.reason), ("streamfit.errors.position", position),
                       ("streamfit.errors.where", r.where), ("streamfit.errors.column", r.column or ""),
                       ("streamfit.errors.message", r.error), ("streamfit.errors.rows", str(r.rows)),
                       ("streamfit.errors.format", r.format or "")]
            headers += [(f"streamfit.errors.source.{k}", str(v)) for k, v in (r.source or {}).items()]
            key = f"{r.reason}:{position}".encode()
            while True:
                try:
                    self._producer.produce(self.topic, value=r.payload, key=key, headers=headers,
                                           on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    self._producer.poll(0.1)
        left = self._producer.flush(self.timeout)
        if left or errors:
            raise SourceError(f"dead-letter topic {self.topic!r}: {left} record(s) not acknowledged in "
                              f"{self.timeout:g} s" + (f"; delivery failed: {errors[0]}" if errors else ""))
        self._produced += len(records)

    def state(self) -> dict[str, Any]:
        return {"kind": "kafka", "topic": self.topic, "records": self.records - len(self._buffer)}

    def close(self) -> None:
        self.sync()


def open_dead_letter(spec: str | os.PathLike[str]) -> DeadLetterSink:
    """A sink from ``kafka://HOST:PORT/topic`` or a file path (JSON lines).

    Parameters
    ----------
    spec
        ``kafka://HOST:PORT/topic`` (each record a message of that topic), or a file path, optionally
        ``file:PATH`` (JSON lines, appended to).
    """
    text = os.fspath(spec)
    if text.startswith("kafka://"):
        url = urlsplit(text)
        return KafkaDeadLetter(url.netloc, url.path.lstrip("/"))
    if text.startswith("file:"):
        text = text[len("file:"):]
    return JsonLinesDeadLetter(text)


def read_dead_letters(path: str | os.PathLike[str]) -> list[DeadLetter]:
    """The records of a JSON-lines dead-letter file.

    Parameters
    ----------
    path
        A file a JSON-lines sink wrote (``dead_letter=PATH``, ``--dead-letter PATH``).

    Examples
    --------
    >>> import os, tempfile, pyarrow as pa
    >>> from sklearn.linear_model import SGDRegressor
    >>> from streamfit import train_stream_sync
    >>> path = os.path.join(tempfile.mkdtemp(), "dead.jsonl")
    >>> table = pa.table({"x": [1.0, None, 3.0, 4.0], "y": [1.0, 2.0, 3.0, 4.0]})
    >>> train_stream_sync(SGDRegressor(), table, batch_size=2, dead_letter=path).skipped_rows
    {'null': 1}
    >>> [(d.reason, d.rows, d.column, d.position, d.format) for d in read_dead_letters(path)]
    [('null', 1, 'x', {'batch': 0, 'row': 1}, 'arrow_ipc')]
    """
    with open(path, "rb") as f:
        return [DeadLetter.from_json(json.loads(line)) for line in f if line.strip()]
