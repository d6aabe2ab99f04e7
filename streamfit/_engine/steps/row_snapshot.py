"""Copy-on-write snapshots of large tables: the state at one step, streamed by row blocks, never copied whole.

A full checkpoint of a 1 GiB table used to copy the table (and its optimizer state) on the training thread
and hold the copy until the write ended.  A :class:`CowSnapshot` instead freezes the live arrays at the step
it is taken, without copying anything then:

* a writer reads each array as consecutive blocks of rows (:meth:`CowSnapshot.blocks`), copying one block at
  a time into a buffer, then moves the array's *cursor* past it (under a lock);
* before a step writes rows of an array (:meth:`CowSnapshot.before_write`, called by
  :class:`~streamfit._engine.steps.sparse_tables.SparseTables`), the rows at or past that array's cursor that have not
  been saved yet are copied aside (their values at the snapshot's step); rows below the cursor are already
  streamed and need nothing;
* a block the writer reads gets the saved-aside rows in it laid over the live block, so every block holds
  exactly the snapshot's values.

Why rows, not blocks, are saved aside: a batch's ids are spread over the whole table (hashed ids), so a
batch of 20K ids touches nearly every block of a 2^24-row table: copying touched *blocks* aside would copy
the table within a step or two.  Saving touched *rows* costs what the step already moves (O(rows touched))
and bounds the extra memory by the distinct rows written while the snapshot is being streamed, minus those
the writer already passed.  Saved rows are dropped as the writer's cursor passes them.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Mapping

import numpy as np

__all__ = ["CowSnapshot", "BLOCK_BYTES", "row_items"]

#: bytes of one streamed block (the writer's buffer).  Large: every block costs the writer a few GIL round
#: trips (copy, checksum, write), each of which can wait a switch interval (5 ms) behind the training thread;
#: the training thread waits for at most one block's copy (a few ms) when it writes rows meanwhile.
BLOCK_BYTES = 16 << 20


def row_items(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's rows (axis 0) as a 1-D array of opaque items (a view): ``np.take``/``np.put``
    with row indices then copy whole rows, much faster than fancy indexing of a 2-D array."""
    if not array.flags.c_contiguous:
        raise ValueError("row items need a C-contiguous array")
    row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    return array.reshape(array.shape[0], -1).view(np.dtype((np.void, max(row_bytes, 1)))).reshape(-1)


#: saved chunks of an array beyond which the writer merges them into one
_MERGE_AT = 8


class _Saved:
    """The rows of one array saved aside, in chunks (one per step that wrote rows past the cursor)."""

    __slots__ = ("rows", "values", "mask")

    def __init__(self, n: int) -> None:
        self.rows: list[np.ndarray] = []  # each sorted distinct int64
        self.values: list[np.ndarray] = []  # row items, same length
        self.mask = np.zeros(n, np.bool_)  # saved already (zeroed pages: costs memory only where written)


class CowSnapshot:
    """The arrays ``live`` (name -> C-contiguous array, rows on axis 0) frozen as they are now.

    The owner of the arrays calls :meth:`before_write` with the rows it is about to write, for every write
    while the snapshot is open; the writer thread reads each array once, in order, with :meth:`blocks`.
    :meth:`close` (idempotent) releases what is saved aside; the snapshot detaches itself from its owner
    through ``on_close``.

    >>> a = np.arange(8, dtype=np.float32).reshape(4, 2)
    >>> snap = CowSnapshot({"a": a}, block_rows=2)
    >>> snap.before_write("a", np.array([1, 3])); a[[1, 3]] = -1
    >>> np.concatenate([b.copy() for b in snap.blocks("a")])[:, 0].tolist()
    [0.0, 2.0, 4.0, 6.0]
    """

    def __init__(self, live: Mapping[str, np.ndarray], *, block_rows: int | None = None,
                 on_close: "Callable[[CowSnapshot], None] | None" = None) -> None:
        for name, a in live.items():
            if not a.flags.c_contiguous or a.ndim < 1:
                raise ValueError(f"{name!r}: a copy-on-write snapshot needs C-contiguous arrays of rows")
        self._live = dict(live)
        self._items = {name: row_items(a) for name, a in self._live.items()}
        self._lock = threading.Lock()
        self._cursor = {name: 0 for name in self._live}
        self._saved = {name: _Saved(a.shape[0]) for name, a in self._live.items()}
        self._block_rows = {name: block_rows or max(1, BLOCK_BYTES // max(1, a[:1].nbytes))
                            for name, a in self._live.items()}
        self._on_close = on_close
        self._closed = False
        #: rows saved aside so far (all arrays), and the most held at once (bytes)
        self.saved_rows = 0
        self.peak_saved_bytes = 0
        self._saved_bytes = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._live)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._live[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return self._live[name].dtype

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the owner's side (the training thread) ---------------------------------------------------------
    def before_write(self, name: str, rows: np.ndarray) -> None:
        """Rows of array ``name`` (sorted distinct int64) are about to be written: save those the writer has
        not streamed yet, the first time only."""
        saved = self._saved.get(name)
        if saved is None:
            return
        with self._lock:
            if self._closed:
                return
            cursor = self._cursor[name]
            if cursor >= self._live[name].shape[0] or not rows.size:
                return
            ahead = rows[np.searchsorted(rows, cursor):] if rows[0] < cursor else rows
            new = ahead[~saved.mask[ahead]]
            if not new.size:
                return
            saved.mask[new] = True
            values = np.take(self._items[name], new)
            saved.rows.append(np.ascontiguousarray(new, np.int64))
            saved.values.append(values)
            self.saved_rows += int(new.size)
            self._saved_bytes += int(values.nbytes + new.nbytes)
            self.peak_saved_bytes = max(self.peak_saved_bytes, self._saved_bytes)

    def before_write_all(self, name: str) -> None:
        """Every row of ``name`` is about to be written (a state load): save what is not streamed yet."""
        if name in self._live:
            self.before_write(name, np.arange(self._live[name].shape[0], dtype=np.int64))

    # -- the writer's side -----------------------------------------------------------------------------
    def blocks(self, name: str) -> Iterator[np.ndarray]:
        """Array ``name`` as it was at the snapshot's step, as consecutive blocks of rows (one buffer, reused:
        consume each block before asking for the next).  Each array is read once."""
        live = self._live[name]
        n, step = live.shape[0], self._block_rows[name]
        buf = np.empty((min(step, n),) + live.shape[1:], live.dtype)
        items = row_items(buf) if n else buf
        saved = self._saved[name]
        for start in range(0, n, step):
            stop = min(n, start + step)
            if self._closed:
                raise RuntimeError("the snapshot was closed while it was being read")
            if self._cursor[name] != start:
                raise RuntimeError(f"array {name!r} of the snapshot is read twice or out of order")
            # copied without the lock: the cursor is still at ``start``, so a step writing a row of this block
            # meanwhile saves its old value first, and the saved rows laid over the copy below fix any such row
            np.copyto(buf[:stop - start], live[start:stop])
            with self._lock:
                self._cursor[name] = stop
                chunks = list(zip(saved.rows, saved.values))
            for rows, values in chunks:  # chunks appended later hold only rows >= stop
                lo, hi = np.searchsorted(rows, (start, stop))
                if hi > lo:
                    items[rows[lo:hi] - start] = values[lo:hi]
            if len(chunks) > _MERGE_AT:
                self._merge(name, stop)
            yield buf[:stop - start]
        with self._lock:
            self._cursor[name] = n
            self._saved_bytes -= sum(r.nbytes + v.nbytes for r, v in zip(saved.rows, saved.values))
            saved.rows.clear()
            saved.values.clear()
            saved.mask = np.zeros(0, np.bool_)
        if all(self._cursor[k] >= self._live[k].shape[0] for k in self._live):
            self.close()

    def _merge(self, name: str, below: int) -> None:
        """The saved chunks of ``name`` as one sorted chunk without the rows below ``below`` (streamed): the
        writer then looks at one chunk per block, and what it passed is freed (the writer's thread)."""
        saved = self._saved[name]
        with self._lock:
            taken = len(saved.rows)
            rows_list, values_list = list(saved.rows), list(saved.values)
        # geometric: the first (merged) chunk is merged again only once the others hold as many rows
        first = 0 if sum(r.size for r in rows_list[1:]) >= rows_list[0].size else 1
        rows, values = np.concatenate(rows_list[first:]), np.concatenate(values_list[first:])
        before = rows.nbytes + values.nbytes
        order = np.argsort(rows, kind="stable")
        order = order[np.searchsorted(rows, below, sorter=order):]  # rows distinct across chunks (the mask)
        rows, values = rows[order], values[order]
        with self._lock:  # chunks appended meanwhile stay after the merged one
            if self._closed:
                return
            saved.rows[first:taken] = [rows]
            saved.values[first:taken] = [values]
            self._saved_bytes -= before - rows.nbytes - values.nbytes

    def close(self) -> None:
        """Stop saving rows, free what is saved (also when the write failed or never ran); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for saved in self._saved.values():
                saved.rows.clear()
                saved.values.clear()
                saved.mask = np.zeros(0, np.bool_)
            self._saved_bytes = 0
        if self._on_close is not None:
            self._on_close(self)
