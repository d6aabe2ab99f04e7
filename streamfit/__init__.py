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

# Ready-made online models and the scikit-learn bridge.
from streamfit._sklearn import from_sklearn  # noqa: E402
from streamfit.models import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor  # noqa: E402

__all__ += ["LinearRegressor", "LogisticRegression", "MLPRegressor", "MLPClassifier", "from_sklearn"]
