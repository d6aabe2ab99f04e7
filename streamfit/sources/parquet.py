"""Parquet source: one file, a list of files or a directory (optionally followed for new files).

Read with ``pyarrow.dataset`` fragments one file at a time (the fastest reader measured here, with memory
bounded by ``batch_size`` x ``batch_readahead``), in a worker thread so the event loop never blocks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence

import anyio
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from streamfit.exceptions import BadInputError, SourceError
from streamfit.sources._base import Position, Source, SourceBatch, position_int

__all__ = ["ParquetSource"]

_log = logging.getLogger(__name__)
_FORMAT = '{"file": str, "row": int}'
_SUFFIXES = (".parquet", ".parq", ".pq")
#: "row" of a position meaning "this whole file is done" when its row count is unknown (unreadable file).
PAST_END = 2**63 - 1


def _list_directory(root: str) -> list[str]:
    """Relative posix names of the Parquet files under ``root``, skipping hidden and ``_``-prefixed names."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
        for name in filenames:
            if name.lower().endswith(_SUFFIXES) and not name.startswith((".", "_")):
                found.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return sorted(found)


class _FileScan:
    """Batches of one file from row ``skip`` on: whole row groups before it are not read."""

    def __init__(self, path: str, skip: int, columns: list[str] | None, batch_size: int,
                 readahead: int, use_threads: bool = True) -> None:
        fragment = ds.ParquetFileFormat().make_fragment(path, filesystem=pafs.LocalFileSystem())
        metadata = fragment.metadata
        self.num_rows = metadata.num_rows
        missing = [c for c in columns or () if c not in fragment.physical_schema.names]
        if missing:
            raise BadInputError(f"column {missing[0]!r} not found in {os.path.basename(path)} "
                                f"(has: {', '.join(fragment.physical_schema.names)})",
                                reason="missing_column", column=missing[0])
        first_group, group_start = 0, 0
        while first_group < metadata.num_row_groups and \
                group_start + metadata.row_group(first_group).num_rows <= skip:
            group_start += metadata.row_group(first_group).num_rows
            first_group += 1
        self.row = group_start  # file row of the next batch out of the scanner
        self._drop = skip - group_start
        self._batches: Iterator[pa.RecordBatch] = iter(())
        if skip < self.num_rows:
            if first_group:
                fragment = fragment.subset(row_group_ids=list(range(first_group, metadata.num_row_groups)))
            self._batches = iter(fragment.to_batches(columns=columns, batch_size=batch_size,
                                                     batch_readahead=readahead, use_threads=use_threads))

    def next(self) -> tuple[pa.RecordBatch, int] | None:
        """(batch, its first row in the file), or ``None`` at the end of the file."""
        for batch in self._batches:
            start, self.row = self.row, self.row + batch.num_rows
            if self._drop:
                drop = min(self._drop, batch.num_rows)
                batch, start, self._drop = batch.slice(drop), start + drop, self._drop - drop
            if batch.num_rows:
                return batch, start
        return None


class ParquetSource(Source):
    """Parquet files in sorted name order; position ``{"file": name, "row": r}``.

    ``name`` is relative to the directory (or to the files' common parent for a list); ``r`` rows of
    that file are consumed and every file sorting before it is done.  ``follow=True`` polls the
    directory every ``poll_interval`` s for files sorting after the last one started and never ends
    until closed: write new files under a temporary name (``.part-3.parquet`` or ``_part-3.parquet``,
    which are ignored) and rename them when complete.  A file that is not valid Parquet, or lacks a
    projected column, yields a :class:`SourceBatch` with ``error`` and is skipped; I/O errors raise
    :class:`~streamfit.exceptions.SourceError`.  ``start_rows`` (``{name: rows}``) skips the first rows of
    those files when they are opened (files some other reader consumed in part).

    Parameters
    ----------
    path
        A Parquet file, a directory of them, or a list of files.
    columns
        The columns to read (projected while reading); None: all of them.
    batch_size
        The most rows per record batch read (pyarrow's ``batch_size``); files' batches are not merged.
    follow
        Poll the directory for new files and never end until closed.
    poll_interval
        Seconds between two looks at the directory with ``follow=True``.
    batch_readahead, use_threads
        How many batches pyarrow reads ahead in a file, and whether it decodes columns in its own threads
        (memory is bounded by ``batch_size`` x ``batch_readahead``).
    start_rows
        ``{file name: rows}``: rows already consumed of those files, skipped when each is opened.

    Examples
    --------
    >>> import os, tempfile, anyio, pyarrow as pa, pyarrow.parquet as pq
    >>> folder = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"x": [1.0] * 200}), os.path.join(folder, "part-0.parquet"))
    >>> pq.write_table(pa.table({"x": [2.0] * 10}), os.path.join(folder, "part-1.parquet"))
    >>> async def main():
    ...     async with ParquetSource(folder, batch_size=128) as source:
    ...         return [(b.num_rows, b.position_at(b.num_rows)) async for b in source]
    >>> for rows, position in anyio.run(main):
    ...     print(rows, position)
    128 {'file': 'part-0.parquet', 'row': 128}
    72 {'file': 'part-0.parquet', 'row': 200}
    10 {'file': 'part-1.parquet', 'row': 10}
    """

    def __init__(self, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 columns: Sequence[str] | None = None, batch_size: int = 65536, follow: bool = False,
                 poll_interval: float = 1.0, batch_readahead: int = 4, use_threads: bool = True,
                 start_rows: Mapping[str, int] | None = None) -> None:
        if isinstance(path, (str, os.PathLike)):
            self._paths = [os.path.abspath(os.fspath(path))]
            self._is_list = False
        else:
            self._paths = [os.path.abspath(os.fspath(p)) for p in path]
            self._is_list = True
            if not self._paths:
                raise ValueError("ParquetSource: empty list of files")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Invalid batch_size: {batch_size!r}, expected an int >= 1")
        if not poll_interval > 0:
            raise ValueError(f"Invalid poll_interval: {poll_interval!r}, expected seconds > 0")
        if follow and self._is_list:
            raise ValueError("ParquetSource: follow=True needs a directory, not a list of files")
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"ParquetSource: columns must be a list of names, got {columns!r}")
        self.columns = list(columns) if columns is not None else None
        self.batch_size, self.follow, self.poll_interval = batch_size, follow, poll_interval
        self.batch_readahead = batch_readahead
        self.use_threads = bool(use_threads)
        self._root = ""
        self._is_dir = False
        self._pending: list[str] = []
        self._last: str | None = None  # the last file started
        self._scan: _FileScan | None = None
        self._file = ""
        self._start_file: str | None = None
        self._start_row = 0
        #: rows of these files (by name) consumed before: skipped when the file is opened (a scale-out share
        #: re-dealt among another number of learners holds files some learner had partly read)
        self._start_rows = {str(k): int(v) for k, v in (start_rows or {}).items()}
        self._seen_late: set[str] = set()

    def seek(self, position: Position) -> None:
        """Resume at ``{"file": name, "row": r}``: earlier files are skipped, and so are the row groups
        of that file before row ``r``.

        Parameters
        ----------
        position
            ``{"file": name, "row": r}``.
        """
        self._check_seek_allowed()
        name = position.get("file") if isinstance(position, Mapping) else None
        if not isinstance(name, str):
            raise ValueError(f"ParquetSource: invalid position {position!r}, expected {_FORMAT}")
        self._start_file = name
        self._start_row = position_int(position, "row", "ParquetSource", _FORMAT)

    def _list(self) -> list[str]:
        if self._is_dir:
            return _list_directory(self._root)
        return sorted(os.path.relpath(p, self._root).replace(os.sep, "/") for p in self._paths)

    def _discover(self) -> None:
        """First listing: decide the root, check that the paths exist."""
        for p in self._paths:
            if not os.path.exists(p):
                raise SourceError(f"Parquet path not found: {p}")
        self._is_dir = not self._is_list and os.path.isdir(self._paths[0])
        if self.follow and not self._is_dir:
            raise SourceError(f"ParquetSource: follow=True needs a directory, {self._paths[0]} is a file")
        self._root = self._paths[0] if self._is_dir else os.path.commonpath(
            [os.path.dirname(p) for p in self._paths])

    def _new_files(self) -> list[str]:
        names = self._list()
        if self._last is not None:
            late = [n for n in names if n < self._last and n not in self._seen_late]
            for name in late:
                _log.warning("ParquetSource: ignoring %s, it sorts before %s which was already read", name,
                             self._last)
            self._seen_late.update(late)
            names = [n for n in names if n > self._last]
        if self._start_file is not None:
            names = [n for n in names if n >= self._start_file]
        return names

    def _open_file(self, name: str) -> SourceBatch | None:
        """Start reading ``name``; an error batch if it is not valid Parquet or lacks a column."""
        skip = self._start_row if name == self._start_file else self._start_rows.get(name, 0)
        try:
            self._scan = _FileScan(os.path.join(self._root, name), skip, self.columns, self.batch_size,
                                   self.batch_readahead, self.use_threads)
            self._file = name
            return None
        except BadInputError as exc:
            exc.position = {"file": name, "row": PAST_END}
            return SourceBatch(None, lambda r: {"file": name, "row": PAST_END}, error=exc, where=name)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return self._error_batch(name, PAST_END, exc)
        except OSError as exc:
            raise SourceError(f"cannot read Parquet file {name}: {exc}") from exc

    def _error_batch(self, name: str, end: int, exc: Exception) -> SourceBatch:
        self._scan = None
        position = {"file": name, "row": end}
        error = BadInputError(f"{name} is not valid Parquet: {exc}", reason="undecodable", position=position)
        return SourceBatch(None, lambda r: dict(position), error=error, where=name)

    def _step(self) -> SourceBatch | None:
        """Next batch of the open files, or ``None`` when no file is left (blocking: run in a thread)."""
        while True:
            if self._scan is None:
                if not self._pending:
                    return None
                name = self._pending.pop(0)
                self._last = name
                error = self._open_file(name)
                if error is not None:
                    return error
            assert self._scan is not None
            try:
                item = self._scan.next()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                return self._error_batch(self._file, self._scan.num_rows, exc)
            except OSError as exc:
                raise SourceError(f"cannot read Parquet file {self._file}: {exc}") from exc
            if item is None:
                self._scan = None
                continue
            batch, start = item
            return SourceBatch(batch, _position_fn(self._file, start), where=f"{self._file} row {start}")

    async def __anext__(self) -> SourceBatch:
        if not self._opened:
            self._mark_opened()
            with anyio.CancelScope(shield=True):  # a listing is short and must not half-happen
                await anyio.to_thread.run_sync(self._discover)
                self._pending = await anyio.to_thread.run_sync(self._new_files)
        elif self._closed:
            raise RuntimeError("ParquetSource is closed")
        while True:
            with anyio.CancelScope(shield=True):  # a batch read is short; cancelling it would drop its rows
                item = await anyio.to_thread.run_sync(self._step)
            if item is not None:
                return item
            if not self.follow:
                raise StopAsyncIteration
            await anyio.sleep(self.poll_interval)
            self._pending = await anyio.to_thread.run_sync(self._new_files)

    async def aclose(self) -> None:
        self._scan, self._pending = None, []
        await super().aclose()


def _position_fn(name: str, start: int) -> Callable[[int], Position]:
    return lambda r: {"file": name, "row": start + r}
