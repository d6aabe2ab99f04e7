"""Estimator state <-> checkpoint contents: arrays go to the array file, everything else to JSON.

An estimator's ``state_dict()`` is a nested dict of numbers, strings and numpy arrays.  It is split
into named arrays (``"trainer/weights/W"``) and a JSON tree where each array is replaced by a reference,
so loading a checkpoint parses JSON and reads plain arrays: nothing in it can execute code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Mapping

import numpy as np

from streamfit.checkpoint import ArrayBlocks, RowDelta, TableArrays
from streamfit.exceptions import CheckpointError, ResumeError

__all__ = ["flatten_state", "unflatten_state", "snapshot_estimator", "restore_estimator", "TableSnapshot",
           "estimator_tables", "snapshot_tables"]

_REF = "__array__"


def flatten_state(state: Any, prefix: str = "", live: Mapping[int, Any] | None = None,
                  found: dict[str, Any] | None = None) -> tuple[Any, dict[str, np.ndarray]]:
    """Split a nested state into a JSON-able tree and a dict of arrays (copies, safe to write later).

    Arrays whose ``id`` is a key of ``live`` are not copied: their path goes to ``found`` (path -> the
    value ``live`` maps them to) and the tree refers to them as to the others."""
    arrays: dict[str, np.ndarray] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, Mapping):
            return {str(k): walk(v, f"{path}/{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "O":
                raise CheckpointError(f"state entry {path!r} is an object array; only plain arrays are saved")
            if live is not None and found is not None and id(value) in live:
                found[path] = live[id(value)]
                return {_REF: path}
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
    """(inference model bytes, arrays, JSON state tree) of a fitted streamfit estimator: host copies.

    Parameters
    ----------
    estimator
        A fitted streamfit estimator.
    """
    tree, arrays = flatten_state(estimator.state_dict())
    model = estimator.to_onnx().SerializeToString()
    return model, arrays, {"class": type(estimator).__name__, "state": tree}


def restore_estimator(estimator: Any, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Load a snapshot into ``estimator`` (built from the same configuration as the one that saved it).

    Parameters
    ----------
    estimator
        A new estimator of the configuration that saved the snapshot.
    meta, arrays
        The snapshot's JSON state tree and arrays (:func:`snapshot_estimator`'s last two, as a checkpoint
        holds them).
    """
    saved = meta.get("class")
    if saved != type(estimator).__name__:
        raise ResumeError(f"the checkpoint holds a {saved}, but the configured estimator is a "
                              f"{type(estimator).__name__}")
    try:
        estimator.load_state_dict(unflatten_state(meta["state"], arrays))
    except (KeyError, ValueError) as exc:  # another optimizer, table size, factor count, ... than the checkpoint's
        if isinstance(exc, CheckpointError):
            raise
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ResumeError(f"the checkpoint does not fit the configured {saved}: {reason}; a run keeps its estimator's "
                          "parameters (configure the ones it was trained with, or start a new run)") from exc


@dataclass(frozen=True, eq=False)
class TableSnapshot:
    """An estimator's state with its large tables kept apart: what a chain checkpoint writes.

    ``arrays`` are copies of everything small; ``tables`` the large arrays (weights and optimizer state of
    the row-sparse tables), whole (a full) or as the rows touched since the last checkpoint (a delta);
    ``model`` is the inference model with the tables' initializers empty, filled back per ``tables.model_fill``.
    """

    model: bytes
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]
    tables: TableArrays
    #: per table array name: the rows touched since the previous checkpoint (a full's, for a publisher)
    changed: dict[str, np.ndarray]


def estimator_tables(estimator: Any) -> Any:
    """The row-sparse tables of a fitted estimator's trainer (``SparseTables``), or ``None``."""
    trainer = getattr(estimator, "trainer_", None)
    tables = getattr(trainer, "tables", None)
    return tables if tables is not None and tables.tables else None


def frozen_arrays(tables: Any) -> dict[str, np.ndarray]:
    """The live arrays of ``tables`` (a ``SparseTables``) by the names its snapshots use."""
    live = dict(tables.arrays)
    for st in tables.state_arrays().values():
        live.update(st)
    return live


def snapshot_tables(estimator: Any, parent: int | None, compact: bool = False, copy: bool = False
                    ) -> TableSnapshot:
    """Snapshot ``estimator`` for a chain checkpoint: a full (``parent is None``) or a delta after checkpoint
    ``parent`` (only the rows touched since the tracker was cleared, copied).

    A full's tables are a copy-on-write snapshot (:class:`~streamfit.checkpoint.ArrayBlocks`: nothing copied
    now; the writer streams them, the steps meanwhile save aside the rows they overwrite), to be handed to
    one writer; ``copy=True`` copies them whole instead (an in-memory rollback point).

    Nothing table-sized is copied or serialized for a delta: the state tree is read with the live tables
    lent, and the model exported with them empty.  ``compact``: the delta is to be written as a full (by the
    store, from the chain on disk).  The caller clears the tracker once the snapshot is taken for good."""
    tables = estimator_tables(estimator)
    if tables is None:
        raise CheckpointError(f"{type(estimator).__name__} has no row-sparse tables to checkpoint apart")
    live: dict[int, tuple[str, np.ndarray]] = {}
    for name, array in tables.arrays.items():
        live[id(array)] = (name, array)
    for name, slots in tables.state_arrays().items():
        for array in slots.values():
            live[id(array)] = (name, array)
    found: dict[str, tuple[str, np.ndarray]] = {}
    with tables.lend("live"):
        tree, arrays = flatten_state(estimator.state_dict(), live=live, found=found)
    if len(found) != len(live):
        raise CheckpointError(f"the state of {type(estimator).__name__} does not hold its tables' arrays as the "
                              f"trainer does ({len(found)} of {len(live)} found)")
    with tables.lend("empty"):
        model = estimator.to_onnx().SerializeToString()
    by_array = {id(a): path for path, (_, a) in found.items()}
    fill = {name: by_array[id(array)] for name, array in tables.arrays.items()}
    touched = tables.touched()
    big: dict[str, Any] = {}
    if parent is None and not copy:  # a copy-on-write snapshot, streamed by the checkpoint writer
        frozen = tables.snapshot()
        keys = {id(a): key for key, a in frozen_arrays(tables).items()}
        for path, (_, array) in found.items():
            key = keys[id(array)]
            big[path] = ArrayBlocks(array.shape, array.dtype, partial(frozen.blocks, key), frozen.close)
    for path, (name, array) in found.items():
        if path in big:
            continue
        if parent is None:
            big[path] = array.copy()
        else:
            rows = touched.rows[name]
            big[path] = RowDelta(array.shape, rows, array[rows])
    changed = {path: touched.rows[name] for path, (name, _) in found.items()}
    return TableSnapshot(model, arrays, {"class": type(estimator).__name__, "state": tree},
                         TableArrays(big, parent, fill, compact=compact and parent is not None), changed)
