"""In-memory source: Arrow record batches, tables or a RecordBatchReader (tests, notebooks, replay)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Union

import anyio
import pyarrow as pa

from streamfit.sources._base import Position, Source, SourceBatch, position_int

__all__ = ["MemorySource"]

MemoryItem = Union[pa.RecordBatch, pa.Table, pa.RecordBatchReader]  # noqa: UP007 - a runtime alias on 3.10
_FORMAT = '{"batch": int, "row": int}'


class MemorySource(Source):
    """Batches from memory; tables are split into their record batches, empty batches are skipped.

    Position ``{"batch": i, "row": r}``: record batch ``i`` (counted after splitting tables, empty ones
    included) has its first ``r`` rows consumed.  A ``RecordBatchReader`` is read in a worker thread,
    since it may do blocking I/O.

    Parameters
    ----------
    data
        A RecordBatch, Table or RecordBatchReader, or an iterable of them (a generator is read lazily).

    Examples
    --------
    >>> import anyio, pyarrow as pa
    >>> table = pa.table({"x": [1.0, 2.0, 3.0]})
    >>> async def main():
    ...     async with MemorySource([table, table.slice(1)]) as source:
    ...         return [(b.num_rows, b.position_at(1)) async for b in source]
    >>> anyio.run(main)
    [(3, {'batch': 0, 'row': 1}), (2, {'batch': 1, 'row': 1})]
    """

    def __init__(self, data: MemoryItem | Iterable[MemoryItem]) -> None:
        if isinstance(data, (pa.RecordBatch, pa.Table, pa.RecordBatchReader)):
            data = [data]
        elif isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise TypeError(f"MemorySource expects RecordBatch, Table, RecordBatchReader or an iterable "
                            f"of them, got {type(data).__name__}")
        self._data = data
        # Lists of in-memory batches are read inline; readers and other iterators may block: use a thread.
        items = data if isinstance(data, (list, tuple)) else None
        self._threaded = items is None or any(isinstance(d, pa.RecordBatchReader) for d in items)
        self._start_batch = 0
        self._start_row = 0
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._index = -1

    def seek(self, position: Position) -> None:
        """Resume at ``{"batch": i, "row": r}`` (skip batches before ``i`` and ``r`` rows of batch ``i``).

        Parameters
        ----------
        position
            ``{"batch": i, "row": r}``.
        """
        self._check_seek_allowed()
        self._start_batch = position_int(position, "batch", "MemorySource", _FORMAT)
        self._start_row = position_int(position, "row", "MemorySource", _FORMAT)

    async def __anext__(self) -> SourceBatch:
        if self._batches is None:
            self._mark_opened()
            self._batches = _flatten(self._data)
        elif self._closed:
            raise RuntimeError("MemorySource is closed")
        while True:
            if self._threaded:
                with anyio.CancelScope(shield=True):  # a cancelled next() would drop the batch it read
                    batch = await anyio.to_thread.run_sync(next, self._batches, None)
            else:
                batch = next(self._batches, None)
            if batch is None:
                raise StopAsyncIteration
            self._index += 1
            index = self._index
            if index < self._start_batch:
                continue
            skip = self._start_row if index == self._start_batch else 0
            if skip >= batch.num_rows:
                continue
            return SourceBatch(batch.slice(skip) if skip else batch, _position_fn(index, skip),
                               where=f"batch {index} row {skip}")

    async def aclose(self) -> None:
        self._batches = iter(())
        await super().aclose()


def _position_fn(index: int, skip: int) -> Callable[[int], Position]:
    return lambda r: {"batch": index, "row": skip + r}


def _flatten(data: Iterable[MemoryItem]) -> Iterator[pa.RecordBatch]:
    for item in data:
        if isinstance(item, pa.RecordBatch):
            yield item
        elif isinstance(item, pa.Table):
            yield from item.to_batches()
        elif isinstance(item, pa.RecordBatchReader):
            yield from item
        else:
            raise TypeError(f"MemorySource: expected RecordBatch, Table or RecordBatchReader, "
                            f"got {type(item).__name__}")
