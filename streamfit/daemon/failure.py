"""How a failed ``streamfit`` command ends: the real error under task-group wrappers, an exit code, one line.

Exit codes: 0 success, 1 a runtime failure (divergence, a checkpoint or source that fails, an internal
error), 2 bad input or configuration (flags, config file, a parameter value, the model, a refused resume,
rows the policy refuses), 130 interrupted.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from typing import Any

from streamfit.exceptions import BadInputError, ConfigError, ModelError, StreamfitError

if sys.version_info >= (3, 11):
    _Group: Any = BaseExceptionGroup  # noqa: F821 - a builtin from 3.11
else:  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup as _Group

__all__ = ["EXIT_OK", "EXIT_RUNTIME", "EXIT_BAD_INPUT", "EXIT_INTERRUPTED", "Failure", "describe", "unwrap"]

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def unwrap(exc: BaseException) -> tuple[BaseException, int]:
    """The error an exception group stands for (its first leaf that is not a cancellation), and how many
    other real errors it held.

    >>> unwrap(ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("x")]))
    (ValueError('x'), 0)
    """
    others = 0
    while isinstance(exc, _Group):
        leaves = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        others += max(len(leaves) - 1, 0)
        exc = (leaves or list(exc.exceptions))[0]
    return exc, others


@dataclass(frozen=True)
class Failure:
    """A failed command, described once for the plain line and the JSON log line."""

    error: BaseException
    exit_code: int
    kind: str  # "bad_input" | "configuration" | "runtime" | "internal" | "interrupted"
    message: str  # one line
    fields: dict[str, Any] = field(default_factory=dict)

    def line(self, command: str) -> str:
        """The one line printed on stderr."""
        return f"streamfit {command}: {self.message}"


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in text.strip().splitlines() if part.strip()) or "(no message)"


def describe(exc: BaseException) -> Failure:
    """Classify ``exc`` (an exception group is unwrapped first): exit code, kind and one line.

    >>> f = describe(ExceptionGroup("", [BadInputError("column 'x' is null", reason="null", column="x")]))
    >>> f.exit_code, f.kind, f.message
    (2, 'bad_input', "BadInputError: column 'x' is null")
    """
    real, others = unwrap(exc)
    text = _one_line(str(real))
    name = type(real).__name__
    fields: dict[str, Any] = {"error": name}
    if isinstance(real, KeyboardInterrupt):
        return Failure(real, EXIT_INTERRUPTED, "interrupted", "interrupted", fields)
    if isinstance(real, BadInputError):
        code, kind = EXIT_BAD_INPUT, "bad_input"
        fields.update(reason=real.reason, column=real.column, position=real.position)
    elif isinstance(real, (ConfigError, ModelError)) or (
            isinstance(real, ValueError) and not isinstance(real, StreamfitError)):
        code, kind = EXIT_BAD_INPUT, "configuration"  # a plain ValueError: a parameter refused by its validation
    elif isinstance(real, StreamfitError):
        code, kind = EXIT_RUNTIME, "runtime"
    elif isinstance(real, OSError):
        code, kind = EXIT_RUNTIME, "runtime"
    else:
        code, kind = EXIT_RUNTIME, "internal"
    if kind == "internal":  # not an error streamfit raises on purpose: a bug, say so
        message = f"internal error: {name}: {text} (run with --debug for the traceback)"
    elif isinstance(real, ValueError) and not isinstance(real, StreamfitError):
        message = f"error: {text}"
    else:
        message = f"{name}: {text}"
    if others:
        message += f" (and {others} other error{'s' if others > 1 else ''}; --debug shows them)"
    return Failure(real, code, kind, message, fields)
