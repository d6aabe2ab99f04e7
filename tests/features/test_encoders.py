"""Encoders: stable hashes (checked against an independent MurmurHash3 and across processes), vocabularies,
padded list columns."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from streamfit.features import Hashed, Lengths, Mask, Padded, Vocabulary
from streamfit.features._murmur import murmur3
from tests.features.kernel import kernel_murmur3


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit, written from the algorithm's description (independent of onnxruntime)."""
    c1, c2, h = 0xCC9E2D51, 0x1B873593, seed & 0xFFFFFFFF
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF  # noqa: E731
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = rotl((k * c1) & 0xFFFFFFFF, 15) * c2 & 0xFFFFFFFF
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    tail = data[n:]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= rotl((k * c1) & 0xFFFFFFFF, 15) * c2 & 0xFFFFFFFF
    h ^= len(data)
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = (h ^ (h >> shift)) * mult & 0xFFFFFFFF
    return h ^ (h >> 16)


VALUES = ["", "a", "paris", "héllo wörld", "日本語", "x" * 33, "emoji 🙂"]
INTS = [0, 1, -1, 2**31, -(2**63), 2**63 - 1, 123456789]


def test_murmur3_is_the_reference_algorithm():
    for seed in (0, 1, 2**32 - 1):
        got = murmur3(np.array(VALUES, dtype=object), seed).tolist()
        assert got == [murmur3_32(v.encode(), seed) for v in VALUES]
        got = murmur3(np.array(INTS, dtype=np.int64), seed).tolist()
        assert got == [murmur3_32(int(v).to_bytes(8, "little", signed=True), seed) for v in INTS]


_CHILD = """
import json, sys, numpy as np, pyarrow as pa
from streamfit.features import Hashed
values, ints = json.loads(sys.argv[1])
enc = Hashed(["s", "i"], buckets=1 << 20, seed=7)
arrays = [pa.array(values + [None]), pa.array(ints + [None], pa.int64())]
print(json.dumps(enc.encode(enc.new_state(), arrays).tolist()))
"""


def test_hashed_ids_agree_across_processes_and_with_the_reference():
    enc = Hashed(["s", "i"], buckets=1 << 20, seed=7)
    mine = enc.encode(enc.new_state(), [pa.array(VALUES + [None]), pa.array(INTS + [None], pa.int64())])
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([VALUES, INTS])], capture_output=True,
                         text=True, check=True, env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert json.loads(out.stdout) == mine.tolist()
    seeds = [murmur3_32(c.encode(), 7) for c in ("s", "i")]
    expected_s = [1 + murmur3_32(v.encode(), seeds[0]) % ((1 << 20) - 1) for v in VALUES] + [0]
    expected_i = [1 + murmur3_32(int(v).to_bytes(8, "little", signed=True), seeds[1]) % ((1 << 20) - 1)
                  for v in INTS] + [0]
    assert mine[:, 0].tolist() == expected_s and mine[:, 1].tolist() == expected_i


def test_hashed_same_id_for_every_encoding_of_a_value():
    enc = Hashed("c", buckets=1000)
    plain = enc.encode(enc.new_state(), [pa.array(["b", "a", None, "b"])])
    for arr in (pa.array(["b", "a", None, "b"]).dictionary_encode(), pa.array(["b", "a", None, "b"], pa.large_string())):
        assert enc.encode(enc.new_state(), [arr]).tolist() == plain.tolist()
    ints = enc.encode(enc.new_state(), [pa.array([5, None, 7], pa.int64())])
    for t in (pa.int8(), pa.int32(), pa.uint16()):
        assert enc.encode(enc.new_state(), [pa.array([5, None, 7], t)]).tolist() == ints.tolist()
    flags = enc.encode(enc.new_state(), [pa.array([True, False, None])])
    assert flags.ravel().tolist() == enc.encode(enc.new_state(), [pa.array([1, 0, None], pa.int64())]).ravel().tolist()
    # two columns hash with their own seeds: equal values, unrelated ids
    pair = Hashed(["a", "b"], buckets=1 << 30)
    two = pair.encode(pair.new_state(), [pa.array(["v", "w"]), pa.array(["v", "w"])])
    assert (two[:, 0] != two[:, 1]).all()


def test_hashed_dictionary_values_are_hashed_once_per_batch(monkeypatch):
    import streamfit.features._encoders as mod

    sizes = []
    real = mod.murmur3_arrow
    monkeypatch.setattr(mod, "murmur3_arrow", lambda values, seed: sizes.append(len(values)) or real(values, seed))
    enc = Hashed("c", buckets=100)
    plain = pa.array(["x", "y", "x", "z", None] * 1000)
    ids = enc.encode(enc.new_state(), [plain.dictionary_encode()])
    assert sizes == [3]  # the dictionary's values, not the 5000 rows
    assert ids.tolist() == enc.encode(enc.new_state(), [plain]).tolist()
    with_null = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 2, 1]), pa.array(["x", None, "z"]))
    assert enc.encode(enc.new_state(), [with_null]).ravel().tolist() == [ids[0, 0], 0, 0, ids[3, 0], 0]


def test_hashed_refuses_a_column_whose_kind_changes_and_bad_parameters():
    from streamfit.features._encoders import EncodeProblem

    enc = Hashed("c", buckets=10)
    state = enc.new_state()
    enc.encode(state, [pa.array([1, 2])])
    with pytest.raises(EncodeProblem, match="holds string values, but it held int values"):
        enc.encode(state, [pa.array(["1"])])
    with pytest.raises(EncodeProblem, match="expected string, large_string, dictionary, integer or bool"):
        enc.encode(enc.new_state(), [pa.array([1.5])])
    for bad in (dict(buckets=1), dict(buckets=10, seed=-1), dict(buckets=2.5)):
        with pytest.raises(ValueError):
            Hashed("c", **bad)


def test_vocabulary_min_count_max_size_and_state_round_trip():
    enc = Vocabulary(["a", "b"], min_count=2, max_size=5)
    state = enc.new_state()
    ids = enc.encode(state, [pa.array(["p", "q", "p", "q", "r", "r", "s", "s"]),
                             pa.array([1, 1, None, 2, 2, 3, 3, 3], pa.int64())])
    # ids in order of admission (a value's 2nd sighting): b's 1 at row 1 -> 2, a's p at row 2 -> 3, a's q at
    # row 3 -> 4; then the vocabulary is full (5 ids): b's 2, r and s stay out of vocabulary
    assert ids[:, 0].tolist() == [1, 1, 3, 4, 1, 1, 1, 1]
    assert ids[:, 1].tolist() == [1, 2, 0, 1, 1, 1, 1, 1]
    assert state.size == 5
    restored = enc.new_state()
    restored.load_dict(state.to_dict())
    assert restored.ids == state.ids and restored.pending == state.pending and restored.kinds == state.kinds
    again = enc.encode(restored, [pa.array(["q", "p", "zz"]), pa.array([1, 9, 9], pa.int64())])
    assert again.tolist() == [[4, 2], [3, 1], [1, 1]]


def test_vocabulary_journal_commits_exactly_the_trained_rows():
    enc = Vocabulary("a", min_count=2)
    live, committed = enc.new_state(), enc.new_state()
    enc.encode(live, [pa.array(["p", "q", "p"])], journal_at=0)       # rows 0-2
    enc.encode(live, [pa.array(["q", "r", "r", "s"])], journal_at=3)  # rows 3-6, read ahead
    enc.commit(committed, live, 3)  # rows 0..2 trained
    assert committed.ids[0] == {"p": 2} and committed.pending[0] == {"q": 1}
    enc.commit(committed, live, 5)
    assert committed.ids[0] == {"p": 2, "q": 3} and committed.pending[0] == {"r": 1}
    enc.commit(committed, live, 7)
    assert committed.ids[0] == live.ids[0] and committed.pending[0] == live.pending[0]


def test_padded_lengths_and_mask():
    col = pa.array([[1, 2, 3], [], None, [4, 5, 6, 7, 8], [9]], pa.list_(pa.int64()))
    sliced = pa.array([[0]] + col.to_pylist(), pa.list_(pa.int64())).slice(1)  # a non-zero offset
    for arr in (col, sliced, pa.array(col.to_pylist(), pa.large_list(pa.int64()))):
        assert Padded("t", 4, pad=-1).encode(None, [arr]).tolist() == \
            [[1, 2, 3, -1], [-1] * 4, [-1] * 4, [4, 5, 6, 7], [9, -1, -1, -1]]
        assert Lengths("t", 4).encode(None, [arr]).ravel().tolist() == [3, 0, 0, 4, 1]
        assert Mask("t", 4).encode(None, [arr]).tolist() == [[1, 1, 1, 0], [0] * 4, [0] * 4, [1] * 4, [1, 0, 0, 0]]


def test_numpy_and_python_murmur3_are_bit_identical_to_the_kernel():
    from streamfit.features._murmur import murmur3_bytes, murmur3_int64

    rng = np.random.default_rng(0)
    ints = np.concatenate([rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64), np.arange(-300, 300), INTS])
    strings = VALUES + ["x" * n for n in range(12)] + [str(v) for v in rng.integers(0, 10**9, 500)]
    for seed in (0, 1, 7, 2**31, 2**32 - 1):
        assert murmur3_int64(ints, seed).tolist() == kernel_murmur3(ints, seed).tolist()
        assert murmur3(ints, seed).tolist() == kernel_murmur3(ints, seed).tolist()
        assert [murmur3_bytes(v.encode(), seed) for v in strings] == \
            kernel_murmur3(np.array(strings, dtype=object), seed).tolist()
    block = rng.integers(-10**6, 10**6, (7, 3))  # one seed per column of a block
    seeds = np.array([3, 2**32 - 5, 11], dtype=np.uint32)
    got = murmur3_int64(block, seeds)
    for j in range(3):
        assert got[:, j].tolist() == kernel_murmur3(block[:, j], int(seeds[j])).tolist()


def test_hashed_small_batches_give_the_ids_of_large_batches_and_of_the_kernel():
    cols = ["s", "i", "b", "u", "d"]
    enc = Hashed(cols, buckets=1 << 20, seed=3)
    n = 200
    rng = np.random.default_rng(1)
    table = pa.table({
        "s": pa.array([None if v % 13 == 0 else f"v{v}é" for v in rng.integers(0, 50, n)]),
        "i": pa.array([None if v % 11 == 0 else int(v) for v in rng.integers(-2**40, 2**40, n)], pa.int64()),
        "b": pa.array([None if v == 2 else bool(v) for v in rng.integers(0, 3, n)]),
        "u": pa.array([2**64 - 1 - int(v) for v in rng.integers(0, 5, n)], pa.uint64()),
        "d": pa.array([f"k{v}" for v in rng.integers(0, 4, n)]).dictionary_encode()})
    whole = enc.encode(enc.new_state(), [table.column(c) for c in cols])  # the large-batch path
    m = (1 << 20) - 1
    as_int64 = (table.column("u").to_numpy().astype(np.uint64)).view(np.int64)  # uint64 hashes its int64 bits
    assert whole[:, 3].tolist() == (1 + kernel_murmur3(as_int64, enc.column_seed(3)).astype(np.int64) % m).tolist()
    s = table.column("s").to_pylist()
    kernel_s = 1 + kernel_murmur3(np.array([v or "" for v in s], dtype=object), enc.column_seed(0)).astype(np.int64) % m
    assert whole[:, 0].tolist() == [0 if v is None else int(h) for v, h in zip(s, kernel_s)]
    d = table.column("d").to_pylist()
    kernel_d = 1 + kernel_murmur3(np.array(d, dtype=object), enc.column_seed(4)).astype(np.int64) % m
    assert whole[:, 4].tolist() == kernel_d.tolist()
    for r in range(0, n, 7):  # one row, then a few: the small-batch paths
        part = table.slice(r, 1 if r % 2 else 5)
        got = enc.encode(enc.new_state(), [part.column(c) for c in cols])
        assert got.tolist() == whole[r:r + part.num_rows].tolist()
    plain = Hashed(cols[:4], buckets=1 << 20, seed=3)
    one = table.slice(5, 1)
    assert plain.encode(plain.new_state(), [one.column(c) for c in cols[:4]]).tolist() == whole[5:6, :4].tolist()
