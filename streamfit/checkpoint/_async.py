"""Checkpoint writes off the training thread: one worker, at most one write in flight.

Writing a checkpoint (hashing, fsync) can take seconds; the training loop hands over snapshotted
host arrays and keeps going.  Bounding the backlog to one write bounds the memory held by snapshots.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from streamfit.checkpoint._chain import TableArrays
from streamfit.checkpoint._format import check_arrays, check_model, check_step, json_copy
from streamfit.checkpoint._store import CheckpointStore
from streamfit.exceptions import CheckpointError

__all__ = ["AsyncCheckpointWriter", "WriteResult"]

logger = logging.getLogger("streamfit.checkpoint")


@dataclass(frozen=True)
class WriteResult:
    """A finished background write: which step, where, and how long ``save`` took (seconds).

    Attributes
    ----------
    step, path
        The checkpoint written and its directory.
    seconds
        How long ``save`` took.
    """

    step: int
    path: Path
    seconds: float


@dataclass(frozen=True)
class _Job:
    step: int
    model: bytes
    arrays: Mapping[str, np.ndarray]
    meta: Mapping[str, Any] | None
    tables: TableArrays | None = None


class AsyncCheckpointWriter:
    """Run :meth:`CheckpointStore.save` on one background thread, one write at a time.

    ``submit`` returns at once while the writer is idle.  While a write is queued or running, it
    waits for it (``wait=True``) or skips the new one and returns ``False`` (``wait=False``); check
    :attr:`busy` first to avoid snapshotting for nothing.  A failed write is raised as
    :class:`CheckpointError` by the next ``submit``/``flush``/``close``, never lost.  Arrays handed
    in must be copies the caller no longer mutates: the worker reads them later.

    Parameters
    ----------
    store
        The :class:`CheckpointStore` to write to.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> with AsyncCheckpointWriter(CheckpointStore(tempfile.mkdtemp())) as writer:
    ...     writer.submit(1, b"model", {"w": np.zeros(2)}, {"rows": 64})
    ...     writer.flush()
    ...     writer.last_result.step
    True
    1
    """

    def __init__(self, store: CheckpointStore) -> None:
        if not isinstance(store, CheckpointStore):
            raise CheckpointError(f"store must be a CheckpointStore, got {type(store).__name__}")
        self.store = store
        self._cond = threading.Condition()
        self._pending: _Job | None = None
        self._running = False
        self._closed = False
        self._error: tuple[int, Exception] | None = None
        self._last: WriteResult | None = None
        self._skipped = 0
        self._thread = threading.Thread(target=self._run, name="streamfit-checkpoint-writer", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("busy" if self.busy else "idle")
        return f"AsyncCheckpointWriter({self.store!r}, {state})"

    @property
    def busy(self) -> bool:
        """A write is queued or running (a ``submit(..., wait=False)`` now would be skipped)."""
        with self._cond:
            return self._pending is not None or self._running

    @property
    def last_result(self) -> WriteResult | None:
        """The last successful write, with its duration."""
        return self._last

    @property
    def skipped(self) -> int:
        """How many submits were skipped because a write was in flight."""
        return self._skipped

    def submit(
        self,
        step: int,
        model: bytes,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any] | None = None,
        *,
        wait: bool = True,
        timeout: float | None = None,
        tables: TableArrays | None = None,
    ) -> bool:
        """Queue a checkpoint write; ``True`` if queued, ``False`` if skipped (``wait=False`` and busy).

        Invalid arguments (object arrays, non-JSON meta) raise here, on the caller's thread; ``meta``
        is copied now, so the caller may keep mutating its dicts.  ``tables`` as in
        :meth:`CheckpointStore.save` (a full or a delta of large arrays; a full's :class:`ArrayBlocks` are
        released when written, or here when not queued).  Raises :class:`CheckpointError`
        if an earlier write failed, if the writer is closed, or if ``timeout`` seconds pass while
        waiting for the write in flight.

        Parameters
        ----------
        step
            The checkpoint's step (the trainer's step count); greater than every committed one.
        model
            The model file's bytes (ONNX).
        arrays
            ``{name: array}``: the state's arrays (copies the caller no longer mutates).
        meta
            JSON-able state (the estimator's state tree, the source position, counters...).
        wait
            While a write is queued or running: wait for it (True), or skip this one and return False.
        timeout
            The most seconds to wait; None: no limit.
        tables
            The large arrays, as for :meth:`CheckpointStore.save`.
        """
        if tables is not None and not isinstance(tables, TableArrays):
            raise CheckpointError(f"tables must be a TableArrays, got {type(tables).__name__}")
        queued = False
        try:
            queued = self._submit(step, model, arrays, meta, wait, timeout, tables)
            return queued
        finally:
            if not queued and tables is not None:
                tables.release()  # not written: a streamed snapshot must stop saving rows

    def _submit(self, step: int, model: bytes, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None,
                wait: bool, timeout: float | None, tables: TableArrays | None) -> bool:
        step = check_step(step)
        check_model(model)
        arrays = check_arrays(arrays)
        if meta is not None and not isinstance(meta, Mapping):
            raise CheckpointError(f"meta must be a mapping, got {type(meta).__name__}")
        meta = json_copy({} if meta is None else meta)
        with self._cond:
            self._raise_error()
            if self._closed:
                raise CheckpointError("AsyncCheckpointWriter is closed")
            if self._pending is not None or self._running:
                if not wait:
                    self._skipped += 1
                    logger.debug("checkpoint of step %d skipped: a write is still in flight", step)
                    return False
                if not self._cond.wait_for(self._idle, timeout):
                    raise CheckpointError(f"checkpoint of step {step}: previous write still running after {timeout} s")
                self._raise_error()
            self._pending = _Job(step, model, arrays, meta, tables)
            self._cond.notify_all()
            return True

    def flush(self, timeout: float | None = None) -> None:
        """Wait until no write is queued or running; raise the error of a failed one.

        Parameters
        ----------
        timeout
            The most seconds to wait (then :class:`~streamfit.exceptions.CheckpointError`); None: no limit.
        """
        with self._cond:
            if not self._cond.wait_for(self._idle, timeout):
                raise CheckpointError(f"checkpoint write still running after {timeout} s")
            self._raise_error()

    def close(self, timeout: float | None = None) -> None:
        """Finish the pending write, stop the worker; idempotent.  Raises a failed write's error.

        Parameters
        ----------
        timeout
            The most seconds to wait (then :class:`~streamfit.exceptions.CheckpointError`); None: no limit.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise CheckpointError(f"checkpoint write still running after {timeout} s")
        with self._cond:
            self._raise_error()

    def __enter__(self) -> "AsyncCheckpointWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _idle(self) -> bool:
        return self._pending is None and not self._running

    def _raise_error(self) -> None:
        if self._error is not None:
            step, exc = self._error
            self._error = None
            raise CheckpointError(f"background checkpoint write of step {step} failed: {exc}") from exc

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                job = self._pending
                if job is None:  # closed, nothing left to write
                    return
                self._pending = None
                self._running = True
            start = time.perf_counter()
            try:
                path = self.store.save(job.step, job.model, job.arrays, job.meta, tables=job.tables)
            except Exception as exc:
                logger.error("background checkpoint write of step %d failed: %s", job.step, exc)
                with self._cond:
                    self._error = (job.step, exc)
            else:
                seconds = time.perf_counter() - start
                self._last = WriteResult(job.step, path, seconds)
                logger.debug("checkpoint of step %d written to %s in %.3f s", job.step, path, seconds)
            finally:
                del job  # drop the snapshot before waiting for the next one
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
