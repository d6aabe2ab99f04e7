"""streamfit's exception tree: every error a user can meet derives from :class:`StreamfitError`.

Third-party errors (onnxruntime, pyarrow, Kafka clients) are translated at the boundary and
chained with ``raise ... from exc`` so the original cause stays visible.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "StreamfitError",
    "ModelError",
    "NonFiniteError",
    "BadInputError",
    "InputMismatchError",
    "ConfigError",
    "OptionError",
    "SourceError",
    "CheckpointError",
    "ResumeError",
    "CorruptCheckpointError",
    "DivergenceError",
]


class StreamfitError(Exception):
    """Base class of every streamfit error."""


class ModelError(StreamfitError, ValueError):
    """The ONNX model cannot be trained as asked (unknown weight, nothing to train, unloadable)."""


class NonFiniteError(StreamfitError, FloatingPointError):
    """A training step produced a non-finite loss, gradient or weight; the step was not applied.

    Parameters
    ----------
    message
        What was not finite, and where.
    step, what
        The step that was refused (counted from 1), and what was not finite (``"loss"``, or ``"gradients or
        updated weights"``), when known.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit import Trainer
    >>> from streamfit.testing import linear_model
    >>> trainer = Trainer(linear_model(2), learning_rate=1e30)
    >>> try:
    ...     trainer.step(np.full((4, 2), 1e20, np.float32), np.ones(4, np.float32))
    ... except NonFiniteError as exc:
    ...     print(exc.step, exc.what, trainer.n_steps)
    1 gradients or updated weights 0
    """

    def __init__(self, message: str, *, step: int | None = None, what: str | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.what = what


class BadInputError(StreamfitError, ValueError):
    """Input data does not match what the model expects.

    ``column``, ``position`` and ``reason`` say where and why, so the caller can find the bad rows.

    Parameters
    ----------
    message
        What was found and what was expected.
    reason
        The skip reason it counts under (``"null"``, ``"wrong_type"``, ``"missing_column"``...).
    column, position
        The column at fault and the source position of the bad input, when known.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit import LinearRegressor
    >>> try:
    ...     LinearRegressor().partial_fit(np.array([[1.0, np.nan]]), [1.0])
    ... except BadInputError as exc:
    ...     print(exc.reason, exc.position, "|", exc)
    non_finite (0, 1) | Input X contains NaN or infinity (first at row 0, column 1)
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str = "bad_input",
        column: str | None = None,
        position: Any = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.column = column
        self.position = position


class InputMismatchError(ModelError, BadInputError):
    """Data given for a model input does not fit what the model declares (name, element type, rank,
    fixed dim); ``column`` holds the input's name.  Both a :class:`ModelError` (the data and the model
    disagree, whatever the rows) and a :class:`BadInputError` (``reason="input_mismatch"``).

    Parameters
    ----------
    message
        What the data and the model declare.
    input
        The model input's name (also in ``column``).
    reason
        The skip reason (``"input_mismatch"``).
    """

    def __init__(self, message: str, *, input: str | None = None, reason: str = "input_mismatch") -> None:
        super().__init__(message, reason=reason, column=input)
        self.input = input


class ConfigError(StreamfitError, ValueError):
    """A run's configuration is invalid: a flag, a config-file key or value, options that contradict each other."""


class OptionError(ConfigError, TypeError):
    """An option of the stream (:class:`~streamfit.StreamOptions`) is unknown, misspelt or has an invalid value.

    Also a ``TypeError`` (what Python raises for an unexpected keyword argument); ``option`` names it.

    Parameters
    ----------
    message
        The option, its value and what was expected.
    option
        The option's name, when one is at fault.
    """

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class SourceError(StreamfitError):
    """A data source failed (file unreadable, socket closed, broker unreachable)."""


class CheckpointError(StreamfitError):
    """A checkpoint cannot be written or read."""


class ResumeError(CheckpointError, ConfigError):
    """A resume refused because the run's configuration and its checkpoints disagree: a fresh run over
    existing checkpoints, another estimator, column plan or classes than the checkpoint holds."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint is incomplete, fails its checksums or contains forbidden content (pickle)."""


class DivergenceError(StreamfitError):
    """Training kept diverging after the allowed number of rollbacks."""
