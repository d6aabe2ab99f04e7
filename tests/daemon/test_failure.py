"""describe()/unwrap(): the real error under task-group wrappers, and its exit code."""

from __future__ import annotations

import asyncio

import pytest

from streamfit.daemon.failure import describe, unwrap
from streamfit.exceptions import (BadInputError, CheckpointError, ConfigError, CorruptCheckpointError, DivergenceError,
                                  InputMismatchError, ModelError, ResumeError, SourceError)


def test_unwrap_skips_cancellations_and_nesting():
    inner = DivergenceError("diverged")
    group = BaseExceptionGroup("outer", [asyncio.CancelledError(), ExceptionGroup("inner", [inner])])
    assert unwrap(group) == (inner, 0)
    two = ExceptionGroup("g", [SourceError("broker gone"), CheckpointError("disk full")])
    real, others = unwrap(two)
    assert isinstance(real, SourceError) and others == 1
    assert describe(two).message.endswith("(and 1 other error; --debug shows them)")


@pytest.mark.parametrize("exc, code, kind", [
    (BadInputError("x", reason="null", column="c", position={"row": 1}), 2, "bad_input"),
    (InputMismatchError("x", input="X"), 2, "bad_input"),
    (ConfigError("x"), 2, "configuration"),
    (ResumeError("x"), 2, "configuration"),
    (ModelError("x"), 2, "configuration"),
    (ValueError("eta0 must be > 0"), 2, "configuration"),
    (DivergenceError("x"), 1, "runtime"),
    (CheckpointError("x"), 1, "runtime"),
    (CorruptCheckpointError("x"), 1, "runtime"),
    (SourceError("x"), 1, "runtime"),
    (OSError(28, "No space left on device"), 1, "runtime"),
    (KeyError("oops"), 1, "internal"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_exit_codes(exc, code, kind):
    failure = describe(ExceptionGroup("unhandled errors in a TaskGroup", [exc]) if isinstance(exc, Exception)
                       else exc)
    assert (failure.exit_code, failure.kind) == (code, kind)
    assert "\n" not in failure.line("serve")
    if kind == "internal":
        assert failure.message.startswith("internal error: KeyError") and "--debug" in failure.message


def test_multi_line_messages_become_one_line():
    failure = describe(SourceError("first line\n  second line\n\n"))
    assert failure.line("train") == "streamfit train: SourceError: first line; second line"
