"""Large initializers held out of the model's protobufs: one numpy array each, a data-less stub in the graph.

A 1 GiB embedding table inside an ``onnx.ModelProto`` is copied by every ``CopyFrom``, ``SerializeToString``
and session the engine makes of the model (the training copy, the inference copy, the gradient builder's
input, ...), and protobuf arenas return the memory late.  So :func:`load_holding` takes the data of every
float initializer of at least :data:`HELD_MIN_BYTES` out of the model once -- read straight from an external
data file when the model has one, else copied once from the caller's proto -- and leaves a *stub*: the
initializer's name, type and dims, marked as external data at a location no file has.  Shape inference and
onnxruntime-training's gradient builder read only those (trained weights become graph inputs there); the
engine binds the arrays as OrtValues.  :func:`attach` puts the data back into a copy where a self-contained
model is needed (export, a session that keeps the initializer).  A stub given to onnxruntime by mistake
fails loudly (its location is not a file).
"""

from __future__ import annotations

import mmap
import os
from typing import Mapping

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, numpy_helper

from streamfit._engine.common.onnx_helpers import copy_fields

__all__ = ["HELD_MIN_BYTES", "HELD_LOCATION", "is_held", "stub", "load_holding", "attach", "table_array"]

#: Float initializers at least this large are held out of the protobufs.
HELD_MIN_BYTES = 1 << 20
#: The external-data location of a stub (no file has this name).
HELD_LOCATION = "<held in memory by streamfit>"
_HOLDABLE: dict[int, np.dtype] = {TensorProto.FLOAT: np.dtype(np.float32), TensorProto.DOUBLE: np.dtype(np.float64)}
#: Arrays at least this large are allocated on 2 MiB-aligned anonymous memory advised for huge pages.
HUGE_MIN_BYTES = 1 << 22
_HUGE = 1 << 21


def is_held(init: TensorProto) -> bool:
    """True for a stub made by :func:`stub`."""
    return init.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == HELD_LOCATION for e in init.external_data)


def stub(init: TensorProto) -> TensorProto:
    """A data-less copy of ``init``: name, type, dims, and the held marker."""
    out = TensorProto(name=init.name, data_type=init.data_type, dims=list(init.dims), doc_string=init.doc_string)
    out.data_location = TensorProto.EXTERNAL
    entry = out.external_data.add()
    entry.key, entry.value = "location", HELD_LOCATION
    return out


def _nbytes(init: TensorProto) -> int:
    return int(np.prod(list(init.dims), dtype=np.int64)) * _HOLDABLE[init.data_type].itemsize


def _holdable(init: TensorProto) -> bool:
    return init.data_type in _HOLDABLE and not is_held(init) and _nbytes(init) >= HELD_MIN_BYTES


def table_array(shape: tuple[int, ...], dtype: "np.dtype | type") -> np.ndarray:
    """A zeroed, writable C-contiguous array; a large one on 2 MiB-aligned memory advised for transparent
    huge pages (random rows of a GiB table otherwise miss the TLB on every access)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < HUGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(shape, dtype)
    size = -(-nbytes // _HUGE) * _HUGE
    buf = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(buf, np.uint8)
    start = (-raw.ctypes.data) % _HUGE
    try:
        buf.madvise(mmap.MADV_HUGEPAGE, start, size)
    except OSError:  # a kernel without THP: plain pages
        pass
    return raw[start:start + nbytes].view(dtype).reshape(shape)  # the view keeps the mapping alive


def _array_from_proto(init: TensorProto) -> np.ndarray:
    value = numpy_helper.to_array(init)
    out = table_array(value.shape, value.dtype)
    np.copyto(out, value)
    return out


def _array_from_file(init: TensorProto, base_dir: str) -> np.ndarray:
    """The external data of ``init`` read straight into a new array (no intermediate bytes)."""
    from onnx import external_data_helper as ext

    info = ext.ExternalDataInfo(init)
    dtype = _HOLDABLE[init.data_type]
    out = table_array(tuple(int(d) for d in init.dims), dtype)
    nbytes = out.nbytes
    if info.length is not None and int(info.length) != nbytes:
        raise onnx.checker.ValidationError(f"initializer {init.name!r}: external data length {info.length} does "
                                           f"not match its dims {list(init.dims)} ({nbytes} bytes)")
    opener = getattr(ext, "_open_external_data_fd", None)  # validates the location (no escape from base_dir)
    if opener is not None:
        handle = os.fdopen(opener(base_dir, info.location, init.name, True), "rb")
    else:  # pragma: no cover - older onnx
        handle = open(os.path.join(base_dir, info.location), "rb")
    with handle:
        handle.seek(int(info.offset or 0))
        view = memoryview(out.reshape(-1).view(np.uint8).data)
        got = 0
        while got < nbytes:
            n = handle.readinto(view[got:])
            if not n:
                raise onnx.checker.ValidationError(f"initializer {init.name!r}: external data file "
                                                   f"{info.location!r} ends after {got} of {nbytes} bytes")
            got += n
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):  # pragma: no cover
        out.byteswap(inplace=True)
    return out


def load_holding(model: "str | os.PathLike[str] | bytes | ModelProto", hold: bool = True, owned: bool = False
                 ) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """Load ``model`` with its large float initializers held out: the model with stubs, and their arrays by
    name.  The caller's proto is never modified; ``owned`` (nobody else holds it): returned as it is when it
    has nothing to hold.  ``hold=False`` loads everything into the proto."""
    base_dir = ""
    if isinstance(model, ModelProto):
        source = model
    elif isinstance(model, (bytes, bytearray)):
        source = onnx.load_from_string(bytes(model))
    else:
        path = os.fspath(model)
        base_dir = os.path.dirname(path)
        source = onnx.load(path, load_external_data=False)
    held: dict[str, np.ndarray] = {}
    inits = source.graph.initializer
    external = [i for i in inits if i.data_location == TensorProto.EXTERNAL and not is_held(i)]
    if not hold:
        if isinstance(model, ModelProto) and not owned:
            out = ModelProto()
            out.CopyFrom(model)
            source = out
        if external:
            onnx.load_external_data_for_model(source, base_dir)
        return source, held
    if base_dir or not isinstance(model, ModelProto):
        for init in external:  # a file: read large tables straight into their arrays
            if _holdable(init):
                held[init.name] = _array_from_file(init, base_dir)
                init.CopyFrom(stub(init))
            else:
                from onnx import external_data_helper as ext

                ext.load_external_data_for_tensor(init, base_dir)
    elif external:
        raise onnx.checker.ValidationError(
            f"initializers {[i.name for i in external][:3]} have external data, but the model was given as a "
            "ModelProto (no directory to read it from): pass its path, or load it with onnx.load(path)")
    embedded = [i for i in inits if _holdable(i)]
    if not embedded and (source is not model or owned):
        return source, held
    out = ModelProto()
    copy_fields(source, out, "graph")
    copy_fields(source.graph, out.graph, "initializer")
    for init in inits:
        if _holdable(init):
            held[init.name] = _array_from_proto(init)
            out.graph.initializer.append(stub(init))
        else:
            out.graph.initializer.add().CopyFrom(init)
    return out, held


def attach(model: ModelProto, arrays: Mapping[str, np.ndarray], names: "set[str] | frozenset[str] | None" = None
           ) -> ModelProto:
    """Put data back into ``model``'s stubs (in place, from ``arrays``; only ``names`` when given)."""
    for init in model.graph.initializer:
        if is_held(init) and (names is None or init.name in names):
            if init.name not in arrays:
                raise KeyError(f"initializer {init.name!r} is held out of the model, but no array was given for it")
            init.CopyFrom(numpy_helper.from_array(np.asarray(arrays[init.name]), init.name))
    return model
