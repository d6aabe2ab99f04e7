"""Incremental reader of the Arrow IPC stream format over any async byte reader (file thread or socket).

pyarrow only reads IPC streams with blocking calls; reading the framing here lets a socket be read with
anyio's own non-blocking streams, and lets a file skip record-batch bodies on seek without decoding them.
Format: each message is ``0xFFFFFFFF``, int32 metadata length, a flatbuffer ``Message``, then its body.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pyarrow as pa

__all__ = ["Undecodable", "Truncated", "IpcStreamReader", "SKIPPED"]

#: Receives 1..n bytes, ``b""`` at the end of the stream.
ReceiveFn = Callable[[int], Awaitable[bytes]]
SkipFn = Callable[[int], Awaitable[None]]

T = TypeVar("T")
_CONTINUATION = 0xFFFFFFFF
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_MAX_METADATA = 64 << 20
_MAX_BODY = 1 << 40
#: returned instead of a batch when the caller asked to skip it undecoded.
SKIPPED = object()


class Undecodable(Exception):
    """The bytes are not a valid Arrow IPC stream."""


class Truncated(Undecodable):
    """The stream ended in the middle of a message."""


def _message_header(meta: bytes) -> tuple[int, int]:
    """(header type, body length) of a flatbuffer ``Message``: union type = field 1, bodyLength = field 3."""
    size = len(meta)
    table = int.from_bytes(meta[0:4], "little")
    if table + 4 > size:
        raise Undecodable("bad IPC message metadata")
    vtable = table - int.from_bytes(meta[table:table + 4], "little", signed=True)
    if vtable < 0 or vtable + 4 > size:
        raise Undecodable("bad IPC message metadata")
    vtable_size = int.from_bytes(meta[vtable:vtable + 2], "little")

    def field(i: int) -> int:
        slot = 4 + 2 * i
        if slot + 2 > vtable_size:
            return 0  # field absent from an older, shorter vtable: default value
        return int.from_bytes(meta[vtable + slot:vtable + slot + 2], "little")

    type_at, body_at = field(1), field(3)
    if table + max(type_at + 1, body_at + 8) > size:
        raise Undecodable("bad IPC message metadata")
    kind = meta[table + type_at] if type_at else 0
    body = int.from_bytes(meta[table + body_at:table + body_at + 8], "little", signed=True) if body_at else 0
    if not 0 <= body <= _MAX_BODY:
        raise Undecodable(f"bad IPC body length {body}")
    return kind, body


class IpcStreamReader:
    """Reads one Arrow IPC stream message by message and decodes its record batches.

    Bytes received are kept in the reader until a whole message is there, so a ``next_batch`` cancelled
    while waiting for data loses nothing if ``receive`` itself loses nothing when cancelled.
    """

    def __init__(self, receive: ReceiveFn, skip: SkipFn | None = None) -> None:
        self._receive = receive
        self._skip = skip
        self._buf = bytearray()
        self.schema: pa.Schema | None = None
        self._schema_message: bytes | bytearray = b""
        self._dictionaries: list[bytes | bytearray] = []

    async def _fill(self, n: int) -> bool:
        """Buffer at least ``n`` bytes (never more: ``receive`` is asked for the shortfall only)."""
        while len(self._buf) < n:
            chunk = await self._receive(n - len(self._buf))
            if not chunk:
                return False
            self._buf += chunk
        return True

    async def next_batch(self, decode: bool = True) -> pa.RecordBatch | object | None:
        """Next record batch, ``None`` at the end, ``SKIPPED`` if ``decode`` is false (body not decoded)."""
        while True:
            if not await self._fill(8):
                if not self._buf:
                    return None  # closed at a message boundary without the end-of-stream marker: an end too
                raise Truncated("IPC stream ends inside a message header")
            marker, length = struct.unpack_from("<Ii", self._buf)
            if marker != _CONTINUATION:
                raise Undecodable("not an Arrow IPC stream (no continuation marker)")
            if length == 0:
                self._buf.clear()
                return None
            if not 0 < length <= _MAX_METADATA:
                raise Undecodable(f"bad IPC metadata length {length}")
            if not await self._fill(8 + length):
                raise Truncated(f"IPC stream ends inside a message's metadata ({len(self._buf)} bytes)")
            kind, body_length = _message_header(bytes(self._buf[8:8 + length]))
            if kind == _RECORD_BATCH and not decode and self._skip is not None:
                self._buf.clear()
                await self._skip(body_length)
                return SKIPPED
            total = 8 + length + body_length
            if not await self._fill(total):
                raise Truncated(f"IPC stream ends inside a message body ({len(self._buf)} of {total} bytes)")
            message, self._buf = self._buf, bytearray()  # handed to pyarrow without a copy
            if kind == _RECORD_BATCH:
                return self._decode_batch(message) if decode else SKIPPED
            if kind == _SCHEMA and self.schema is None:
                self.schema = _decoded(pa.ipc.read_schema, pa.py_buffer(message))
                self._schema_message = message
            elif kind == _DICTIONARY_BATCH and self.schema is not None:
                self._dictionaries.append(message)
            else:
                raise Undecodable(f"unexpected IPC message type {kind}")

    def _decode_batch(self, message: bytearray) -> pa.RecordBatch:
        if self.schema is None:
            raise Undecodable("IPC record batch before the schema")
        if not self._dictionaries:
            batch = _decoded(pa.ipc.read_record_batch, pa.py_buffer(message), self.schema)
        else:  # pyarrow cannot feed dictionary batches to a memo: replay schema + dictionaries + batch.
            stream = b"".join((self._schema_message, *self._dictionaries, message))
            batch = _decoded(lambda buf: pa.ipc.open_stream(buf).read_next_batch(), pa.py_buffer(stream))
        # offsets, indices and UTF-8 checked once here (microseconds): a corrupt buffer is never read
        _decoded(lambda: batch.validate(full=True))
        return batch


def _decoded(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except (pa.ArrowException, ValueError, StopIteration) as exc:
        raise Undecodable(f"invalid IPC message: {exc}") from exc
