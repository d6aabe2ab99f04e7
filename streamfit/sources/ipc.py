"""Arrow IPC sources: a file or stdin (:class:`IpcSource`), a TCP port (:class:`IpcTcpSource`)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, cast

import anyio
import pyarrow as pa
from anyio.abc import SocketAttribute, SocketListener, SocketStream

from streamfit.exceptions import BadInputError, SourceError
from streamfit.sources._base import Position, Source, SourceBatch, position_int
from streamfit.sources._ipc_framing import SKIPPED, IpcStreamReader, Truncated, Undecodable

__all__ = ["IpcSource", "IpcTcpSource"]

_FORMAT = '{"batch": int, "row": int}'
_FILE_MAGIC = b"ARROW1"


def _read_some(f: BinaryIO, n: int) -> bytes:
    return f.read(n) or b""


class IpcSource(Source):
    """Arrow IPC from a file path, ``"-"`` (stdin) or a binary file object.

    Files in the IPC *stream* format are read message by message; files in the IPC *file* format
    (``ARROW1`` magic, a.k.a. Feather v2) are read by random access.  Position ``{"batch": i, "row": r}``:
    record batch ``i`` has its first ``r`` rows consumed.  Only a source opened from a path can
    :meth:`seek`: stdin and file objects cannot be replayed.  Bytes that are not Arrow IPC raise
    :class:`~streamfit.exceptions.SourceError` (a broken file cannot be skipped over).  Files are read
    in a worker thread, a pipe on stdin by waiting for it to be readable, so cancelling ``__anext__``
    never loses data: a file read finishes first, a pipe keeps what was received.

    Parameters
    ----------
    source
        A path of an IPC stream or file, ``"-"`` for stdin, or a binary file object opened for reading.

    Examples
    --------
    >>> import os, tempfile, anyio, pyarrow as pa
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.arrows")
    >>> table = pa.table({"x": [1.0] * 200})
    >>> with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, table.schema) as writer:
    ...     for batch in table.to_batches(max_chunksize=80):
    ...         writer.write_batch(batch)
    >>> async def main():
    ...     async with IpcSource(path) as source:
    ...         return [(b.num_rows, b.position_at(b.num_rows)) async for b in source]
    >>> anyio.run(main)
    [(80, {'batch': 0, 'row': 80}), (80, {'batch': 1, 'row': 80}), (40, {'batch': 2, 'row': 40})]
    """

    def __init__(self, source: str | os.PathLike[str] | BinaryIO) -> None:
        self._stdin = isinstance(source, (str, os.PathLike)) and os.fspath(source) == "-"
        if isinstance(source, (str, os.PathLike)):
            self._path = None if self._stdin else os.fspath(source)
            self._file: Any = None
        elif callable(getattr(source, "read", None)):
            self._path, self._file = None, source
        else:
            raise TypeError(f"IpcSource expects a path, '-' or a binary file object, "
                            f"got {type(source).__name__}")
        self._name = "stdin" if self._stdin else self._path or repr(source)
        self._reader: IpcStreamReader | None = None
        self._random: pa.ipc.RecordBatchFileReader | None = None
        self._shield = True  # reads in worker threads finish before a cancellation is let through
        self._index = -1
        self._start_batch = self._start_row = 0
        self._schema_only_sent = False

    def seek(self, position: Position) -> None:
        """Resume at ``{"batch": i, "row": r}``; batches before ``i`` are skipped without decoding.

        Parameters
        ----------
        position
            ``{"batch": i, "row": r}``.
        """
        if self._path is None:
            raise NotImplementedError(f"IpcSource({self._name}) cannot seek: only an IPC file given by path "
                                      f"can be replayed, not stdin or a file object")
        self._check_seek_allowed()
        self._start_batch = position_int(position, "batch", "IpcSource", _FORMAT)
        self._start_row = position_int(position, "row", "IpcSource", _FORMAT)

    async def _open(self) -> None:
        self._mark_opened()
        if self._stdin:
            self._reader = IpcStreamReader(self._stdin_receive())
            return
        try:
            if self._path is not None:
                self._file = await anyio.to_thread.run_sync(open, self._path, "rb")
                if await anyio.to_thread.run_sync(self._file.read, len(_FILE_MAGIC)) == _FILE_MAGIC:
                    self._file.close()
                    self._random = await anyio.to_thread.run_sync(_open_ipc_file, self._path)
                    return
                await anyio.to_thread.run_sync(self._file.seek, 0)
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot open Arrow IPC file {self._name}: {exc}") from exc
        file = self._file

        async def receive(n: int) -> bytes:
            return await anyio.to_thread.run_sync(_read_some, file, n)

        async def skip(n: int) -> None:
            await anyio.to_thread.run_sync(file.seek, n, os.SEEK_CUR)

        self._reader = IpcStreamReader(receive, skip if self._path is not None else None)

    def _stdin_receive(self) -> Callable[[int], Awaitable[bytes]]:
        """A pipe or terminal: wait until readable, then read what is there (cancellable, nothing lost)."""
        fd = sys.stdin.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):  # a redirected file: pollers refuse it, read in a thread

            async def receive_file(n: int) -> bytes:
                return await anyio.to_thread.run_sync(os.read, fd, n)

            return receive_file
        self._shield = False

        async def receive(n: int) -> bytes:
            await anyio.wait_readable(fd)
            return os.read(fd, n)

        return receive

    async def _next(self, index: int, decode: bool) -> Any:
        if self._random is not None:
            if index >= self._random.num_record_batches:
                return None
            return await anyio.to_thread.run_sync(self._random.get_batch, index) if decode else SKIPPED
        assert self._reader is not None
        return await self._reader.next_batch(decode)

    async def __anext__(self) -> SourceBatch:
        if self._closed:
            raise RuntimeError(f"IpcSource({self._name}) is closed")
        if self._reader is None and self._random is None:
            with anyio.CancelScope(shield=True):  # opening is short and must not half-happen
                await self._open()
        with anyio.CancelScope(shield=self._shield):
            item = await self._advance()
        return item

    async def _advance(self) -> SourceBatch:
        while True:
            index = self._index + 1
            try:
                batch = await self._next(index, decode=index >= self._start_batch)
            except (Undecodable, OSError, pa.ArrowException) as exc:
                raise SourceError(f"Arrow IPC {self._name}, batch {index}: {exc}") from exc
            if batch is None:
                schema = self._schema()
                if index == 0 and self._start_batch == 0 and schema is not None and not self._schema_only_sent:
                    # a stream with a schema and no batch: handed on as an empty batch, so the column plan
                    # counts it (empty_batch) instead of it vanishing; its position is past it (a resume
                    # there does not count it again)
                    self._schema_only_sent = True
                    return SourceBatch(_empty(schema), _fixed_position({"batch": 1, "row": 0}),
                                       where=f"{self._name} (schema only)")
                raise StopAsyncIteration
            self._index = index
            if batch is SKIPPED:
                continue
            skip = self._start_row if index == self._start_batch else 0
            if batch.num_rows == 0 and skip == 0:  # an empty record batch: counted (or raised) downstream
                return SourceBatch(batch, _fixed_position({"batch": index + 1, "row": 0}),
                                   where=f"{self._name} batch {index}")
            if skip >= batch.num_rows:
                continue
            return SourceBatch(batch.slice(skip) if skip else batch, _batch_position(index, skip),
                               where=f"{self._name} batch {index} row {skip}")

    def _schema(self) -> pa.Schema | None:
        if self._random is not None:
            return self._random.schema
        return None if self._reader is None else self._reader.schema

    async def aclose(self) -> None:
        if not self._closed and self._path is not None and self._file is not None:
            await anyio.to_thread.run_sync(self._file.close)  # stdin and caller's file objects stay open
        self._random = None
        await super().aclose()


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def _open_ipc_file(path: str) -> pa.ipc.RecordBatchFileReader:
    return pa.ipc.open_file(pa.memory_map(path, "r"))


def _fixed_position(position: Position) -> Callable[[int], Position]:
    return lambda r: dict(position)


def _batch_position(index: int, skip: int, **extra: int) -> Callable[[int], Position]:
    return lambda r: {**extra, "batch": index, "row": skip + r}


class IpcTcpSource(Source):
    """Arrow IPC streams that producers push to a TCP port where streamfit listens.

    Connections are served one after another, each carrying one IPC stream; after a stream ends the
    source accepts the next connection (a restarted producer reconnects), so it never ends on its own
    unless ``max_connections`` streams were read.  A producer connecting while another is streaming
    waits in the listen backlog.  Bytes that are not Arrow IPC, or a connection lost inside a message,
    yield a :class:`SourceBatch` with ``error`` (reason ``"undecodable"`` or ``"truncated"``) and that
    connection is dropped.  Position (informational, cannot seek: a socket cannot be replayed):
    ``{"connection": c, "batch": i, "row": r}``, ``c`` counting from 0.

    Call ``await source.listen()`` (or enter ``async with``) to bind before producers connect; ``port``
    is then the bound port (useful with ``port=0``).

    Parameters
    ----------
    host, port
        The address to listen on; ``port=0`` takes a free port (read it from ``port`` after :meth:`listen`).
    max_connections
        End the stream after this many producers' streams; None (default): serve connections until closed.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, max_connections: int | None = None) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"Invalid port: {port!r}, expected an int in 0..65535")
        if max_connections is not None and (not isinstance(max_connections, int) or max_connections < 1):
            raise ValueError(f"Invalid max_connections: {max_connections!r}, expected None or an int >= 1")
        self.host, self._port, self.max_connections = host, port, max_connections
        self._listener: SocketListener | None = None
        self._stream: SocketStream | None = None
        self._reader: IpcStreamReader | None = None
        self._bound_port: int | None = None
        self._connections = 0
        self._index = -1

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`listen`)."""
        if self._bound_port is None:
            raise RuntimeError("IpcTcpSource is not listening yet: await listen() or use 'async with' first")
        return self._bound_port

    async def listen(self) -> int:
        """Bind and listen (idempotent); returns the bound port."""
        if self._listener is None:
            self._mark_opened()
            try:
                multi = await anyio.create_tcp_listener(local_host=self.host, local_port=self._port)
            except OSError as exc:
                raise SourceError(f"cannot listen on {self.host}:{self._port}: {exc}") from exc
            first, *extra = multi.listeners
            self._listener = cast(SocketListener, first)
            for listener in extra:  # a host name resolving to several addresses: keep the first only
                await listener.aclose()
            self._bound_port = int(first.extra(SocketAttribute.local_port))
        return self.port

    async def __aenter__(self) -> IpcTcpSource:
        await self.listen()
        return self

    async def _receive(self, n: int) -> bytes:
        """Up to n bytes, b"" at the end; anyio's receive is cancel-safe, and so is the reader's buffer."""
        assert self._stream is not None
        try:
            return await self._stream.receive(min(n, 1 << 20))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return b""

    async def _drop_connection(self) -> None:
        stream, self._stream, self._reader = self._stream, None, None
        if stream is not None:
            with anyio.CancelScope(shield=True):  # instant; a cancellation must not leak the socket
                await stream.aclose()

    async def __anext__(self) -> SourceBatch:
        if self._closed:
            raise RuntimeError("IpcTcpSource is closed")
        await self.listen()
        assert self._listener is not None
        while True:
            if self._reader is None:
                if self.max_connections is not None and self._connections >= self.max_connections:
                    raise StopAsyncIteration
                self._stream = await self._listener.accept()
                self._reader = IpcStreamReader(self._receive)
                self._connections += 1
                self._index = -1
            conn, index = self._connections - 1, self._index + 1
            try:
                batch = await self._reader.next_batch()
            except Undecodable as exc:
                await self._drop_connection()
                reason = "truncated" if isinstance(exc, Truncated) else "undecodable"
                where = f"connection {conn} batch {index}"
                position = {"connection": conn, "batch": index + 1, "row": 0}
                return SourceBatch(None, _fixed_position(position), where=where,
                                   error=BadInputError(f"Arrow IPC over TCP, {where}: {exc}",
                                                       reason=reason, position=position))
            if batch is None:
                schema = self._reader.schema
                await self._drop_connection()
                if index == 0 and schema is not None:  # a connection that sent a schema and no batch: counted
                    return SourceBatch(_empty(schema), _fixed_position({"connection": conn, "batch": 1, "row": 0}),
                                       where=f"connection {conn} (schema only)")
                continue
            assert isinstance(batch, pa.RecordBatch)
            self._index = index
            if not batch.num_rows:  # an empty record batch: counted (or raised) downstream
                return SourceBatch(batch, _fixed_position({"connection": conn, "batch": index + 1, "row": 0}),
                                   where=f"connection {conn} batch {index}")
            return SourceBatch(batch, _batch_position(index, 0, connection=conn),
                               where=f"connection {conn} batch {index}")

    async def aclose(self) -> None:
        await self._drop_connection()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.aclose()
        await super().aclose()
