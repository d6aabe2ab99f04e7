from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pyarrow as pa
import pytest

from streamfit.exceptions import SourceError
from streamfit.sources import IpcSource, IpcTcpSource

pytestmark = pytest.mark.anyio


def _write_stream(sink, table: pa.Table, chunk: int) -> None:
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=chunk):
            writer.write_batch(batch)


@pytest.fixture
def table(ids_table) -> pa.Table:
    t = ids_table(0, 100)  # with a dictionary column: dictionary messages must be replayed on decode
    return t.append_column("tag", pa.array([f"t{i % 3}" for i in range(100)]).dictionary_encode())


@pytest.mark.parametrize("fmt", ["stream", "file"])
async def test_ipc_file_reads_and_resumes_mid_batch(tmp_path, table, collect_ids, fmt) -> None:
    path = tmp_path / "data.arrows"
    if fmt == "stream":
        _write_stream(str(path), table, 30)
    else:
        with pa.ipc.new_file(str(path), table.schema) as writer:
            for batch in table.to_batches(max_chunksize=30):
                writer.write_batch(batch)
    async with IpcSource(path) as source:
        items = [item async for item in source]
    assert [i.num_rows for i in items] == [30, 30, 30, 10]
    assert pa.Table.from_batches([i.batch for i in items]).equals(table.combine_chunks())
    position = items[1].position_at(7)
    assert position == {"batch": 1, "row": 7}
    resumed = IpcSource(str(path))
    resumed.seek(position)
    async with resumed:
        assert await collect_ids(resumed) == list(range(37, 100))


async def test_cancelled_reads_lose_no_row(tmp_path, table, collect_ids_cancelling) -> None:
    _write_stream(str(tmp_path / "d.arrows"), table, 9)
    async with IpcSource(tmp_path / "d.arrows") as source:
        assert await collect_ids_cancelling(source, 100) == list(range(100))


async def test_corrupt_ipc_file_raises_source_error(tmp_path) -> None:
    path = tmp_path / "bad.arrows"
    path.write_bytes(b"\x00" * 64)
    async with IpcSource(path) as source:
        with pytest.raises(SourceError, match="not an Arrow IPC stream"):
            await source.__anext__()
    async with IpcSource(tmp_path / "missing.arrows") as source:
        with pytest.raises(SourceError, match="cannot open"):
            await source.__anext__()


@pytest.mark.parametrize("stdin", ["pipe", "file"])
async def test_stdin(anyio_backend, tmp_path, table, stdin) -> None:
    script = ("import anyio, sys\nfrom streamfit.sources import open_source\n"
              "async def main():\n"
              "    async with open_source('ipc:-') as s:\n"
              "        print(sum([b.num_rows async for b in s]))\n"
              f"anyio.run(main, backend={anyio_backend!r})\n")
    data = _stream_bytes(table, 25)
    (tmp_path / "in.arrows").write_bytes(data)
    with open(tmp_path / "in.arrows", "rb") as file:  # a pipe is polled, a redirected file read in a thread
        feed = {"input": data} if stdin == "pipe" else {"stdin": file}
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60,
                              cwd=str(tmp_path), env=env, **feed)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "100"
    with pytest.raises(NotImplementedError, match="cannot seek"):
        IpcSource("-").seek({"batch": 0, "row": 0})


def _produce(port: int, payloads: list[bytes]) -> threading.Thread:
    """A producer thread: one connection per payload, written then closed."""
    def run() -> None:
        for payload in payloads:
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(payload)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _stream_bytes(table: pa.Table, chunk: int) -> bytes:
    sink = pa.BufferOutputStream()
    _write_stream(sink, table, chunk)
    return sink.getvalue().to_pybytes()


async def test_tcp_successive_connections_and_bad_streams(table) -> None:
    good = _stream_bytes(table, 40)
    payloads = [good, b"GARBAGE!" * 4, good[: len(good) // 2], good]  # bad bytes, then a cut stream
    with anyio.fail_after(20):
        async with IpcTcpSource(port=0, max_connections=4) as source:
            assert source.port > 0
            thread = _produce(source.port, payloads)
            items = [item async for item in source]
    thread.join(5)
    errors = [(i.error.reason, i.position_at(0)["connection"]) for i in items if i.error is not None]
    assert errors == [("undecodable", 1), ("truncated", 2)]
    by_conn: dict[int, list[int]] = {}
    for item in items:
        if item.batch is not None:
            ids = item.batch.column("id").to_pylist()
            by_conn.setdefault(item.position_at(0)["connection"], []).extend(ids)
    assert by_conn[0] == by_conn[3] == list(range(100))
    assert by_conn[2] == list(range(len(by_conn[2])))  # the batches before the cut were delivered
    assert items[1].position_at(5) == {"connection": 0, "batch": 1, "row": 5}


async def test_tcp_cancelled_mid_message_keeps_the_bytes(table) -> None:
    data = _stream_bytes(table, 100)
    async with IpcTcpSource(max_connections=1) as source:
        with socket.create_connection(("127.0.0.1", source.port)) as conn:
            conn.sendall(data[: len(data) - 100])  # schema and most of the batch
            with anyio.move_on_after(0.2) as scope:
                await source.__anext__()
            assert scope.cancelled_caught
            conn.sendall(data[len(data) - 100:])
            with anyio.fail_after(10):
                item = await source.__anext__()
        assert item.batch.column("id").to_pylist() == list(range(100))


async def test_tcp_never_ends_until_closed_and_cannot_seek(table) -> None:
    source = IpcTcpSource()
    with pytest.raises(RuntimeError, match="not listening"):
        _ = source.port
    with pytest.raises(NotImplementedError):
        source.seek({"connection": 0, "batch": 0, "row": 0})
    async with source:
        thread = _produce(source.port, [_stream_bytes(table, 50)])
        with anyio.fail_after(10):
            assert [(await source.__anext__()).num_rows for _ in range(2)] == [50, 50]
        with anyio.move_on_after(0.2) as scope:  # waits for the next producer
            await source.__anext__()
        assert scope.cancelled_caught
    thread.join(5)
    with pytest.raises(RuntimeError, match="closed"):
        await source.__anext__()
