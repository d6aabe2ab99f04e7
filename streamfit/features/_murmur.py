"""MurmurHash3 (x86, 32-bit) in numpy, bit-identical to onnxruntime's ``com.microsoft.MurmurHash3`` kernel.

The exported model hashes raw columns in its graph with that kernel; training hashes the same bytes here, so a
serving process gets the training-time ids (tested against the kernel).  Strings hash their UTF-8 bytes,
integers their 8 little-endian bytes (every integer type is widened to int64 first, bool to 0/1), with
``positive=1`` (unsigned 32-bit output).  No string is handed to onnxruntime while training: its Python binding
keeps a reference to every ``str`` of a string tensor passed to ``InferenceSession.run`` (1.19.2), so a session
hashing each batch's strings leaks them all.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import pyarrow as pa
from onnx import helper

__all__ = ["murmur3", "murmur3_strings", "murmur3_concat", "murmur3_arrow", "MURMUR_DOMAIN", "murmur_node", "murmur3_int",
           "murmur3_int64", "murmur3_bytes"]

MURMUR_DOMAIN = "com.microsoft"


def murmur_node(x: str, y: str, seed: int, name: str = "") -> "helper.NodeProto":
    """The ONNX node hashing ``x`` (string or int64 tensor) into uint32 ``y``."""
    return helper.make_node("MurmurHash3", [x], [y], domain=MURMUR_DOMAIN, seed=int(seed), positive=1,
                            name=name or f"murmur_{y}")


def murmur3(values: np.ndarray, seed: int = 0) -> np.ndarray:
    """uint32 hashes of a 1-D array of str (object/unicode) or integers, as the kernel computes them.

    >>> murmur3(np.array(["hello"], dtype=object)).tolist(), murmur3(np.array([0])).tolist()
    ([613153351], [1669671676])
    """
    values = np.asarray(values)
    if values.dtype.kind in "OUS":
        flat = values.reshape(-1)
        strings = [v.decode() if isinstance(v, bytes) else v for v in flat.tolist()] if values.dtype.kind == "S" \
            else flat
        return murmur3_arrow(pa.array(strings, pa.string()), seed)
    if values.dtype.kind in "iub":
        return murmur3_int64(values.reshape(-1), seed)
    raise TypeError(f"murmur3 hashes strings and integers, got {values.dtype}")


# -- the same hash without a session run: for tiny batches (one row of 20 columns would pay 20 runs) --------
_C1, _C2, _M32 = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
_U = np.uint32


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U(r)) | (x >> _U(32 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U(16))
    h = h * _U(0x85EBCA6B)
    h = h ^ (h >> _U(13))
    h = h * _U(0xC2B2AE35)
    return h ^ (h >> _U(16))


def murmur3_int64(values: np.ndarray, seeds: "np.ndarray | int") -> np.ndarray:
    """MurmurHash3 x86 32-bit of the 8 little-endian bytes of each int64 in numpy, element-wise with
    ``seeds`` broadcast against ``values`` (one seed per column of a ``(rows, columns)`` block): bit-identical
    to :func:`murmur3` (tested), without a session run.

    >>> murmur3_int64(np.array([0, 7]), 0).tolist() == murmur3(np.array([0, 7])).tolist()
    True
    """
    v = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    h = np.asarray(seeds, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore"):
        for block in ((v & np.uint64(_M32)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)):
            k = _rotl(block * _U(_C1), 15) * _U(_C2)
            h = _rotl(h ^ k, 13) * _U(5) + _U(0xE6546B64)
        return _fmix(h ^ _U(8))


def murmur3_bytes(data: bytes, seed: int) -> int:
    """MurmurHash3 x86 32-bit of ``data`` in plain Python (a string's UTF-8 bytes), as :func:`murmur3`.

    >>> murmur3_bytes("hello".encode(), 0) == int(murmur3(np.array(["hello"], dtype=object))[0])
    True
    """
    h = seed & _M32
    n = len(data)
    body = n - n % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i:i + 4], "little") * _C1 & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= k * _C2 & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    if n % 4:
        k = int.from_bytes(data[body:], "little") * _C1 & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= k * _C2 & _M32
    h ^= n
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    return h ^ (h >> 16)


def murmur3_int(value: int, seed: int) -> int:
    """MurmurHash3 x86 32-bit of one integer's 8 little-endian int64 bytes (a uint64 above 2**63 wraps, as
    the kernel's int64 does) in plain Python: :func:`murmur3_int64` of one value, for a row of one event
    (a numpy call per step of the hash costs more than the whole hash of a few values in Python).

    >>> [murmur3_int(v, 7) for v in (0, -1, 2**63)] == murmur3(np.array([0, -1, -2**63]), 7).tolist()
    True
    """
    u = value & 0xFFFFFFFFFFFFFFFF
    h = seed & _M32
    for k in (u & _M32, u >> 32):  # the two 4-byte blocks, low half first (little-endian)
        k = k * _C1 & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= k * _C2 & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    h ^= 8
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    return h ^ (h >> 16)


# -- strings: a vectorized hash over an Arrow string column's offsets and bytes ------------------------------
#
# Each string is a lane; the hash walks its 4-byte blocks in order, all lanes at once.  Blocks are
# right-aligned: a lane with fewer blocks than the longest starts with "padding" blocks whose mixed value
# leaves the hash at its seed (the block step is invertible), so every lane takes the same steps and no
# lane is masked.  Lanes are grouped by block count (1, 2-3, 4-7, ...) when lengths are skewed, so padding
# never more than doubles the work.

_INV5 = pow(5, -1, 1 << 32)
_TAIL_MASKS = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)
#: at most this many strings in all hash in Python (each cached): below it numpy's per-call cost dominates
_PY_LANES = 8


def _pad_block(seed: int) -> int:
    """The mixed block k with ``rotl(seed ^ k, 13) * 5 + 0xE6546B64 == seed``: a step that changes nothing."""
    x = (seed - 0xE6546B64) * _INV5 & _M32
    return (((x >> 13) | (x << 19)) & _M32) ^ seed


def _mix_blocks(k: np.ndarray) -> np.ndarray:
    """MurmurHash3's per-block mix ``rotl(k * c1, 15) * c2``, in place on uint32 ``k``."""
    k *= _U(_C1)
    k[...] = _rotl(k, 15)
    k *= _U(_C2)
    return k


@lru_cache(maxsize=256)
def _steps(blocks: int) -> np.ndarray:
    """Byte distances back from a lane's tail to its ``blocks`` right-aligned blocks, then 0 (the tail)."""
    return np.arange(4 * blocks, -4, -4, dtype=np.int64)[:, None]


@lru_cache(maxsize=64)
def _lanes(n: int) -> tuple[int, int]:
    """(1 in every 64-bit lane, the low 32 bits of every lane) of ``n`` lanes packed in one Python int."""
    ones = int.from_bytes(b"\x01\0\0\0\0\0\0\0" * n, "little")
    return ones, ones * _M32


#: up to this many lanes the blocks are chained in one Python int of 64-bit lanes (a few integer operations
#: per block for all lanes) instead of six numpy calls per block
_PACKED_LANES = 192


def _chain_packed(k: np.ndarray, lengths: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """The hash steps after the block mix, every lane in a 64-bit field of one Python int: each product and
    sum fits in its field and each shift's spill into a neighbour is masked off (``& M``)."""
    n = k.shape[1]
    w, last = 8 * n, len(k) - 1
    raw = memoryview(k.astype(np.uint64).tobytes())
    ones, M = _lanes(n)
    c = 0xE6546B64 * ones
    h = int.from_bytes(seeds.astype(np.uint64).tobytes(), "little")
    for j in range(last):
        h ^= int.from_bytes(raw[j * w:(j + 1) * w], "little")
        h = (((h << 13) | (h >> 19)) & M) * 5 + c & M
    h ^= int.from_bytes(raw[last * w:], "little")  # the tail
    h ^= int.from_bytes(lengths.astype(np.uint64).tobytes(), "little")
    h = (h ^ (h >> 16)) & M
    h = h * 0x85EBCA6B & M
    h = (h ^ (h >> 13)) & M
    h = h * 0xC2B2AE35 & M
    h = (h ^ (h >> 16)) & M
    return np.frombuffer(h.to_bytes(w, "little"), dtype=np.uint64).astype(np.uint32)


def _hash_lanes(words: np.ndarray, tails: np.ndarray, lengths: np.ndarray, seeds: np.ndarray,
                pads: np.ndarray) -> np.ndarray:
    """uint32 hashes of lanes whose bodies end at byte ``tails`` (where each tail starts) of ``words`` (the
    uint32 at every byte offset), one seed and its padding block per lane."""
    nblocks = lengths >> 2
    B = int(nblocks.max()) if len(lengths) else 0
    k = words[tails[None, :] - _steps(B)]  # (B + 1, lanes): block j of every lane, then its tail word
    k[B] &= _TAIL_MASKS[lengths & 3]  # 1-3 tail bytes (none: 0, which mixes to 0)
    _mix_blocks(k)
    if B and int(nblocks.min()) < B:
        k[:B] = np.where(np.arange(B)[:, None] < (B - nblocks)[None, :], pads[None, :], k[:B])
    if len(lengths) <= _PACKED_LANES:
        return _chain_packed(k, lengths, seeds)
    h = seeds.copy()
    t = np.empty_like(h)
    for row in k[:B]:
        h ^= row
        np.right_shift(h, _U(19), out=t)
        h <<= _U(13)
        h |= t
        h *= _U(5)
        h += _U(0xE6546B64)
    h ^= k[B]
    h ^= lengths.astype(np.uint32)
    return _fmix(h)


def _hash_padded(words: np.ndarray, tails: np.ndarray, lengths: np.ndarray, seeds: np.ndarray,
                 pads: np.ndarray) -> np.ndarray:
    """:func:`_hash_lanes` in one pass when lengths are alike, else in groups of block counts within 2x of each
    other (padding never more than doubles the work)."""
    n, nblocks = len(lengths), lengths >> 2
    top = int(nblocks.max()) if n else 0
    if top < 2 or n * top <= 2 * int(nblocks.sum()) + n:
        return _hash_lanes(words, tails, lengths, seeds, pads)
    group = np.searchsorted(1 << np.arange(top.bit_length() + 1), nblocks, side="right")
    out = np.empty(n, dtype=np.uint32)
    for g in np.unique(group).tolist():
        lanes = np.flatnonzero(group == g)
        out[lanes] = _hash_lanes(words, tails[lanes], lengths[lanes], seeds[lanes], pads[lanes])
    return out


#: from this many lanes on, lanes are sorted by block count and each count hashed without padding
_GROUPED_LANES = 4096


def _hash_spans(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seeds: np.ndarray,
                pads: np.ndarray) -> np.ndarray:
    """uint32 hashes of ``data[starts[i]:starts[i] + lengths[i]]``; ``data`` (uint8) has at least 4 zero bytes
    after its last string and 4 * (the most blocks) before its first."""
    words = np.ndarray((len(data) - 3,), dtype="<u4", buffer=data, strides=(1,))  # the word at each byte
    tails = starts + ((lengths >> 2) << 2)
    with np.errstate(over="ignore"):
        n = len(lengths)
        top = int(lengths.max()) >> 2 if n else 0
        if n < _GROUPED_LANES or top < 2:  # few lanes, or short strings: one padded pass (no sort)
            return _hash_padded(words, tails, lengths, seeds, pads)
        key = np.minimum(lengths >> 2, 0xFFFF).astype(np.uint16)  # a radix sort
        order = np.argsort(key, kind="stable")
        ends = np.cumsum(np.bincount(key))
        out = np.empty(n, dtype=np.uint32)
        few = []  # lanes of block counts too rare for a pass of their own
        at = 0
        for end in ends[np.flatnonzero(np.diff(ends, prepend=0))].tolist():
            lanes = order[at:end]
            if end - at < _GROUPED_LANES // 8:
                few.append(lanes)
            else:
                out[lanes] = _hash_lanes(words, tails[lanes], lengths[lanes], seeds[lanes], pads[lanes])
            at = end
        if few:
            lanes = np.concatenate(few)
            out[lanes] = _hash_padded(words, tails[lanes], lengths[lanes], seeds[lanes], pads[lanes])
        return out


def _spans(arr: pa.Array, at: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, "pa.Buffer | None", int]]]:
    """(starts, lengths, byte ranges) of a string, large_string or string_view array's values: value i is
    ``lengths[i]`` bytes from ``at + starts[i]`` once the byte ranges (buffer, offset, size) are copied, in
    order, from byte ``at`` on."""
    n = len(arr)
    bufs = arr.buffers()
    if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):
        views = np.frombuffer(bufs[1], dtype=np.int32, count=4 * n, offset=16 * arr.offset).reshape(n, 4)
        lengths = views[:, 0].astype(np.int64)
        inline = lengths <= 12  # inline: the bytes follow the length; else (prefix, buffer index, offset)
        ranges: list[tuple[int, "pa.Buffer | None", int]] = [(16 * arr.offset, bufs[1], 16 * n)]
        base = np.zeros(max(len(bufs) - 2, 1), dtype=np.int64)
        end = at + 16 * n
        for b, buf in enumerate(bufs[2:]):
            base[b] = end
            ranges.append((0, buf, buf.size if buf is not None else 0))
            end += buf.size if buf is not None else 0
        rows = np.arange(n, dtype=np.int64)
        starts = np.where(inline, at + 16 * rows + 4, base[np.where(inline, 0, views[:, 2])] + views[:, 3])
        return starts, lengths, ranges
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    itemsize = 8 if wide else 4
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32, count=n + 1, offset=itemsize * arr.offset)
    lo, hi = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
    placed = np.add(offsets, at - lo, dtype=np.int64)
    return placed[:-1], placed[1:] - placed[:-1], [(lo, bufs[2], hi - lo)]


def murmur3_concat(arrays: Sequence[pa.Array], seeds: Sequence[int]) -> np.ndarray:
    """uint32 hashes of the values of string arrays (string, large_string or string_view; sliced or not), one
    after the other, array ``j`` with seed ``seeds[j]``, all in one vectorized pass (a null slot hashes its
    bytes, if any: callers mask nulls).  Bit-identical to the kernel on the values' UTF-8 bytes."""
    sizes = [len(a) for a in arrays]
    total = sum(sizes)
    if total <= _PY_LANES:
        return np.array([0 if v is None else murmur3_bytes(v.encode() if isinstance(v, str) else v, int(s))
                         for a, s in zip(arrays, seeds) for v in a.to_pylist()], dtype=np.uint32)
    if len(arrays) > 1 and all(a.type == pa.string() for a in arrays):  # one array: its spans in one pass
        return _hash_joined(pa.concat_arrays(list(arrays)), sizes, seeds)
    parts = []
    at = 0
    for a in arrays:
        parts.append(_spans(a, at))
        at += sum(size for _, _, size in parts[-1][2])
    if len(parts) == 1:
        (starts, lengths, _), = parts
        lane_seeds = np.full(total, int(seeds[0]) & _M32, dtype=np.uint32)
        pads = np.full(total, _pad_block(int(seeds[0]) & _M32), dtype=np.uint32)
    else:
        starts, lengths = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        lane_seeds = np.repeat(np.array([int(s) & _M32 for s in seeds], dtype=np.uint32), sizes)
        pads = np.repeat(np.array([_pad_block(int(s) & _M32) for s in seeds], dtype=np.uint32), sizes)
    lead = int(lengths.max()) & ~3  # room before the first string for the padding blocks' reads
    data = np.zeros(lead + at + 4, dtype=np.uint8)
    at = lead
    for _, _, ranges in parts:
        for offset, buf, size in ranges:
            if size and buf is not None:
                data[at:at + size] = np.frombuffer(buf, dtype=np.uint8, count=size, offset=offset)
            at += size
    starts = starts + lead
    return _hash_spans(data, starts, lengths, lane_seeds, pads)


def _hash_joined(joined: pa.Array, sizes: list[int], seeds: Sequence[int]) -> np.ndarray:
    """:func:`murmur3_concat` of string arrays joined into ``joined`` (``sizes`` values each, in order)."""
    starts, lengths, ranges = _spans(joined, 0)
    lane_seeds = np.repeat(np.array([int(s) & _M32 for s in seeds], dtype=np.uint32), sizes)
    pads = np.repeat(np.array([_pad_block(int(s) & _M32) for s in seeds], dtype=np.uint32), sizes)
    lead = int(lengths.max()) & ~3 if len(lengths) else 0  # room before the first string for the padding reads
    (offset, buf, size), = ranges
    data = np.zeros(lead + size + 4, dtype=np.uint8)
    if size and buf is not None:
        data[lead:lead + size] = np.frombuffer(buf, dtype=np.uint8, count=size, offset=offset)
    return _hash_spans(data, starts + lead, lengths, lane_seeds, pads)


def murmur3_strings(arrays: Sequence[pa.Array], seeds: Sequence[int]) -> list[np.ndarray]:
    """:func:`murmur3_concat`, one array of hashes per string array.

    >>> a = pa.array(["hello", "", "héllo wörld"])
    >>> murmur3_strings([a], [0])[0].tolist() == murmur3(np.array(a.to_pylist(), dtype=object)).tolist()
    True
    """
    hashed = murmur3_concat(arrays, seeds)
    return np.split(hashed, np.cumsum([len(a) for a in arrays])[:-1].tolist())


def murmur3_arrow(arr: "pa.Array | pa.ChunkedArray", seed: int) -> np.ndarray:
    """uint32 hashes of a string (string, large_string, string_view) or string dictionary column's values; a
    dictionary's values are hashed once.  Nulls hash as 0 (callers mask them)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        table = murmur3_arrow(arr.dictionary, seed)
        index = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
        return table[index] if len(table) else np.zeros(len(arr), np.uint32)
    (hashed,) = murmur3_strings([arr], [seed])
    return hashed
