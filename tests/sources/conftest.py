"""Every async source test runs under both anyio backends: asyncio and trio."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pyarrow as pa
import pytest

from streamfit.sources import Source


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _ids_table(start: int, stop: int) -> pa.Table:
    ids = list(range(start, stop))
    return pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array([i * 0.5 for i in ids], pa.float32())})


async def _collect_ids(source: Source, limit: int | None = None) -> list[int]:
    out: list[int] = []
    async for item in source:
        if item.batch is not None:
            out += item.batch.column("id").to_pylist()
        if limit is not None and len(out) >= limit:
            break
    return out


async def _collect_ids_cancelling(source: Source, rows: int, every: float = 0.0005) -> list[int]:
    out: list[int] = []
    with anyio.fail_after(30):
        while len(out) < rows:
            with anyio.move_on_after(every):
                item = await source.__anext__()
                if item.batch is not None:
                    out += item.batch.column("id").to_pylist()
    return out


@pytest.fixture
def collect_ids_cancelling() -> Callable[..., Awaitable[list[int]]]:
    """``await f(source, rows)``: like ``collect_ids`` with every ``__anext__`` under a tiny timeout, to
    check that a cancelled read loses no row."""
    return _collect_ids_cancelling


@pytest.fixture
def ids_table() -> Callable[[int, int], pa.Table]:
    """``ids_table(a, b)``: rows numbered a..b-1 in column ``id``, to check no row is lost or repeated."""
    return _ids_table


@pytest.fixture
def collect_ids() -> Callable[..., Awaitable[list[int]]]:
    """``await collect_ids(source, limit=None)``: row ids until the end (errors skipped) or ``limit`` rows."""
    return _collect_ids
