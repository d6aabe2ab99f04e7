"""Absolute error ``|y - t|``: robust to outliers; dL/dY = sign(y - t) (onnxcustom had the sign wrong)."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss

__all__ = ["AbsoluteError"]


class AbsoluteError(Loss):
    """Absolute error, averaged over rows.

    >>> import numpy as np
    >>> AbsoluteError().numpy(np.array([[3.0]]), np.array([[1.0]]))
    (2.0, array([[1.]]))
    """

    name = "absolute_error"

    def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
        r = b.op("Sub", y, t)
        return b.op("Abs", r), b.op("Sign", r)

    def numpy_terms(self, y: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = y - t
        return np.abs(r), np.sign(r)
