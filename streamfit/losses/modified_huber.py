"""Modified Huber loss on raw scores, labels 0/1: a smoothed hinge, linear for badly wrong rows."""

from __future__ import annotations

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.losses.base import Loss
from streamfit.losses.hinge import signed

__all__ = ["ModifiedHuber"]


class ModifiedHuber(Loss):
    """With ``m = y z``: ``max(0, 1 - m)**2`` for ``m >= -1``, else ``-4 m`` (scikit-learn's SGDClassifier loss).

    dL/dz = -2 y max(0, 1 - m) for ``m >= -1``, else -4 y: continuous at ``m = -1``.

    >>> import numpy as np
    >>> ModifiedHuber().numpy(np.array([[-3.0], [0.5]]), np.array([[1.0], [1.0]]))
    (6.125, array([[-2. ],
           [-0.5]]))
    """

    name = "modified_huber"

    def terms(self, b: GraphBuilder, z: str, t: str) -> tuple[str, str]:
        y = signed(b, t)
        m = b.op("Mul", y, z)
        # clip(1 - m, 0, 2) is the quadratic part's slope/2 and equals 2 beyond m = -1
        gap = b.op("Clip", b.op("Sub", b.const(1.0), m), b.const(0.0), b.const(2.0))
        # loss = gap**2 + 4 * (gap_raw - gap) with gap_raw = 1 - m: -4m on the linear side
        excess = b.op("Relu", b.op("Sub", b.const(-1.0), m))
        loss = b.op("Add", b.op("Mul", gap, gap), b.op("Mul", excess, b.const(4.0)))
        return loss, b.op("Mul", b.op("Mul", y, gap), b.const(-2.0))

    def numpy_terms(self, z: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = 2.0 * t - 1.0
        m = y * z
        gap = np.clip(1.0 - m, 0.0, 2.0)
        return gap * gap + 4.0 * np.maximum(-1.0 - m, 0.0), -2.0 * y * gap
