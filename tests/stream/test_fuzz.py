"""Seeded fuzzing of message bytes and schemas through the IPC decoder and the column plan.

Every mutated message is either trained exactly as decoded (values read by name) or counted as bad input
under a known reason; nothing raises anything but :class:`BadInputError`, nothing is lost silently.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from streamfit._stream.batching import MESSAGE_REASONS, ROW_REASONS, Rebatcher
from streamfit._columns.plan import ColumnPlan
from streamfit.exceptions import BadInputError
from streamfit.sources._base import SourceBatch
from streamfit.sources.decoders import ipc_decoder
from streamfit.testing import ipc_bytes

FEATURES = ["x0", "x1", "x2"]
N = 32
SEED = 20261201
MESSAGES = 320


def _base(rng: np.random.Generator) -> pa.RecordBatch:
    cols = {f: pa.array(rng.standard_normal(N).astype(np.float32)) for f in FEATURES}
    cols["y"] = pa.array(rng.standard_normal(N).astype(np.float32))
    cols["tag"] = pa.array([f"t{i % 5}" for i in range(N)])
    cols["cat"] = pa.array([f"c{i % 3}" for i in range(N)]).dictionary_encode()
    cols["ids"] = pa.array([[i, i + 1][: i % 3] for i in range(N)], pa.list_(pa.int64()))
    return pa.record_batch(cols)


def _set(b: pa.RecordBatch, name: str, arr: pa.Array) -> pa.RecordBatch:
    return b.set_column(b.schema.get_field_index(name), name, arr)


def _flip_bits(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(len(out)))
        out[i] ^= 1 << int(rng.integers(8))
    return bytes(out)


def _non_utf8(data: bytes, name: str) -> bytes:
    out = bytearray(data)
    i = out.find(len(name).to_bytes(4, "little") + name.encode() + b"\0")
    out[i + 4] = 0xFF
    return bytes(out)


def _mutate(kind: str, b: pa.RecordBatch, rng: np.random.Generator) -> bytes:
    col = str(rng.choice(FEATURES + ["y"]))
    if kind == "bit_flip":
        return _flip_bits(ipc_bytes(b), rng)
    if kind == "truncate":
        data = ipc_bytes(b)
        return data[: int(rng.integers(len(data)))]
    if kind == "garbage":
        return rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8).tobytes()
    if kind == "non_utf8_name":
        return _non_utf8(ipc_bytes(b), str(rng.choice(FEATURES + ["y", "tag"])))
    if kind == "schema_only":
        sink = pa.BufferOutputStream()
        pa.ipc.new_stream(sink, b.schema).close()
        return sink.getvalue().to_pybytes()
    if kind == "empty":
        b = b.slice(0, 0)
    elif kind == "type":
        target = rng.choice(["int64", "string", "bool", "float64", "float16", "list", "dict_float"])
        values = b.column(col)
        if target == "string":
            arr = pa.array([str(v) for v in values.to_pylist()])
        elif target == "list":
            arr = pa.array([[v] for v in values.to_pylist()], pa.list_(pa.float32()))
        elif target == "dict_float":
            arr = values.dictionary_encode()
        else:
            arr = values.cast(target, safe=False)
        b = _set(b, col, arr)
    elif kind == "rename":
        b = b.rename_columns([f"{n}_renamed" if n == col else n for n in b.schema.names])
    elif kind == "duplicate":
        b = b.append_column(col, b.column(col))
    elif kind == "drop":
        b = b.drop_columns([col])
    elif kind == "nulls":
        mask = rng.random(N) < 0.2
        b = _set(b, col, pa.array(b.column(col).to_numpy(), mask=mask))
    elif kind == "non_finite":
        v = b.column(col).to_numpy().copy()
        v[rng.integers(N, size=3)] = rng.choice([np.nan, np.inf, -np.inf])
        b = _set(b, col, pa.array(v))
    elif kind == "reorder":
        b = b.select(list(rng.permutation(b.schema.names)))
    elif kind == "extra":
        b = b.add_column(int(rng.integers(b.num_columns + 1)), "extra", pa.array(rng.standard_normal(N)))
    return ipc_bytes(b)


KINDS = ["bit_flip", "bit_flip", "bit_flip", "truncate", "garbage", "non_utf8_name", "schema_only", "empty",
         "type", "rename", "duplicate", "drop", "nulls", "non_finite", "reorder", "extra", "none"]
#: kinds whose outcome is known: the reason they must be counted under (None = trained in full)
EXPECTED = {"garbage": "undecodable", "truncate": "undecodable", "non_utf8_name": "invalid_name",
            "schema_only": "empty_batch", "empty": "empty_batch", "duplicate": "duplicate_column",
            "drop": "missing_column", "rename": "missing_column", "nulls": "null", "non_finite": "non_finite",
            "reorder": None, "extra": None, "none": None}


def _source_batch(i: int, data: bytes) -> SourceBatch:
    pos = (lambda r, i=i: {"message": i, "row": r})
    try:
        batch = ipc_decoder(data)
    except Exception as exc:  # as KafkaSource does: the message is undecodable, the stream goes on
        return SourceBatch(None, lambda r, i=i: {"message": i + 1, "row": 0}, where=f"message {i}",
                           error=BadInputError(f"undecodable message: {exc}", reason="undecodable"))
    return SourceBatch(batch, pos, where=f"message {i}")


def _expected_rows(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray] | None:
    """X, y of the rows that should train, computed independently (None: the schema is not usable)."""
    try:
        names = batch.schema.names
    except UnicodeDecodeError:
        return None
    cols = []
    for name in FEATURES + ["y"]:
        if names.count(name) != 1:
            return None
        arr = batch.column(name)
        decoded = name != "y" and pa.types.is_dictionary(arr.type) and pa.types.is_floating(arr.type.value_type)
        if not pa.types.is_floating(arr.type) and not decoded:  # dictionary<float> features are decoded
            return None
        cols.append(np.array([np.nan if v is None else v for v in arr.to_pylist()], dtype=np.float64))
    M = np.column_stack(cols) if cols else np.empty((0, 4))
    keep = np.isfinite(M.astype(np.float32)).all(axis=1)
    return M[keep, :3].astype(np.float32), M[keep, 3].astype(np.float32)


def _messages():
    rng = np.random.default_rng(SEED)
    out = []
    for i in range(MESSAGES):
        kind = KINDS[i % len(KINDS)] if i < 2 * len(KINDS) else str(rng.choice(KINDS))
        out.append((kind, _mutate(kind, _base(rng), rng)))
    return out


def test_fuzzed_messages_train_as_decoded_or_count_as_bad_input():
    outcomes: Counter[tuple[str, str]] = Counter()
    stream = Rebatcher(16, ColumnPlan(features=FEATURES), on_bad="skip")
    stream_rows = 0
    for i, (kind, data) in enumerate(_messages()):
        sb = _source_batch(i, data)
        rb = Rebatcher(1000, ColumnPlan(features=FEATURES), on_bad="skip")
        out = list(rb.push(sb)) + list(rb.flush())
        stream_rows += sum(t.n_rows for t in stream.push(sb))
        skipped = sum(rb.skipped_rows.values())
        assert rb.rows_out + skipped == rb.rows_in, (kind, rb.skipped_rows)
        reasons = set(rb.skipped_rows) | set(rb.skipped_messages)
        assert reasons <= set(ROW_REASONS) | set(MESSAGE_REASONS), reasons
        if rb.rows_out == 0 and not reasons:
            raise AssertionError(f"message {i} ({kind}) vanished: nothing trained, nothing counted")
        if kind in EXPECTED:
            want = EXPECTED[kind]
            assert (not reasons) if want is None else (want in reasons), (i, kind, reasons)
        if rb.rows_out:
            expected = _expected_rows(sb.batch)
            assert expected is not None, (i, kind)
            X = np.concatenate([t.X for t in out])
            y = np.concatenate([t.y for t in out])
            np.testing.assert_array_equal(X, expected[0], err_msg=f"message {i} ({kind})")
            np.testing.assert_array_equal(y, expected[1], err_msg=f"message {i} ({kind})")
        # the same message under on_bad="raise": trains the same rows or raises BadInputError with a reason
        strict = Rebatcher(1000, ColumnPlan(features=FEATURES))
        try:
            n = sum(t.n_rows for t in strict.push(sb)) + sum(t.n_rows for t in strict.flush())
        except BadInputError as err:
            assert reasons and err.reason in reasons and "position" in str(err), (kind, err.reason, reasons)
        else:
            assert not reasons and n == rb.rows_out
        outcomes[(kind, "bad" if not rb.rows_out else "partly" if reasons else "trained")] += 1
        for r in reasons:
            outcomes[(kind, r)] += 1
    stream_rows += sum(t.n_rows for t in stream.flush())
    assert stream_rows == stream.rows_out == stream.rows_in - sum(stream.skipped_rows.values())
    kinds_bad = {k for (k, o) in outcomes if o == "bad"}
    assert {"bit_flip", "garbage", "type"} <= kinds_bad
    assert outcomes[("bit_flip", "trained")] > 0  # flips in data buffers decode to other valid values
    assert sum(outcomes[(k, o)] for k in set(KINDS) for o in ("trained", "partly", "bad")) == MESSAGES
