"""SIGTERM/SIGINT handled for a span of the daemon's life, the handlers before restored after."""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Callable, Iterator

__all__ = ["STOP_SIGNALS", "signals_handled"]

#: the signals that ask a daemon to stop
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_handled(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Call ``handler(signum, frame)`` on SIGTERM and SIGINT while the block runs (the main thread only, as
    ``signal.signal``), then put back the handlers that were there."""
    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
