"""Estimator state <-> checkpoint contents: arrays go to the array file, everything else to JSON.

An estimator's ``state_dict()`` is a nested dict of numbers, strings and numpy arrays.  It is split
into named arrays (``"trainer/weights/W"``) and a JSON tree where each array is replaced by a reference,
so loading a checkpoint parses JSON and reads plain arrays: nothing in it can execute code.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from streamfit.exceptions import CheckpointError, ResumeError

__all__ = ["flatten_state", "unflatten_state", "snapshot_estimator", "restore_estimator"]

_REF = "__array__"


def flatten_state(state: Any, prefix: str = "") -> tuple[Any, dict[str, np.ndarray]]:
    """Split a nested state into a JSON-able tree and a dict of arrays (copies, safe to write later)."""
    arrays: dict[str, np.ndarray] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            return {str(k): walk(v, f"{path}/{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "O":
                raise CheckpointError(f"state entry {path!r} is an object array; only plain arrays are saved")
            arrays[path] = np.array(value, copy=True)
            return {_REF: path}
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise CheckpointError(f"state entry {path!r} has unsupported type {type(value).__name__}")

    return walk(state, prefix), arrays


def unflatten_state(tree: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """Inverse of :func:`flatten_state`."""
    if isinstance(tree, dict):
        if set(tree) == {_REF}:
            try:
                return arrays[tree[_REF]]
            except KeyError:
                raise CheckpointError(f"checkpoint state refers to a missing array {tree[_REF]!r}") from None
        return {k: unflatten_state(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [unflatten_state(v, arrays) for v in tree]
    return tree


def snapshot_estimator(estimator: Any) -> tuple[bytes, dict[str, np.ndarray], dict[str, Any]]:
    """(inference model bytes, arrays, JSON state tree) of a fitted streamfit estimator: host copies."""
    tree, arrays = flatten_state(estimator.state_dict())
    model = estimator.to_onnx().SerializeToString()
    return model, arrays, {"class": type(estimator).__name__, "state": tree}


def restore_estimator(estimator: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Load a snapshot into ``estimator`` (built from the same configuration as the one that saved it)."""
    saved = meta.get("class")
    if saved != type(estimator).__name__:
        raise ResumeError(f"the checkpoint holds a {saved}, but the configured estimator is a "
                              f"{type(estimator).__name__}")
    estimator.load_state_dict(unflatten_state(meta["state"], arrays))
