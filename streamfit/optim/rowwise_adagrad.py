"""Row-wise AdaGrad: one accumulator per row of a weight (the mean of its squared gradients), as FBGEMM's and
TorchRec's row-wise AdaGrad for embedding tables: a 16th of the state of element-wise AdaGrad at dim 16."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.adagrad import AdaGrad

__all__ = ["RowWiseAdaGrad"]


class RowWiseAdaGrad(AdaGrad):
    """``s[r] <- s[r] + mean(g[r]**2); w[r] <- w[r] - lr * g[r] / (sqrt(s[r]) + eps)`` for each row ``r``.

    The state of a weight of shape ``(rows, ...)`` has shape ``(rows, 1, ...)``; a 1-D weight has one
    accumulator per element (plain AdaGrad).

    Parameters
    ----------
    eps, initial_accumulator_value
        As for :class:`AdaGrad` (one accumulator per row instead of per element: a table's state is a
        column, not a copy of the table).

    Examples
    --------
    >>> import numpy as np
    >>> opt = RowWiseAdaGrad()
    >>> w, st = opt.numpy_update(np.ones((1, 2)), np.array([[3.0, 4.0]]), opt.init_state(np.ones((1, 2))), {"lr": 0.1})
    >>> st["sum_sq"].tolist(), w.round(4).tolist()
    ([[12.5]], [[0.9151, 0.8869]])
    """

    name = "rowwise_adagrad"
    shaped = True  # parameters, slot name and zero-gradient behaviour are AdaGrad's; the state is per row

    @staticmethod
    def _slot_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape[:1] + (1,) * (len(shape) - 1)

    def init_state(self, w: np.ndarray) -> dict[str, np.ndarray]:
        return {"sum_sq": np.full(self._slot_shape(w.shape), self.initial_accumulator_value, dtype=w.dtype)}

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str], shape: tuple[int, ...] = ()) -> tuple[str, dict[str, str]]:
        sq = b.op("Mul", g, g)
        if len(shape) >= 2:  # mean over each row, as a MatMul with a 1/k column (no opset-dependent Reduce);
            k = int(np.prod(shape[1:]))  # the number of rows is not needed (Reshape's 0 keeps it)
            flat = b.op("Reshape", sq, b.const([0, k], np.int64))
            mean = b.op("MatMul", flat, b.const(np.full((k, 1), 1.0 / k)))
            sq = b.op("Reshape", mean, b.const([0] + [1] * (len(shape) - 1), np.int64))
        acc = b.op("Add", state["sum_sq"], sq)
        step = b.op("Div", b.op("Mul", g, s["lr"]), b.op("Add", b.op("Sqrt", acc), b.const(self.eps)))
        return b.op("Sub", w, step), {"sum_sq": acc}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        sq = g * g
        if g.ndim >= 2:
            sq = sq.reshape(len(g), -1).mean(axis=1).reshape(self._slot_shape(g.shape))
        acc = state["sum_sq"] + sq
        return w - s["lr"] * g / (np.sqrt(acc) + self.eps), {"sum_sq": acc}
