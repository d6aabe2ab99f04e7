"""The loop's step thread: one long-lived anyio worker thread runs every training step.

Why not ``anyio.to_thread.run_sync`` per batch: it yields to the event loop before handing the step over,
so the reader's work (rebatching, the source) ran between two steps, on the critical path.  Handing a step
to a waiting thread does not yield: the reader works while the model trains.  The thread is an anyio
worker thread (``anyio.from_thread`` works inside the estimator, as before).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import anyio

from streamfit.sources._wakeup import Wakeup, loop_caller

__all__ = ["StepThread"]

_PICKUP_WAIT = 0.002  # s


class _Job:
    __slots__ = ("fn", "args", "wakeup", "ok", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], wakeup: Wakeup) -> None:
        self.fn, self.args, self.wakeup = fn, args, wakeup
        self.ok = False
        self.value: Any = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
            self.ok = True
        except BaseException as exc:  # re-raised in the event loop
            self.value = exc
        self.wakeup.set()


class StepThread:
    """Start with ``await task_group.start(trainer.serve)``; :meth:`run` steps; :meth:`close` always (finally).

    A step is never interrupted: a cancellation of :meth:`run` waits for the running step to finish.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._call: Callable[[Callable[[], object]], None] | None = None
        self._closed = False
        #: True while the thread serves steps (it is an anyio worker thread: it then returns to anyio's pool).
        self.serving = False
        self._picked = threading.Event()  # the thread took the job handed over last

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """A task of the loop: the thread serves steps until :meth:`close`."""
        self._call = loop_caller()
        with anyio.CancelScope(shield=True):  # once started, the thread runs until close(): no job is stranded
            task_status.started()
            await anyio.to_thread.run_sync(self._main)

    def _main(self) -> None:
        self.serving = True
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                self._picked.set()
                job.run()
        finally:
            self.serving = False

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the thread (handed over without yielding); its result, or its exception."""
        if self._closed or self._call is None:
            raise RuntimeError("the trainer thread is not running")
        job = _Job(fn, args, Wakeup(self._call))
        self._picked.clear()
        self._jobs.put(job)
        # Let the thread start the step before the event loop goes on: the reader runs next and holds the
        # GIL in bursts (copies into the next batch); the step's Python prologue would wait for them.  Bounded
        # (a busy machine may not run the thread at once); the GIL returns when the step enters ONNX Runtime.
        self._picked.wait(_PICKUP_WAIT)
        with anyio.CancelScope(shield=True):
            await job.wakeup.wait()
        if job.ok:
            return job.value
        raise job.value

    def close(self) -> None:
        """The thread ends after the steps already handed over; idempotent."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
