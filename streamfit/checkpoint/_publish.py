"""Publishing a model with large tables off the training path, and a delta file a server patches in place.

:class:`BackgroundPublisher` takes each durable checkpoint's model skeleton and tables (a full, or the rows
touched since the previous checkpoint), keeps its own copy of the tables (a replica, patched by the
deltas), and on its own thread, at most every ``every_seconds``, writes

* ``PATH``: the complete ONNX model (atomically replaced: a reader sees the old or the new file), and
* ``PATH.delta.npz`` (written first, also atomically): how to turn the model published before into this one.

The delta file (numpy ``.npz``, no pickle; read with ``np.load(path, allow_pickle=False)``) holds

=====================  ==========================================================================
``format``             ``"streamfit-publish-delta"``; ``version``: 1
``from_sha256``        SHA-256 of the model file this delta applies to; ``""``: no delta this time,
                       reload ``PATH`` (first publication of a process, a new full, or a new graph)
``to_sha256``          SHA-256 of the model file it produces (the new ``PATH``); ``step`` its checkpoint
``rows/<init>``        per table initializer: sorted distinct int64 row indices changed since
``values/<init>``      ... and their new values, ``[len(rows), *table.shape[1:]]``
``dense/<init>``       every other initializer, whole (dense weights are small)
=====================  ==========================================================================

A server holding the model of ``from_sha256`` sets ``table[rows] = values`` for each table and replaces each
dense initializer (:func:`apply_published_delta` does it on an ``onnx.ModelProto``); a server that missed
a publication sees a ``from_sha256`` it does not hold and reloads ``PATH``.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from streamfit.checkpoint._chain import RowDelta, TableArrays
from streamfit.checkpoint._fs import StrPath, atomic_write, fsync_dir, tmp_name
from streamfit.exceptions import CheckpointError

__all__ = ["BackgroundPublisher", "PublishResult", "apply_published_delta", "delta_path", "DELTA_FORMAT"]

logger = logging.getLogger("streamfit.checkpoint")

DELTA_FORMAT = "streamfit-publish-delta"
DELTA_VERSION = 1


def delta_path(path: StrPath) -> Path:
    """Where the delta file of a model published at ``path`` is written: ``<path>.delta.npz``."""
    p = Path(path)
    return p.with_name(p.name + ".delta.npz")


@dataclass(frozen=True)
class PublishResult:
    """One publication: the checkpoint step, the model's SHA-256, whether a patchable delta was written
    (``False``: the delta says reload), the rows it holds, and how long writing took (seconds)."""

    step: int
    sha256: str
    patchable: bool
    rows: int
    seconds: float
    started: float = 0.0  # time.perf_counter() when writing began


@dataclass(frozen=True)
class _Offer:
    step: int
    model: bytes
    tables: TableArrays | None
    changed: Mapping[str, np.ndarray] | None = None


class BackgroundPublisher:
    """Publish checkpointed models at ``path`` from one background thread, at most every ``every_seconds``.

    :meth:`offer` (a durable checkpoint's model bytes and, for a model with tables, its
    :class:`TableArrays`) returns at once; the thread applies offers to its replica of the tables in order
    and writes the newest state when a publication is due, so training never waits for a publication and
    offers made between two publications are merged (their rows united).  :meth:`close` publishes what is
    left and stops.  A failed write is logged and retried at the next offer, never raised into training.
    """

    def __init__(self, path: StrPath, every_seconds: float = 0.0) -> None:
        if not every_seconds >= 0 or math.isinf(every_seconds):
            raise CheckpointError(f"every_seconds must be a finite number >= 0, got {every_seconds!r}")
        self.path = Path(path)
        self.delta_path = delta_path(self.path)
        self.every_seconds = float(every_seconds)
        self._cond = threading.Condition()
        self._offers: list[_Offer] = []
        self._closed = False
        self._replica: dict[str, np.ndarray] | None = None  # initializer -> the whole table
        self._fill: dict[str, str] = {}  # initializer -> table array name
        self._changed: dict[str, list[np.ndarray]] = {}  # initializer -> rows changed since the last publication
        self._skeleton: bytes | None = None
        self._step = -1
        self._dirty = False
        self._patchable = False  # the next delta can be relative to the last publication
        self._last_sha: str | None = None
        self._last_structure: str | None = None
        self._last_time = -math.inf
        self.results: list[PublishResult] = []
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="streamfit-publisher", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"BackgroundPublisher({str(self.path)!r}, every_seconds={self.every_seconds})"

    # -- the caller's side ---------------------------------------------------------------------------
    def prime(self, model: bytes, tables: TableArrays) -> None:
        """Start the replica from a full state (a resumed checkpoint) without publishing it."""
        with self._cond:
            self._offers.append(_Offer(-1, bytes(model), tables))
            self._cond.notify_all()

    def offer(self, step: int, model: bytes, tables: TableArrays | None,
              changed: Mapping[str, np.ndarray] | None = None) -> None:
        """A durable checkpoint to publish (the arrays of ``tables`` must no longer be mutated by the caller).

        ``changed`` (for a full: per table array, the rows written since the checkpoint offered before it)
        lets the next delta file patch across a full instead of asking servers to reload."""
        with self._cond:
            if self._closed:
                raise CheckpointError("BackgroundPublisher is closed")
            self._offers.append(_Offer(step, model, tables, changed))
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Publish now what was offered (ignoring ``every_seconds``) and wait for it."""
        with self._cond:
            self._force = True
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: not self._offers and not self._dirty, timeout):
                raise CheckpointError(f"publication still running after {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Publish what is left, then stop the thread; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------------------
    _force = False

    def _due(self) -> bool:
        return self._dirty and (self._force or self._closed
                                or time.monotonic() - self._last_time >= self.every_seconds)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._offers or self._due() or (self._closed and not self._dirty)):
                    wait = None
                    if self._dirty:
                        wait = max(0.0, self.every_seconds - (time.monotonic() - self._last_time))
                    self._cond.wait(wait)
                offers, self._offers = self._offers, []
                stop = self._closed and not offers and not self._dirty
            if stop:
                return
            try:
                for offer in offers:
                    self._apply(offer)
                if self._due():
                    self._publish()
            except Exception as exc:  # never into training: logged, counted, retried with the next offer
                self.errors += 1
                logger.error("publishing the model to %s failed: %s", self.path, exc)
                with self._cond:
                    self._dirty, self._patchable = False, False  # the next one tells servers to reload
            with self._cond:
                if not self._dirty:
                    self._force = False
                self._cond.notify_all()

    def _apply(self, offer: _Offer) -> None:
        tables = offer.tables
        if tables is None:  # a model without tables: the bytes are the whole model
            self._replica, self._fill, self._changed = None, {}, {}
            self._patchable = False
        elif not tables.is_delta:
            follows = (offer.changed is not None and self._replica is not None and self._skeleton is not None
                       and set(tables.model_fill) == set(self._fill) and offer.step >= 0)
            self._replica = {init: np.asarray(tables.arrays[name]) for init, name in tables.model_fill.items()}
            self._fill = dict(tables.model_fill)
            if follows:  # the full state after the last offer: only its changed rows differ
                assert offer.changed is not None
                for init, name in self._fill.items():
                    self._changed[init].append(np.asarray(offer.changed[name], np.int64))
            else:
                self._changed = {init: [] for init in self._fill}
                self._patchable = False  # a new baseline: servers reload once
        else:
            if self._replica is None or set(tables.model_fill) != set(self._fill):
                logger.warning("publisher: delta of step %d has no full state before it; not published", offer.step)
                return
            for init, name in self._fill.items():
                delta = tables.arrays[name]
                assert isinstance(delta, RowDelta)
                self._replica[init][delta.rows] = delta.values
                self._changed[init].append(delta.rows)
        self._skeleton = offer.model
        if offer.step >= 0:
            self._step = offer.step
            self._dirty = True

    def _publish(self) -> None:
        start = time.perf_counter()
        assert self._skeleton is not None
        replica = self._replica or {}
        tmp = self.path.with_name(tmp_name(self.path.name))
        try:  # the model file first, under a temporary name: its checksum goes into the delta file
            sha = write_model(tmp, self._skeleton, replica)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        rows = 0
        patchable = False
        if self._fill:
            structure, dense = _structure(self._skeleton, set(self._fill))
            patchable = self._patchable and self._last_sha is not None and structure == self._last_structure
            members: dict[str, Any] = {
                "format": np.array(DELTA_FORMAT), "version": np.array(DELTA_VERSION),
                "from_sha256": np.array(self._last_sha if patchable else ""), "to_sha256": np.array(sha),
                "step": np.array(self._step, np.int64)}
            if patchable:
                for init, parts in self._changed.items():
                    changed = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
                    members[f"rows/{init}"] = changed
                    members[f"values/{init}"] = replica[init][changed]
                    rows += int(changed.size)
                members.update({f"dense/{name}": value for name, value in dense.items()})
            buf = io.BytesIO()
            np.savez(buf, **members)
            atomic_write(self.delta_path, buf.getbuffer())
            self._last_structure = structure
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._last_sha, self._last_time = sha, time.monotonic()
        self._changed = {init: [] for init in self._fill}
        self._patchable = bool(self._fill)
        self._dirty = False
        result = PublishResult(self._step, sha, patchable, rows, time.perf_counter() - start, start)
        self.results.append(result)
        logger.debug("published step %d to %s in %.3f s (%d rows in the delta)", self._step, self.path,
                     result.seconds, rows)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _length_delimited(field_number: int, length: int) -> bytes:
    """The protobuf key and length of a length-delimited field (a message, bytes)."""
    return _varint(field_number << 3 | 2) + _varint(length)


_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9  # field numbers in onnx.proto


def write_model(path: StrPath, skeleton: bytes, tables: Mapping[str, np.ndarray]) -> str:
    """Write the ONNX model ``skeleton`` with the initializers ``tables`` (name -> whole array) filled in to a new
    file ``path``, fsynced; return its SHA-256.

    The tables are never serialized by protobuf nor copied: the file is the skeleton without them, then one more
    ``ModelProto.graph`` record holding just their initializers, each a small header and the array's raw bytes
    written straight from memory.  Protobuf merges repeated occurrences of a message field, so every reader
    (onnx, onnxruntime) parses the same model; writing and hashing release the GIL, so training goes on.
    """
    import onnx
    from onnx import helper

    model = onnx.load_from_string(skeleton)
    kept = [init for init in model.graph.initializer if init.name not in tables]
    missing = set(tables) - {init.name for init in model.graph.initializer}
    if missing:
        raise CheckpointError(f"the model has no initializers {sorted(missing)} to fill")
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    head = model.SerializeToString()
    parts: list[Any] = []
    for name, array in tables.items():
        array = np.asarray(array)
        if not array.flags.c_contiguous or array.dtype.byteorder == ">":
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        header = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                                  dims=list(array.shape)).SerializeToString()
        raw = array.reshape(-1).data.cast("B")
        tensor = header + _length_delimited(_TENSOR_RAW_DATA, raw.nbytes)
        parts += [_length_delimited(_GRAPH_INITIALIZER, len(tensor) + raw.nbytes), tensor, raw]
    graph_len = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    chunks = [head, _length_delimited(_MODEL_GRAPH, graph_len), *parts] if parts else [skeleton]
    h = hashlib.sha256()
    with open(path, "xb") as f:
        for chunk in chunks:
            f.write(chunk)
            h.update(chunk)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def _structure(skeleton: bytes, tables: set[str]) -> tuple[str, dict[str, np.ndarray]]:
    """A digest of the model without its initializers' values, and the values of the non-table ones."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(skeleton)
    dense = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer if init.name not in tables}
    for init in model.graph.initializer:
        init.ClearField("raw_data")
        for f in ("float_data", "double_data", "int32_data", "int64_data", "uint64_data", "string_data"):
            init.ClearField(f)
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest(), dense


def apply_published_delta(model: Any, delta: "StrPath | Mapping[str, np.ndarray]") -> Any:
    """Patch ``model`` (an ``onnx.ModelProto`` of the published model ``delta`` starts from) in place and
    return it: each table's changed rows written, each dense initializer replaced.

    Raises :class:`CheckpointError` if the delta says to reload the model file (``from_sha256`` empty) or is
    not a publish delta.  The caller checks ``from_sha256`` against the model it holds."""
    from onnx import numpy_helper

    if isinstance(delta, Mapping):
        members = dict(delta)
    else:
        with np.load(delta, allow_pickle=False) as npz:
            members = {k: npz[k] for k in npz.files}
    if str(members.get("format", "")) != DELTA_FORMAT or int(members.get("version", 0)) != DELTA_VERSION:
        raise CheckpointError(f"not a {DELTA_FORMAT} version {DELTA_VERSION} file")
    if not str(members["from_sha256"]):
        raise CheckpointError("this delta cannot be applied: reload the published model file")
    inits = {init.name: init for init in model.graph.initializer}
    for key, value in members.items():
        kind, _, name = key.partition("/")
        if kind == "dense":
            inits[name].CopyFrom(numpy_helper.from_array(value, name))
        elif kind == "rows":
            table = numpy_helper.to_array(inits[name]).copy()
            table[value] = members[f"values/{name}"]
            inits[name].CopyFrom(numpy_helper.from_array(table, name))
    return model
