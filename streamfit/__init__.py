"""streamfit: asynchronous, streaming, online training of ONNX models with onnxruntime-training.

The public face; internals live in private modules (``_engine``, ``_stream``, ...).
"""

from __future__ import annotations

from streamfit import losses, optim, schedules
from streamfit._engine.trainer import Trainer
from streamfit.estimators import OnnxClassifier, OnnxRegressor
from streamfit.exceptions import (BadInputError, CheckpointError, CorruptCheckpointError, DivergenceError,
                                  ModelError, NonFiniteError, SourceError, StreamfitError)
from streamfit.penalties import Penalty

__version__ = "0.1.0"

__all__ = [
    "__version__", "Trainer", "OnnxRegressor", "OnnxClassifier", "Penalty", "losses", "optim", "schedules",
    "StreamfitError", "ModelError", "NonFiniteError", "BadInputError", "SourceError", "CheckpointError",
    "CorruptCheckpointError", "DivergenceError",
]
