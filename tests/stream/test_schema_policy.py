"""Schema problems are bad input under the policy, never a crash; the column plan is fixed once per run."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from streamfit._stream.batching import Rebatcher
from streamfit._columns.plan import ColumnPlan
from streamfit.exceptions import BadInputError
from streamfit.sources._base import SourceBatch
from streamfit.sources.decoders import ipc_decoder
from tests.stream.helpers import make_batches


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def non_utf8_name(batch: pa.RecordBatch, name: str) -> pa.RecordBatch:
    """``batch`` with column ``name``'s first byte replaced by 0xFF, as a flipped IPC message decodes."""
    data = bytearray(_ipc(batch))
    i = data.find(len(name).to_bytes(4, "little") + name.encode() + b"\0")  # a flatbuffers string
    assert i >= 0
    data[i + 4] = 0xFF
    return ipc_decoder(bytes(data))


def push_all(rb: Rebatcher, batches) -> list:
    out = []
    for i, b in enumerate(batches):
        out += list(rb.push(SourceBatch(b, lambda r, i=i: {"batch": i, "row": r}, where=f"batch {i}")))
    return out + list(rb.flush())


def _with_extra(batch: pa.RecordBatch, at: int = 1) -> pa.RecordBatch:
    return batch.add_column(at, "extra", pa.array(np.ones(batch.num_rows, np.float32)))


@pytest.mark.parametrize("column", ["x1", "y", "zz"])
def test_non_utf8_column_name_is_bad_input(column):
    batches = make_batches([10, 10, 10], d=3, seed=2)
    if column == "zz":  # an extra column: still a broken schema
        batches[1] = batches[1].append_column("zz", pa.array(np.zeros(10, np.float32)))
    batches[1] = non_utf8_name(batches[1], column)
    with pytest.raises(UnicodeDecodeError):
        batches[1].schema.names  # the defect's trigger
    with pytest.raises(BadInputError) as info:
        push_all(Rebatcher(4, ColumnPlan(features=["x0", "x1", "x2"])), batches)
    assert info.value.reason == "invalid_name" and info.value.position == {"batch": 1, "row": 0}
    assert "not valid UTF-8" in str(info.value) and "\\xff" in str(info.value)
    for features in (None, ["x0", "x1", "x2"]):  # also when the bad schema is the first one seen
        rb = Rebatcher(4, ColumnPlan(features=features), on_bad="skip")
        out = push_all(rb, [batches[1], batches[0], batches[2]])
        assert sum(t.n_rows for t in out) == 20
        assert rb.skipped_messages == {"invalid_name": 1} and rb.skipped_rows == {"invalid_name": 10}
        assert rb.features == ["x0", "x1", "x2"]


def test_duplicate_column_is_refused_not_first_wins():
    batches = make_batches([10, 10], d=3, seed=3)
    dup = batches[1].append_column("x1", pa.array(np.full(10, 7.0, np.float32)))
    with pytest.raises(BadInputError) as info:
        push_all(Rebatcher(4, ColumnPlan()), [batches[0], dup])
    assert info.value.reason == "duplicate_column" and info.value.column == "x1"
    assert "appears 2 times" in str(info.value)
    rb = Rebatcher(4, ColumnPlan(), on_bad="skip")
    assert sum(t.n_rows for t in push_all(rb, [dup, batches[0]])) == 10
    assert rb.skipped_messages == {"duplicate_column": 1}
    dup_label = batches[1].append_column("y", batches[1].column("y"))
    with pytest.raises(BadInputError, match="label column 'y' appears 2 times"):
        push_all(Rebatcher(4, ColumnPlan(features=["x0", "x1", "x2"])), [dup_label])


def test_extra_column_in_first_batch_does_not_change_the_features():
    batches = make_batches([10, 10, 10], d=3, seed=4)
    first = _with_extra(batches[0])
    with pytest.raises(BadInputError) as info:
        push_all(Rebatcher(4, ColumnPlan(expected_width=3)), [first] + batches[1:])
    assert info.value.reason == "feature_count" and "give 4 values per row, the model takes 3" in str(info.value)
    rb = Rebatcher(4, ColumnPlan(expected_width=3), on_bad="skip")
    out = push_all(rb, [first] + batches[1:] + [_with_extra(batches[0], at=0)])
    assert rb.features == ["x0", "x1", "x2"] and rb.skipped_messages == {"feature_count": 1}
    # once fixed, the features are read by name: the extra column of the last batch is ignored
    assert sum(t.n_rows for t in out) == 30
    X = np.concatenate([t.X for t in out])
    ref = np.concatenate([np.column_stack([b.column(f"x{j}").to_numpy() for j in range(3)])
                          for b in batches[1:] + batches[:1]])
    np.testing.assert_array_equal(X, ref)


def test_reordered_columns_read_by_name_with_a_saved_layout():
    from streamfit._columns.layout import ColumnLayout

    batches = make_batches([10, 10], d=3, seed=5)
    layout = ColumnLayout(("x0", "x1", "x2"), (1, 1, 1), "y", None, "float32", "regression")
    reordered = [b.select(["y", "x2", "x0", "x1"]) for b in batches]
    rb = Rebatcher(4, ColumnPlan(layout=layout, expected_width=3))
    X = np.concatenate([t.X for t in push_all(rb, reordered)])
    ref = np.concatenate([np.column_stack([b.column(f"x{j}").to_numpy() for j in range(3)]) for b in batches])
    np.testing.assert_array_equal(X, ref)
    with pytest.raises(ValueError, match="features"):
        Rebatcher(4, ColumnPlan(layout=layout, features=["x2", "x1", "x0"]))
    with pytest.raises(ValueError, match="the model takes 4"):
        Rebatcher(4, ColumnPlan(layout=layout, expected_width=4))


def test_layout_round_trips_and_refuses_malformed_state():
    from streamfit._columns.layout import ColumnLayout

    layout = ColumnLayout(("x0", "emb"), (1, 8), "y", "w", "float64", "classification")
    assert ColumnLayout.from_json(layout.to_json()) == layout
    for bad in ({}, {**layout.to_json(), "widths": [1]}, {**layout.to_json(), "dtype": "int8"},
                {**layout.to_json(), "widths": [1, 0]}, {**layout.to_json(), "features": "x0"}):
        with pytest.raises(ValueError, match="malformed column layout"):
            ColumnLayout.from_json(bad)


def test_a_saved_layout_of_named_inputs_refuses_another_mapping():
    from streamfit._engine.prepare.model import ModelInput
    from streamfit._columns.layout import ColumnLayout
    from streamfit.features import Hashed

    mis = [ModelInput("x", np.dtype(np.float32), ("N", 2)), ModelInput("ids", np.dtype(np.int64), ("N",))]
    rb = Rebatcher(4, ColumnPlan(inputs={"x": ["x0", "x1"], "ids": Hashed("x2", 8)}, model_inputs=mis, cast=True))
    batch = make_batches([6], d=3)[0].set_column(2, "x2", pa.array(np.arange(6)))
    list(rb.push(SourceBatch(batch, lambda r: {"row": r})))
    saved = ColumnLayout.from_json(rb.layout.to_json())
    assert saved == rb.layout
    # the mapping is saved as typed JSON objects, not repr strings
    assert rb.layout.to_json()["inputs"] == {"x": {"columns": ["x0", "x1"]},
                                             "ids": {"encoder": "Hashed", "columns": ["x2"], "buckets": 8, "seed": 0}}
    Rebatcher(4, ColumnPlan(inputs={"x": ["x0", "x1"], "ids": Hashed("x2", 8)}, model_inputs=mis, layout=saved))
    with pytest.raises(ValueError, match="inputs"):
        Rebatcher(4, ColumnPlan(inputs={"x": ["x0", "x1"], "ids": Hashed("x2", 16)}, model_inputs=mis, layout=saved))
    # a checkpoint written before the typed form (repr strings) is still read, and still enforced
    old = {**rb.layout.to_json(), "inputs": {"x": "['x0', 'x1']", "ids": "Hashed(columns=('x2',), buckets=8, seed=0)"}}
    legacy = ColumnLayout.from_json(old)
    Rebatcher(4, ColumnPlan(inputs={"x": ["x0", "x1"], "ids": Hashed("x2", 8)}, model_inputs=mis, layout=legacy))
    with pytest.raises(ValueError, match="inputs"):
        Rebatcher(4, ColumnPlan(inputs={"x": ["x0", "x1"], "ids": Hashed("x2", 16)}, model_inputs=mis, layout=legacy))
    assert ColumnLayout.from_json(legacy.to_json()) == legacy


def _schema_only_bytes(schema: pa.Schema, *batches: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_schema_only_ipc_file_is_counted_not_silent(tmp_path):
    from sklearn.linear_model import SGDRegressor

    from streamfit import train_stream_sync

    batch = make_batches([10], d=2)[0]
    path = tmp_path / "schema_only.arrows"
    path.write_bytes(_schema_only_bytes(batch.schema))
    summary = train_stream_sync(SGDRegressor(), f"ipc:{path}", on_bad="skip")
    assert summary.rows == 0 and summary.skipped_messages == {"empty_batch": 1}
    with pytest.raises(BadInputError, match="empty record batch.*schema only"):
        train_stream_sync(SGDRegressor(), f"ipc:{path}", on_bad="raise")


def test_tcp_schema_only_connections_and_empty_batches_are_counted():
    import socket
    import threading

    import anyio

    from streamfit.sources import IpcTcpSource

    batch = make_batches([10], d=2)[0]
    payloads = [_schema_only_bytes(batch.schema), _schema_only_bytes(batch.schema, batch.slice(0, 0), batch)]

    async def main():
        rb = Rebatcher(4, ColumnPlan(), on_bad="skip")
        rows = 0
        async with IpcTcpSource(port=0, max_connections=2) as source:
            def produce():
                for data in payloads:
                    with socket.create_connection(("127.0.0.1", source.port)) as s:
                        s.sendall(data)
            thread = threading.Thread(target=produce)
            thread.start()
            with anyio.fail_after(20):
                async for sb in source:
                    rows += sum(t.n_rows for t in rb.push(sb))
            thread.join(5)
        rows += sum(t.n_rows for t in rb.flush())
        return rows, dict(rb.skipped_messages)

    assert anyio.run(main) == (10, {"empty_batch": 2})


def test_features_are_the_single_input_case_of_the_column_plan():
    """features= reads columns as a named input does: a dictionary<float> column is decoded (it was refused),
    scalar and vector columns are concatenated, the per-column widths of the first batch are kept."""
    batches = make_batches([10, 10], d=3, seed=7)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(20, dtype=np.float32)), 2)
    first = batches[0].set_column(1, "x1", batches[0].column("x1").dictionary_encode()).append_column("emb", emb)
    rb = Rebatcher(5, ColumnPlan(features=["x0", "x1", "emb"]))
    X = np.concatenate([t.X for t in push_all(rb, [first])])
    ref = np.column_stack([batches[0].column("x0").to_numpy(), batches[0].column("x1").to_numpy(),
                           np.arange(20, dtype=np.float32).reshape(10, 2)])
    np.testing.assert_array_equal(X, ref)
    assert rb.layout.widths == (1, 1, 2)
    wider = batches[1].append_column("emb", pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(30, np.float32)), 3))
    with pytest.raises(BadInputError, match=r"column 'emb' is fixed_size_list<item: float>\[3\], expected "
                                            r"fixed_size_list<float32>\[2\]"):
        push_all(rb, [wider])
