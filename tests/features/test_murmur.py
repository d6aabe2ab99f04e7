"""The numpy MurmurHash3 of string columns against onnxruntime's kernel (bit for bit), and no string handed to
onnxruntime while training (its Python binding keeps every string of a string tensor alive)."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from streamfit.features._murmur import murmur3, murmur3_arrow, murmur3_strings
from tests.features.kernel import kernel_murmur3

SEEDS = (0, 1, 7, 0xE6546B64, 2**31, 2**32 - 1, 123456789)
ALPHABET = [chr(c) for c in (0x41, 0x7A, 0x20, 0x00, 0xE9, 0x7FF, 0x800, 0x65E5, 0xFFFF, 0x10000, 0x1F642)]


def _strings(n: int, top: int, seed: int = 0) -> list[str]:
    """Random strings of 0..top characters: ASCII, or 1- to 4-byte UTF-8 characters (NUL included)."""
    rng = np.random.default_rng(seed)
    out = []
    for length in rng.integers(0, top + 1, n).tolist():
        if rng.random() < 0.5:
            out.append("".join(rng.choice(ALPHABET, length)))
        else:
            out.append("".join(map(chr, rng.integers(0x20, 0x7F, length))))
    return out


VALUES = _strings(3000, 300) + ["", "a", "ab", "abc", "abcd", "x" * 20000, "日本語" * 1000]


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.string_view()], ids=str)
def test_string_hash_is_the_kernel(type_):
    arr = pa.array(VALUES, type_)
    for seed in SEEDS:
        reference = kernel_murmur3(np.array(VALUES, dtype=object), seed).tolist()
        assert murmur3_arrow(arr, seed).tolist() == reference
        assert murmur3_arrow(arr.slice(101, 1500), seed).tolist() == reference[101:1601]  # offsets of a slice
        for n in (1, 3, 8, 9, 33):  # the Python path of a few values and the smallest numpy batches
            assert murmur3_arrow(arr.slice(n, n), seed).tolist() == reference[n:2 * n]


def test_string_hash_is_the_kernel_for_many_lanes_dictionaries_chunks_and_several_columns():
    many = _strings(20000, 24, seed=1) + _strings(300, 300, seed=2)  # lanes grouped by block count
    for seed in SEEDS[:3]:
        reference = kernel_murmur3(np.array(many, dtype=object), seed).tolist()
        assert murmur3_arrow(pa.array(many), seed).tolist() == reference
        assert murmur3_arrow(pa.array(many).dictionary_encode(), seed).tolist() == reference  # dictionary once
        chunked = pa.chunked_array([pa.array(many[:7000]), pa.array(many[7000:])])
        assert murmur3_arrow(chunked, seed).tolist() == reference
        assert murmur3(np.array(many, dtype=object), seed).tolist() == reference
    a, b = pa.array(VALUES[:2000], pa.large_string()), pa.array(VALUES[2000:], pa.string_view())
    ha, hb = murmur3_strings([a, b], [5, 2**32 - 9])  # one pass, one seed per column
    assert ha.tolist() == kernel_murmur3(np.array(VALUES[:2000], dtype=object), 5).tolist()
    assert hb.tolist() == kernel_murmur3(np.array(VALUES[2000:], dtype=object), 2**32 - 9).tolist()
    assert [h.tolist() for h in murmur3_strings([pa.array([], pa.string()), pa.array([""])], [1, 2])] == \
        [[], kernel_murmur3(np.array([""], dtype=object), 2).tolist()]


def test_partial_fit_on_string_columns_keeps_no_string_alive():
    """onnxruntime 1.19.2's binding takes a reference to every str of a string tensor passed to run() and never
    gives it back: a learner hashing strings in a session keeps every distinct string of every batch.  Here 200
    batches of 2,000 distinct strings (4 columns x 500 rows) are trained and predicted; the interpreter's
    allocated blocks stay flat (+621 here; with the session path of d5bf81e: +800,650, two per string)."""
    from streamfit import LogisticRegression

    columns = [f"c{j}" for j in range(4)]
    rng = np.random.default_rng(0)

    def batch(k: int) -> pa.Table:
        return pa.table({c: pa.array([f"{c}-{k}-{v}" for v in range(500)]) for c in columns})

    y = rng.integers(0, 2, 500)
    model = LogisticRegression(categorical=columns, buckets=1 << 12, batch_size=500, random_state=0)
    for k in range(20):  # warm up: sessions, caches, arenas
        model.partial_fit(batch(k), y, classes=[0, 1])
        model.predict_proba(batch(k))
    tables = [batch(k) for k in range(20, 220)]
    before = sys.getallocatedblocks()
    for t in tables:
        model.partial_fit(t, y)
        model.predict_proba(t)
    grown = sys.getallocatedblocks() - before
    assert grown < 20_000, f"{grown} more allocated blocks after 200 batches of 2,000 distinct strings"


def test_the_exported_model_fed_fixed_width_strings_predicts_the_same_and_keeps_nothing():
    """The README's advice to servers: raw string columns as ``np.str_`` arrays, not object arrays (which the
    binding keeps alive), give the model's predictions and leave the interpreter's allocated blocks flat."""
    import onnxruntime as ort

    from streamfit import LogisticRegression

    columns = ["a", "b"]

    def batch(k: int) -> pa.Table:
        return pa.table({c: pa.array([f"{c}-{k}-{v}" for v in range(300)]) for c in columns})

    y = np.arange(300) % 2
    model = LogisticRegression(categorical=columns, buckets=1 << 10, random_state=0)
    model.partial_fit(batch(0), y, classes=[0, 1])
    session = ort.InferenceSession(model.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.get_outputs()[0].name  # the decision function

    def feeds(t: pa.Table) -> dict[str, np.ndarray]:
        return {c: t.column(c).to_numpy(zero_copy_only=False).astype(np.str_) for c in columns}

    probe = batch(1)
    scores = session.run([out], feeds(probe))[0].reshape(-1)
    np.testing.assert_allclose(scores, model.decision_function(probe).reshape(-1), rtol=1e-5, atol=1e-6)
    tables = [batch(k) for k in range(2, 202)]
    before = sys.getallocatedblocks()
    for t in tables:
        session.run([out], feeds(t))
    grown = sys.getallocatedblocks() - before
    assert grown < 10_000, f"{grown} more allocated blocks after 200 runs of 600 strings"


def test_several_plain_string_columns_hash_joined_and_short_strings_in_one_pass():
    """Plain string columns (sliced, with nulls) are joined and hashed in one pass, each with its seed; many
    short strings (at most 7 bytes: 0 or 1 block) take one padded pass without a sort."""
    short = _strings(6000, 7, seed=3)
    cols = [pa.array(short[:3000]).slice(17, 2500), pa.array(short[3000:] + [None]), pa.array(VALUES[:900])]
    seeds = [3, 2**32 - 1, 0]
    got = murmur3_strings(cols, seeds)
    for col, seed, hashed in zip(cols, seeds, got):
        values = [v or "" for v in col.to_pylist()]  # a null slot hashes its (empty) bytes
        assert hashed.tolist() == kernel_murmur3(np.array(values, dtype=object), seed).tolist()
    assert murmur3_arrow(pa.array(short), 9).tolist() == kernel_murmur3(np.array(short, dtype=object), 9).tolist()
