"""streamfit: asynchronous, streaming, online training of ONNX models with onnxruntime-training.

The public face; internals live in private modules (``_engine``, ``_stream``, ...).  Names are imported
on first use, so ``import streamfit.checkpoint`` (a serving process reading checkpoints) does not load
onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from streamfit.exceptions import (BadInputError, CheckpointError, ConfigError, CorruptCheckpointError,
                                  DivergenceError, InputMismatchError, ModelError, NonFiniteError, OptionError, ResumeError,
                                  SourceError, StreamfitError)

__version__ = "0.1.0"

_LAZY = {
    "Trainer": "streamfit._engine.trainer",
    "OnnxRegressor": "streamfit.estimators",
    "OnnxClassifier": "streamfit.estimators",
    "LinearRegressor": "streamfit.models",
    "LogisticRegression": "streamfit.models",
    "MLPRegressor": "streamfit.models",
    "MLPClassifier": "streamfit.models",
    "FMClassifier": "streamfit.models",
    "FMRegressor": "streamfit.models",
    "from_sklearn": "streamfit._sklearn",
    "Penalty": "streamfit.penalties",
    "train_stream": "streamfit._stream",
    "train_stream_sync": "streamfit._stream",
    "StreamSummary": "streamfit._stream",
    "StreamLoop": "streamfit._stream",
    "StreamOptions": "streamfit._stream",
    "LoopState": "streamfit._stream",
    "BatchEvent": "streamfit._stream",
    "MetricsEvent": "streamfit._stream",
    "IdleEvent": "streamfit._stream",
    "Skipped": "streamfit._stream",
    "Span": "streamfit._stream",
    "open_source": "streamfit.sources",
    "Runner": "streamfit.daemon",
    "DeadLetter": "streamfit._stream",
    "DeadLetterSink": "streamfit._stream",
    "open_dead_letter": "streamfit._stream",
    "read_dead_letters": "streamfit._stream",
}
_SUBMODULES = {"losses", "optim", "schedules", "sources", "checkpoint", "daemon", "estimators", "models", "graph",
               "testing", "features", "penalties", "river"}

__all__ = [
    "__version__", *_LAZY, *sorted(_SUBMODULES),
    "StreamfitError", "ModelError", "NonFiniteError", "BadInputError", "InputMismatchError", "ConfigError", "OptionError", "SourceError",
    "CheckpointError", "ResumeError", "CorruptCheckpointError", "DivergenceError",
]


def __getattr__(name: str) -> Any:
    # not cached in globals(): doctest would then find the re-exported classes here too and run their
    # examples twice (they are collected in their defining modules, see streamfit._public)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"streamfit.{name}")
    raise AttributeError(f"module 'streamfit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from streamfit import (checkpoint, daemon, estimators, features, graph, losses, models, optim, penalties, river,
                           schedules, sources, testing)
    from streamfit._engine.trainer import Trainer
    from streamfit._sklearn import from_sklearn
    from streamfit._stream import (BatchEvent, DeadLetter, DeadLetterSink, IdleEvent, LoopState, MetricsEvent, Skipped,
                                   Span, StreamLoop, StreamOptions, StreamSummary, open_dead_letter, read_dead_letters,
                                   train_stream, train_stream_sync)
    from streamfit.daemon import Runner
    from streamfit.estimators import OnnxClassifier, OnnxRegressor
    from streamfit.models import (FMClassifier, FMRegressor, LinearRegressor, LogisticRegression, MLPClassifier,
                                  MLPRegressor)
    from streamfit.penalties import Penalty
    from streamfit.sources import open_source
