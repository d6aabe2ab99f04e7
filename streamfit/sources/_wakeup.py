"""Wake a task of the running event loop from a plain thread, without blocking that thread.

The one cross-thread primitive streamfit's own threads need (the loop's trainer thread, Kafka's fetch-ahead
thread), for both anyio backends: ``asyncio`` (``call_soon_threadsafe``) and ``trio`` (``run_sync_soon``).
"""

from __future__ import annotations

import asyncio
from typing import Callable

import anyio

__all__ = ["loop_caller", "Wakeup"]


def loop_caller() -> Callable[[Callable[[], object]], None]:
    """``call(fn)``: run ``fn()`` soon on the current event loop; safe from any thread, never blocks.

    Call this in the event loop.  When the loop has ended, ``call`` does nothing.
    """
    soon: Callable[[Callable[[], object]], object]
    try:
        soon = asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: anyio's other backend
        import trio

        soon = trio.lowlevel.current_trio_token().run_sync_soon

    def call(fn: Callable[[], object]) -> None:
        try:
            soon(fn)
        except Exception:  # the loop is closed (asyncio RuntimeError, trio RunFinishedError): nobody waits
            pass

    return call


class Wakeup:
    """One task waits (:meth:`wait`, in the loop); any thread wakes it (:meth:`set`), once.

    Create it in the event loop.  :meth:`set` may come before or after :meth:`wait` starts.
    """

    __slots__ = ("_event", "_call")

    def __init__(self, call: Callable[[Callable[[], object]], None] | None = None) -> None:
        self._event = anyio.Event()
        self._call = call if call is not None else loop_caller()

    def set(self) -> None:
        """From any thread."""
        self._call(self._event.set)

    async def wait(self) -> None:
        await self._event.wait()
