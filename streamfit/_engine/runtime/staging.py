"""Reusable staging buffers for batches: allocated once per batch shape, then only copied into."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from streamfit._engine.common import ort_private as C

from streamfit._engine.runtime.device import Device

__all__ = ["Staging", "StagingCache"]


@dataclass
class Staging:
    """Host buffers for one batch shape (each model input, targets, per-row weights) and their OrtValues.

    ``xs``/``x_values`` hold one buffer per model input, in model order, each of its declared dtype.

    The loss graph takes the sample weights as two per-row vectors, ``lw = loss_factor * sw / N`` and
    ``gw = grad_scale * sw``; without sample weights they are constant, so they are rewritten only when
    ``grad_scale`` changes (a learning-rate schedule in the fused SGD step) or weights come and go.
    ``extra`` holds whatever a strategy binds per shape (its IOBindings).
    """

    xs: tuple[np.ndarray, ...]
    t: np.ndarray
    lw: np.ndarray
    gw: np.ndarray
    x_values: tuple[C.OrtValue, ...]
    t_value: C.OrtValue
    lw_value: C.OrtValue
    gw_value: C.OrtValue
    #: the model's output for this batch, computed by the step before the update (progressive validation)
    y: np.ndarray
    y_value: C.OrtValue
    loss_factor: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)
    #: what lw/gw hold now: sample weights (True) or none, for which grad_scale (nan: not filled yet)
    _weighted: bool = False
    _grad_scale: float = float("nan")
    _t_view: np.ndarray | None = None

    @property
    def n(self) -> int:
        """Rows in the batch."""
        return self.lw.shape[0]

    def load(self, X: tuple[np.ndarray, ...], T: np.ndarray, sw: np.ndarray | None, grad_scale: float) -> None:
        """Copy one batch in; each array of ``X`` has exactly its buffer's shape, ``T`` as many elements as ``t``.

        The caller has checked the shapes and that the arrays' kinds fit the buffers (plain assignment casts
        as ``same_kind`` would for them); a short last batch gets its own Staging.
        """
        for buf, a in zip(self.xs, X):
            buf[...] = a
        view = self._t_view
        if view is None or view.shape != T.shape:
            view = self._t_view = self.t.reshape(T.shape)
        view[...] = T
        if sw is None:
            if self._weighted or grad_scale != self._grad_scale:  # nan != anything: first fill
                self.lw.fill(self.loss_factor / self.lw.shape[0])
                self.gw.fill(grad_scale)
                self._weighted, self._grad_scale = False, grad_scale
        else:
            sw = sw.reshape(self.lw.shape)
            np.multiply(sw, self.loss_factor / self.lw.shape[0], out=self.lw, casting="same_kind")
            np.multiply(sw, grad_scale, out=self.gw, casting="same_kind")
            self._weighted, self._grad_scale = True, grad_scale


class StagingCache:
    """The Staging of each batch shape seen recently (LRU, so a stream of odd sizes stays bounded)."""

    def __init__(self, device: Device, make_extra: Callable[[Staging], dict[str, Any]], size: int = 8,
                 loss_factor: float = 1.0) -> None:
        self.device = device
        self.make_extra = make_extra
        self.size = size
        self.loss_factor = loss_factor
        self._cache: OrderedDict[tuple[Any, ...], Staging] = OrderedDict()

    def get(self, x_shapes: tuple[tuple[int, ...], ...], x_dtypes: tuple[Any, ...], t_shape: tuple[int, ...],
            t_dtype: Any, sw_shape: tuple[int, ...], y_shape: tuple[int, ...], dtype: Any) -> Staging:
        """The Staging for inputs of ``x_shapes``/``x_dtypes`` (model order); ``dtype`` is the weights' float
        type (row weights and the output)."""
        key = (x_shapes, t_shape, sw_shape)
        staging = self._cache.get(key)
        if staging is not None:
            self._cache.move_to_end(key)
            return staging
        pairs = [self.device.staging(shape, dt) for shape, dt in zip(x_shapes, x_dtypes)]
        tv, t = self.device.staging(t_shape, t_dtype)
        lwv, lw = self.device.staging(sw_shape, dtype)
        gwv, gw = self.device.staging(sw_shape, dtype)
        yv, y = self.device.staging(y_shape, dtype)
        staging = Staging(tuple(p[1] for p in pairs), t, lw, gw, tuple(p[0] for p in pairs), tv, lwv, gwv, y, yv,
                          loss_factor=self.loss_factor)
        staging.extra = self.make_extra(staging)
        self._cache[key] = staging
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return staging

    def clear(self) -> None:
        self._cache.clear()
