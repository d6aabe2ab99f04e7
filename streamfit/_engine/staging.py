"""Reusable staging buffers for batches: allocated once per batch shape, then only copied into."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from onnxruntime.capi import _pybind_state as C

from streamfit._engine.device import Device

__all__ = ["Staging", "StagingCache"]


@dataclass
class Staging:
    """Host buffers for one batch shape (features, targets, sample weights) and their OrtValues.

    ``extra`` holds whatever a strategy binds per shape (its IOBindings).
    """

    x: np.ndarray
    t: np.ndarray
    sw: np.ndarray
    x_value: C.OrtValue
    t_value: C.OrtValue
    sw_value: C.OrtValue
    #: the model's output for this batch, computed by the step before the update (progressive validation)
    y: np.ndarray
    y_value: C.OrtValue
    extra: dict[str, Any] = field(default_factory=dict)
    sw_is_ones: bool = True

    def load(self, X: np.ndarray, T: np.ndarray, sw: np.ndarray | None) -> None:
        """Copy one batch in (a short last batch gets its own Staging, so shapes always match)."""
        np.copyto(self.x, X, casting="same_kind")
        np.copyto(self.t, T.reshape(self.t.shape), casting="same_kind")
        if sw is None:
            if not self.sw_is_ones:
                self.sw.fill(1)
                self.sw_is_ones = True
        else:
            np.copyto(self.sw, sw.reshape(self.sw.shape), casting="same_kind")
            self.sw_is_ones = False


class StagingCache:
    """The Staging of each batch shape seen recently (LRU, so a stream of odd sizes stays bounded)."""

    def __init__(self, device: Device, make_extra: Callable[[Staging], dict[str, Any]], size: int = 8) -> None:
        self.device = device
        self.make_extra = make_extra
        self.size = size
        self._cache: OrderedDict[tuple[Any, ...], Staging] = OrderedDict()

    def get(self, x_shape: tuple[int, ...], x_dtype: Any, t_shape: tuple[int, ...], t_dtype: Any,
            sw_shape: tuple[int, ...], y_shape: tuple[int, ...]) -> Staging:
        key = (x_shape, t_shape, sw_shape)
        staging = self._cache.get(key)
        if staging is not None:
            self._cache.move_to_end(key)
            return staging
        xv, x = self.device.staging(x_shape, x_dtype)
        tv, t = self.device.staging(t_shape, t_dtype)
        swv, sw = self.device.staging(sw_shape, x_dtype)
        sw.fill(1)
        yv, y = self.device.staging(y_shape, x_dtype)
        staging = Staging(x, t, sw, xv, tv, swv, y, yv)
        staging.extra = self.make_extra(staging)
        self._cache[key] = staging
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return staging

    def clear(self) -> None:
        self._cache.clear()
