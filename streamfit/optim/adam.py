"""Adam (Kingma & Ba, Algorithm 1, as PyTorch computes it): per-weight adaptive step sizes."""

from __future__ import annotations

import math
from itertools import repeat
from typing import Mapping

import numpy as np

from streamfit._engine.common.graph_builder import GraphBuilder
from streamfit.optim.base import Optimizer, check_range

__all__ = ["Adam"]


class Adam(Optimizer):
    """``m, v`` moving averages of g and g**2; ``w -= lr * m_hat / (sqrt(v_hat) + eps)``.

    The bias corrections are folded into two scalars fed each step (``step_size = lr / (1 - b1**t)``
    and ``inv_sqrt_bc2 = 1 / sqrt(1 - b2**t)``), so the graph has no power or step counter.

    The betas are taken as float32 values (:meth:`betas`) in the moments' coefficients ``b`` and ``1 - b`` and in
    the corrections alike, as onnxruntime-training's Adam kernel takes them: then ``v / (1 - b2**t)`` is an exact
    average of the squared gradients, and the kernel, where a lean step runs it, computes this rule
    (PyTorch's ``1 - beta2`` in float64 is 1.3e-5 off float32's ``1 - 0.999``).

    Parameters
    ----------
    beta1, beta2
        Decay rates of the moving averages of the gradient and of its square, in [0, 1] (PyTorch's
        ``betas``).
    eps
        Added to ``sqrt(v_hat)`` so a coordinate with no gradient yet does not divide by zero.

    Examples
    --------
    >>> import numpy as np
    >>> opt = Adam()
    >>> s = dict(zip(opt.scalar_names, opt.scalars(0.1, 0)))
    >>> opt.numpy_update(np.array([1.0]), np.array([3.0]), opt.init_state(np.zeros(1)), s)[0].round(6)
    array([0.9])
    """

    name = "adam"
    slots = ("exp_avg", "exp_avg_sq")
    scalar_names = ("lr", "step_size", "inv_sqrt_bc2")

    def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.beta1 = check_range("beta1", beta1, 0.0, 1.0)
        self.beta2 = check_range("beta2", beta2, 0.0, 1.0)
        self.eps = check_range("eps", eps, 0.0)

    def betas(self) -> tuple[float, float]:
        """``beta1`` and ``beta2`` as the rule uses them: rounded to float32 (see the class docstring).

        >>> Adam().betas()[1]
        0.9990000128746033
        """
        return float(np.float32(self.beta1)), float(np.float32(self.beta2))

    def scalars(self, lr: float, t: int) -> tuple[float, ...]:
        step = t + 1
        b1, b2 = self.betas()
        return lr, lr / (1.0 - b1 ** step), 1.0 / math.sqrt(1.0 - b2 ** step)

    def scalars_of_steps(self, lrs: np.ndarray, t: int) -> np.ndarray:
        if type(self).scalars is not Adam.scalars:
            return super().scalars_of_steps(lrs, t)
        lrs = np.asarray(lrs, np.float64)
        bc1, bc2 = (_corrections(b, t + 1, len(lrs)) for b in self.betas())
        out = np.empty((len(lrs), 3))  # the columns written in place: lr, lr / bc1, 1 / sqrt(bc2)
        out[:, 0] = lrs
        np.divide(lrs, bc1, out=out[:, 1])
        np.divide(1.0, np.sqrt(bc2, out=out[:, 2]), out=out[:, 2])
        return out

    def _moments(self, b: GraphBuilder, g: str, state: Mapping[str, str]) -> tuple[str, str]:
        b1, b2 = self.betas()
        m = b.op("Add", b.op("Mul", state["exp_avg"], b.const(b1)), b.op("Mul", g, b.const(1.0 - b1)))
        v = b.op("Add", b.op("Mul", state["exp_avg_sq"], b.const(b2)),
                 b.op("Mul", b.op("Mul", g, g), b.const(1.0 - b2)))
        return m, v

    def _step(self, b: GraphBuilder, w: str, m: str, v: str, s: Mapping[str, str]) -> str:
        denom = b.op("Add", b.op("Mul", b.op("Sqrt", v), s["inv_sqrt_bc2"]), b.const(self.eps))
        return b.op("Sub", w, b.op("Mul", b.op("Div", m, denom), s["step_size"]))

    def update(self, b: GraphBuilder, w: str, g: str, state: Mapping[str, str],
               s: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        m, v = self._moments(b, g, state)
        return self._step(b, w, m, v, s), {"exp_avg": m, "exp_avg_sq": v}

    def _np_step(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                 s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        b1, b2 = self.betas()
        m = b1 * state["exp_avg"] + (1 - b1) * g
        v = b2 * state["exp_avg_sq"] + (1 - b2) * g * g
        w_new = w - s["step_size"] * m / (np.sqrt(v) * s["inv_sqrt_bc2"] + self.eps)
        return w_new, {"exp_avg": m, "exp_avg_sq": v}

    def numpy_update(self, w: np.ndarray, g: np.ndarray, state: Mapping[str, np.ndarray],
                     s: Mapping[str, float]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return self._np_step(w, g, state, s)


def _corrections(beta: float, first: int, n: int) -> np.ndarray:
    """``1 - beta ** s`` for the ``n`` steps from ``first`` (read-only), with the powers :meth:`Adam.scalars`
    computes (the C library's ``pow``, as Python's ``**``: numpy's vectorized power may differ in the last bit);
    all 1 once the power is too small to change 1.  The values of the first ``_TABLE_STEPS`` steps are computed
    once per beta and sliced (a chunk of 256 one-row steps paid 25 us for the powers)."""
    if n and beta ** first < _NEGLIGIBLE:  # and every later power: 1 - p rounds to 1 for p <= 2**-54
        return np.ones(n)
    end = first + n  # the steps first, ..., end - 1: table entries first - 1, ..., end - 2
    if end - 1 > _TABLE_STEPS:
        return 1.0 - np.fromiter(map(math.pow, repeat(beta, n), range(first, end)), np.float64, n)
    table = _TABLES.get(beta)
    if table is None or len(table) < end - 1:
        have = 0 if table is None else len(table)
        size = min(_TABLE_STEPS, max(end - 1, 2 * have, 1024))
        more = 1.0 - np.fromiter(map(math.pow, repeat(beta, size - have), range(have + 1, size + 1)), np.float64,
                                 size - have)
        table = _TABLES[beta] = more if table is None else np.concatenate([table, more])
        table.flags.writeable = False
    return table[first - 1:end - 1]  # a read-only view


#: a power below this leaves ``1 - p == 1.0`` (with room for the rounding of later, smaller powers)
_NEGLIGIBLE = 2.0 ** -60
#: ``1 - beta ** s`` for s = 1, 2, ..., per beta, grown on demand up to ``_TABLE_STEPS`` steps (512 KB a beta)
_TABLES: dict[float, np.ndarray] = {}
_TABLE_STEPS = 1 << 16
