"""Shared helpers of the engine tests: finite differences and a numpy linear-model reference."""

from __future__ import annotations

from typing import Callable

import numpy as np


def finite_difference(f: Callable[[], float], array: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of ``f()`` with respect to every element of ``array`` (modified in place)."""
    grad = np.zeros_like(array)
    flat, gflat = array.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        up = f()
        flat[i] = keep - eps
        down = f()
        flat[i] = keep
        gflat[i] = (up - down) / (2 * eps)
    return grad
