"""Publishing a model with large tables off the training path, and a delta file a server patches in place.

:class:`BackgroundPublisher` takes each durable checkpoint's model skeleton and tables (a full, or the rows
touched since the previous checkpoint) and on its own thread, at most every ``every_seconds``, writes

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

It keeps no copy of the tables: a table's whole value is streamed, block by block, from a file -- the last
published model (the tables' raw bytes at known offsets), or a full checkpoint's ``state.npz`` (opened when
it is offered, so retention deleting it later does not matter) -- with the rows changed since laid over it.
What it holds in memory is those rows (the deltas offered since that file), not the tables.

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
from functools import partial
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
    """Where the delta file of a model published at ``path`` is written: ``<path>.delta.npz``.

    Parameters
    ----------
    path
        Where the model is published.
    """
    p = Path(path)
    return p.with_name(p.name + ".delta.npz")


@dataclass(frozen=True)
class PublishResult:
    """One publication: the checkpoint step, the model's SHA-256, whether a patchable delta was written
    (``False``: the delta says reload), the rows it holds, and how long writing took (seconds).

    Attributes
    ----------
    step, sha256
        The checkpoint step published, and the model file's SHA-256.
    patchable
        Whether a patchable delta was written (False: the delta says reload).
    rows
        Table rows the delta holds.
    seconds, started
        How long writing took, and when it started (Unix time).
    """

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
    #: a full's tables in a checkpoint's ``state.npz`` (when they are not arrays in memory), opened already
    source: "_FileTables | None" = None
    #: a resumed chain: the full's file, then each delta's rows in order
    chain: tuple[Mapping[str, RowDelta], ...] = ()
    #: with ``chain``: the skeleton's table initializers -> array names (``tables`` is then ``None``)
    fill: Mapping[str, str] | None = None


class _FileTables:
    """Whole arrays stored raw in an open file (a checkpoint's uncompressed ``state.npz`` members, or the tables
    of a model written by :func:`write_model`): per name, the offset of its data, its shape and dtype."""

    def __init__(self, file: Any, regions: Mapping[str, tuple[int, tuple[int, ...], np.dtype]]) -> None:
        self.file = file
        self.regions = dict(regions)

    @classmethod
    def from_npz(cls, path: StrPath, names: Mapping[str, str]) -> "_FileTables":
        """The members ``names`` (key -> array name) of the ``.npz`` at ``path``; opened now."""
        import struct
        import zipfile

        f = open(path, "rb")
        try:
            regions = {}
            with zipfile.ZipFile(f) as zf:
                for key, name in names.items():
                    info = zf.getinfo(name + ".npy")
                    if info.compress_type != zipfile.ZIP_STORED:
                        raise CheckpointError(f"{path}: member {name!r} is compressed; expected a stored one")
                    f.seek(info.header_offset)
                    local = f.read(30)
                    n, m = struct.unpack("<HH", local[26:30])
                    f.seek(info.header_offset + 30 + n + m)
                    version = np.lib.format.read_magic(f)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, fortran, dtype = read(f)
                    if fortran or dtype.hasobject:
                        raise CheckpointError(f"{path}: member {name!r} is not a C-order numeric array")
                    regions[key] = (f.tell(), tuple(shape), dtype)
        except BaseException:
            f.close()
            raise
        return cls(f, regions)

    def blocks(self, key: str, block_bytes: int = 16 << 20) -> Any:
        """The array ``key`` as consecutive blocks of rows (one reused buffer)."""
        offset, shape, dtype = self.regions[key]
        row = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        step = max(1, block_bytes // max(row, 1))
        buf = np.empty((min(step, shape[0]),) + tuple(shape[1:]), dtype)
        raw = buf.reshape(-1).view(np.uint8)
        for start in range(0, shape[0], step):
            k = min(step, shape[0] - start)
            want = k * row
            got = os.preadv(self.file.fileno(), [raw[:want].data], offset + start * row)
            if got != want:
                raise CheckpointError(f"{getattr(self.file, 'name', 'a file')}: ends inside table {key!r}")
            yield start, buf[:k]

    def close(self) -> None:
        self.file.close()


class BackgroundPublisher:
    """Publish checkpointed models at ``path`` from one background thread, at most every ``every_seconds``.

    :meth:`offer` (a durable checkpoint's model bytes and, for a model with tables, its
    :class:`TableArrays`) returns at once; the thread applies offers (rows laid over a file of the tables) in order
    and writes the newest state when a publication is due, so training never waits for a publication and
    offers made between two publications are merged (their rows united).  :meth:`close` publishes what is
    left and stops.  A failed write is logged and retried at the next offer, never raised into training.

    Parameters
    ----------
    path
        Where the model is published (a serving process reads it; the delta file goes beside it).
    every_seconds
        The least seconds between two publications (0: publish every offer).
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
        #: where each table initializer's whole value is read from: arrays in memory (given by a caller), or a file
        self._base: dict[str, np.ndarray] | _FileTables | None = None
        #: per initializer: the rows written since the base (sorted) and their values, laid over it
        self._over: dict[str, tuple[np.ndarray, np.ndarray]] = {}
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
        """Start from a full state (its arrays, which the caller no longer mutates) without publishing it.

        Parameters
        ----------
        model
            The model's bytes.
        tables
            Its full :class:`TableArrays`.
        """
        with self._cond:
            self._offers.append(_Offer(-1, bytes(model), tables))
            self._cond.notify_all()

    def prime_chain(self, model: bytes, model_fill: Mapping[str, str], full: StrPath,
                    chain: "tuple[Mapping[str, RowDelta], ...]" = ()) -> None:
        """Start from a resumed chain checkpoint without publishing it or holding its tables: the full checkpoint
        ``full`` (a directory; its ``state.npz`` is opened now), then the deltas ``chain`` (per table array its
        :class:`RowDelta`) in order; ``model`` the checkpoint's skeleton, ``model_fill`` its link's.

        Parameters
        ----------
        model, model_fill
            The checkpoint's skeleton model bytes and the initializers its tables fill.
        full
            The chain's full checkpoint directory.
        chain
            Per delta after it, in order: ``{table array: RowDelta}``.
        """
        source = _FileTables.from_npz(Path(full) / "state.npz", dict(model_fill))
        with self._cond:
            self._offers.append(_Offer(-1, bytes(model), None, None, source, tuple(chain), dict(model_fill)))
            self._cond.notify_all()

    def offer(self, step: int, model: bytes, tables: TableArrays | None,
              changed: Mapping[str, np.ndarray] | None = None, checkpoint: StrPath | None = None) -> None:
        """A durable checkpoint to publish (the arrays of ``tables`` must no longer be mutated by the caller).

        ``changed`` (for a full: per table array, the rows written since the checkpoint offered before it)
        lets the next delta file patch across a full instead of asking servers to reload.  A full whose tables
        were streamed (:class:`~streamfit.checkpoint.ArrayBlocks`) is read from ``checkpoint`` (its directory),
        whose ``state.npz`` is opened here, before the caller's next save can delete it.

        Parameters
        ----------
        step
            The checkpoint's step.
        model
            Its model bytes.
        tables
            Its :class:`TableArrays` (None: a model without tables).
        changed
            For a full: per table array, the rows written since the previous offer.
        checkpoint
            The checkpoint's directory (read for a full whose tables were streamed).
        """
        source = self._source(tables, checkpoint)
        with self._cond:
            if self._closed:
                if source is not None:
                    source.close()
                raise CheckpointError("BackgroundPublisher is closed")
            self._offers.append(_Offer(step, model, tables, changed, source))
            self._cond.notify_all()

    @staticmethod
    def _source(tables: TableArrays | None, checkpoint: StrPath | None) -> "_FileTables | None":
        if tables is None or tables.is_delta:
            return None
        if all(isinstance(tables.arrays[name], np.ndarray) for name in tables.model_fill.values()):
            return None
        if checkpoint is None:
            raise CheckpointError("a full whose tables were streamed is published from its checkpoint: pass "
                                  "checkpoint= (its directory)")
        return _FileTables.from_npz(Path(checkpoint) / "state.npz", dict(tables.model_fill))

    def flush(self, timeout: float | None = None) -> None:
        """Publish now what was offered (ignoring ``every_seconds``) and wait for it.

        Parameters
        ----------
        timeout
            The most seconds to wait (then :class:`~streamfit.exceptions.CheckpointError`); None: no limit.
        """
        with self._cond:
            self._force = True
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: not self._offers and not self._dirty, timeout):
                raise CheckpointError(f"publication still running after {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Publish what is left, then stop the thread; idempotent.

        Parameters
        ----------
        timeout
            The most seconds to wait for the thread to finish; None: no limit.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._set_base(None)
            for offer in self._offers:
                if offer.source is not None:
                    offer.source.close()

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

    def _set_base(self, base: "dict[str, np.ndarray] | _FileTables | None") -> None:
        if isinstance(self._base, _FileTables) and self._base is not base:
            self._base.close()
        self._base = base
        self._over = {}

    def _lay(self, init: str, delta: RowDelta) -> None:
        """Rows of a delta over the base: the newest value of each row kept."""
        rows, values = np.asarray(delta.rows, np.int64), np.asarray(delta.values)
        if init in self._over:
            old_rows, old_values = self._over[init]
            rows, first = np.unique(np.concatenate([rows, old_rows]), return_index=True)  # the new ones first
            values = np.concatenate([values, old_values])[first]
        self._over[init] = (rows, values)

    def _apply(self, offer: _Offer) -> None:
        tables = offer.tables
        if offer.fill is not None:  # a resumed chain: a full on disk and its deltas
            tables = TableArrays({}, None, {})
            self._set_base(offer.source)
            self._fill = dict(offer.fill)
            self._changed = {init: [] for init in self._fill}
            self._patchable = False
            for deltas in offer.chain:
                for init, name in self._fill.items():
                    self._lay(init, deltas[name])
        elif tables is None:  # a model without tables: the bytes are the whole model
            self._set_base(None)
            self._fill, self._changed = {}, {}
            self._patchable = False
        elif not tables.is_delta:
            follows = (offer.changed is not None and self._base is not None and self._skeleton is not None
                       and set(tables.model_fill) == set(self._fill) and offer.step >= 0)
            self._set_base(offer.source if offer.source is not None else
                           {init: np.asarray(tables.arrays[name]) for init, name in tables.model_fill.items()})
            self._fill = dict(tables.model_fill)
            if follows:  # the full state after the last offer: only its changed rows differ
                assert offer.changed is not None
                for init, name in self._fill.items():
                    self._changed[init].append(np.asarray(offer.changed[name], np.int64))
            else:
                self._changed = {init: [] for init in self._fill}
                self._patchable = False  # a new baseline: servers reload once
        else:
            if self._base is None or set(tables.model_fill) != set(self._fill):
                logger.warning("publisher: delta of step %d has no full state before it; not published", offer.step)
                return
            for init, name in self._fill.items():
                delta = tables.arrays[name]
                assert isinstance(delta, RowDelta)
                self._lay(init, delta)
                self._changed[init].append(delta.rows)
        self._skeleton = offer.model
        if offer.step >= 0:
            self._step = offer.step
            self._dirty = True

    def _tables(self) -> dict[str, "_Whole"]:
        """Each table initializer's whole current value, as blocks: the base with the rows laid over it."""
        base = self._base
        out = {}
        for init in self._fill:
            if isinstance(base, _FileTables):
                _, shape, dtype = base.regions[init]
                blocks = partial(base.blocks, init)
            else:
                assert base is not None
                array = base[init]
                shape, dtype = tuple(array.shape), array.dtype
                blocks = partial(_array_blocks, array)
            out[init] = _Whole(shape, dtype, blocks, self._over.get(init))
        return out

    def _publish(self) -> None:
        start = time.perf_counter()
        assert self._skeleton is not None
        tables = self._tables()
        changed = {init: np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
                   for init, parts in self._changed.items()}
        picked: dict[str, np.ndarray] = {}  # the changed rows' new values, picked up while the tables stream
        tmp = self.path.with_name(tmp_name(self.path.name))
        try:  # the model file first, under a temporary name: its checksum goes into the delta file
            sha, offsets = write_model(tmp, self._skeleton, tables, pick=changed, picked=picked)
            written = _FileTables(open(tmp, "rb"), {init: (offsets[init], t.shape, t.dtype)
                                                    for init, t in tables.items()}) if tables else None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        rows = 0
        patchable = False
        try:
            if self._fill:
                structure, dense = _structure(self._skeleton, set(self._fill))
                patchable = self._patchable and self._last_sha is not None and structure == self._last_structure
                members: dict[str, Any] = {
                    "format": np.array(DELTA_FORMAT), "version": np.array(DELTA_VERSION),
                    "from_sha256": np.array(self._last_sha if patchable else ""), "to_sha256": np.array(sha),
                    "step": np.array(self._step, np.int64)}
                if patchable:
                    for init, rows_changed in changed.items():
                        members[f"rows/{init}"] = rows_changed
                        members[f"values/{init}"] = picked[init]
                        rows += int(rows_changed.size)
                    members.update({f"dense/{name}": value for name, value in dense.items()})
                buf = io.BytesIO()
                np.savez(buf, **members)
                atomic_write(self.delta_path, buf.getbuffer())
                self._last_structure = structure
            os.replace(tmp, self.path)
        except BaseException:
            if written is not None:
                written.close()
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)
        if written is not None:
            self._set_base(written)  # the next publication streams the tables from the file just published
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


@dataclass(frozen=True, eq=False)
class _Whole:
    """A table's whole value as blocks of rows (``blocks()`` yields ``(start, block)``), with rows laid over."""

    shape: tuple[int, ...]
    dtype: np.dtype
    blocks: Any
    over: tuple[np.ndarray, np.ndarray] | None = None

    def chunks(self, pick: np.ndarray | None = None, picked: np.ndarray | None = None) -> Any:
        """The blocks with the overlaid rows written in (``blocks()`` yields buffers of its own, which this
        modifies); the values of the sorted rows ``pick`` are copied into ``picked`` on the way."""
        for start, block in self.blocks():
            stop = start + block.shape[0]
            if self.over is not None:
                rows, values = self.over
                lo, hi = np.searchsorted(rows, (start, stop))
                if hi > lo:
                    block[rows[lo:hi] - start] = values[lo:hi]
            if pick is not None and picked is not None:
                lo, hi = np.searchsorted(pick, (start, stop))
                picked[lo:hi] = block[pick[lo:hi] - start]
            yield block


def _array_blocks(array: np.ndarray, block_rows: int = 1 << 16) -> Any:
    """An array in memory as blocks (copies, so overlaid rows never touch the caller's array)."""
    for start in range(0, array.shape[0], block_rows):
        yield start, np.array(array[start:start + block_rows])


def write_model(path: StrPath, skeleton: bytes, tables: Mapping[str, Any],
                pick: Mapping[str, np.ndarray] | None = None, picked: dict[str, np.ndarray] | None = None
                ) -> tuple[str, dict[str, int]]:
    """Write the ONNX model ``skeleton`` with the initializers ``tables`` (name -> whole array, or a
    :class:`_Whole` streamed by blocks) filled in to a new file ``path``, fsynced; return its SHA-256 and the
    offset in the file of each table's raw bytes.  ``pick``: per table, sorted rows whose written values are
    returned in ``picked``.

    The tables are never serialized by protobuf nor copied whole: the file is the skeleton without them, then one
    more ``ModelProto.graph`` record holding just their initializers, each a small header and the array's raw
    bytes written block by block.  Protobuf merges repeated occurrences of a message field, so every reader
    (onnx, onnxruntime) parses the same model; writing and hashing release the GIL, so training goes on.
    """
    chunks, wholes = _model_layout(skeleton, tables)
    h = hashlib.sha256()
    offsets: dict[str, int] = {}
    at = 0
    with open(path, "xb") as f:
        for chunk in chunks:
            if isinstance(chunk, bytes):
                f.write(chunk)
                h.update(chunk)
                at += len(chunk)
                continue
            name, nbytes = chunk
            offsets[name] = at
            rows = None if pick is None else pick.get(name)
            out = None
            if rows is not None and picked is not None:
                out = picked[name] = np.empty((len(rows),) + tuple(wholes[name].shape[1:]), wholes[name].dtype)
            for block in wholes[name].chunks(rows, out):
                raw = np.ascontiguousarray(block).reshape(-1).view(np.uint8).data
                f.write(raw)
                h.update(raw)
                at += raw.nbytes
            if at - offsets[name] != nbytes:
                raise CheckpointError(f"table {name!r}: {at - offsets[name]} bytes written, expected {nbytes}")
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest(), offsets


def _model_layout(skeleton: bytes, tables: Mapping[str, Any]) -> "tuple[list[Any], dict[str, _Whole]]":
    """What :func:`write_model` writes, in order: byte strings (the skeleton without the tables, then the one
    graph record's and each initializer's headers) and ``(table name, raw bytes)`` for each table's values; and
    the tables as :class:`_Whole` (streamed by blocks)."""
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
    wholes: dict[str, _Whole] = {}
    for name, value in tables.items():
        if not isinstance(value, _Whole):
            array = np.asarray(value)
            value = _Whole(tuple(array.shape), array.dtype, partial(_array_blocks, array))
        if value.dtype.byteorder == ">":
            raise CheckpointError(f"table {name!r} is big-endian; ONNX raw data is little-endian")
        wholes[name] = value
        nbytes = int(np.prod(value.shape, dtype=np.int64)) * value.dtype.itemsize
        header = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
                                  dims=list(value.shape)).SerializeToString()
        tensor = header + _length_delimited(_TENSOR_RAW_DATA, nbytes)
        parts += [_length_delimited(_GRAPH_INITIALIZER, len(tensor) + nbytes), tensor, (name, nbytes)]
    graph_len = sum(len(p) if isinstance(p, bytes) else p[1] for p in parts)
    return ([head, _length_delimited(_MODEL_GRAPH, graph_len), *parts] if parts else [skeleton]), wholes


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
    not a publish delta.  The caller checks ``from_sha256`` against the model it holds.

    Parameters
    ----------
    model
        The ``onnx.ModelProto`` the delta starts from (its ``from_sha256``).
    delta
        The delta file's path (:func:`delta_path`), or its arrays as loaded.
    """
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
