"""Rebatcher (pure): sizes, positions, buffer ring, zero copy, column policy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from streamfit._stream.batching import Rebatcher
from streamfit._columns.plan import ColumnPlan
from streamfit.sources._base import SourceBatch

from tests.stream.helpers import expected_position, make_batches, reference_chunks, to_vector


def sbs(batches):
    return [SourceBatch(b, lambda r, i=i: {"batch": i, "row": r}, where=f"batch {i}")
            for i, b in enumerate(batches)]


def run(rebatcher, batches, copy=True):
    out = []
    for sb in sbs(batches):
        for tb in rebatcher.push(sb):
            out.append(_snap(tb) if copy else tb)
    for tb in rebatcher.flush():
        out.append(_snap(tb) if copy else tb)
    return out


def _snap(tb):
    return (tb.X.copy(), tb.y.copy(), None if tb.sample_weight is None else tb.sample_weight.copy(),
            tb.n_rows, tb.position)


SIZES = [5, 61, 300, 1, 1, 200, 44, 513, 3]


@pytest.mark.parametrize("batch_size", [1, 7, 64, 2000])
def test_rebatching_across_boundaries_matches_reference(batch_size):
    batches = make_batches(SIZES, d=4, weight=True)
    got = run(Rebatcher(batch_size, ColumnPlan(weight="w"), ring_size=3), batches)
    ref = reference_chunks(batches, ["x0", "x1", "x2", "x3"], batch_size, weight="w")
    assert len(got) == len(ref)
    consumed = 0
    for (X, y, w, n, pos), (rX, ry, rw) in zip(got, ref):
        assert X.dtype == np.float32 and X.shape == rX.shape and X.flags.c_contiguous
        np.testing.assert_array_equal(X, rX)
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_array_equal(w, rw)
        consumed += n
        assert pos == expected_position(SIZES, consumed)
    assert consumed == sum(SIZES)


def test_ring_reuses_buffers_and_allocates_nothing_once_warm():
    batches = make_batches([40] * 10, d=3)
    rb = Rebatcher(16, ColumnPlan(), ring_size=3)
    tbs = run(rb, batches, copy=False)
    full = [t for t in tbs if t.n_rows == 16]
    for k in range(len(full) - 3):
        assert full[k].X is full[k + 3].X          # same preallocated buffer, 3 batches later
        assert full[k].y is full[k + 3].y
        for j in (1, 2):
            assert not np.shares_memory(full[k].X, full[k + j].X)


def test_fresh_arrays_without_ring():
    tbs = run(Rebatcher(16, ColumnPlan()), make_batches([64], d=2), copy=False)
    assert not any(np.shares_memory(a.X, b.X) for a in tbs for b in tbs if a is not b)


@pytest.mark.parametrize("tensor", [False, True])
def test_vector_column_zero_copy_inside_a_record_batch(tensor):
    batches = [to_vector(b, 5, tensor=tensor) for b in make_batches([64, 40, 24], d=5)]
    rb = Rebatcher(16, ColumnPlan(features=["emb"]), ring_size=4)
    tbs = run(rb, batches, copy=False)
    first = batches[0].column("emb")
    storage = first.storage if tensor else first
    arrow_values = storage.flatten().to_numpy(zero_copy_only=True)
    assert all(np.shares_memory(t.X, arrow_values) for t in tbs[:4])  # 64 rows = 4 views, no copy
    assert not tbs[0].X.flags.writeable  # a read-only view of Arrow memory
    # 40 rows: 2 views + 8 rows copied, completed by the next batch's first 8 rows (spans: a copy)
    spanning = tbs[6]
    assert spanning.X.flags.writeable and spanning.position == {"batch": 2, "row": 8}
    assert [t.X.shape for t in tbs] == [(16, 5)] * 8
    ref = reference_chunks(batches, ["emb"], 16)
    for (X, y, _, _, _), (rX, ry, _) in zip(run(Rebatcher(16, ColumnPlan(features=["emb"]), ring_size=4), batches), ref):
        np.testing.assert_array_equal(X, rX)
        np.testing.assert_array_equal(y, ry)


def test_vector_column_sliced_and_float64_copy():
    batch = to_vector(make_batches([50], d=3)[0], 3)
    sliced = batch.slice(7, 30)  # offset != 0: '.values' would be wrong, the slice must be respected
    tbs = run(Rebatcher(10, ColumnPlan(features="emb", dtype=np.float64)), [sliced])
    ref = reference_chunks([sliced], ["emb"], 10, dtype=np.float64)
    for (X, y, _, _, _), (rX, ry, _) in zip(tbs, ref):
        assert X.dtype == np.float64 and y.dtype == np.float64
        np.testing.assert_array_equal(X, rX)


def test_mixed_scalar_and_vector_features():
    b = make_batches([12], d=4)[0]
    vec = to_vector(b, 3).column("emb")
    batch = pa.record_batch({"a": b.column("x3"), "emb": vec, "y": b.column("y")})
    (X, _, _, _, _), = run(Rebatcher(12, ColumnPlan(features=["a", "emb"])), [batch])
    expected = np.column_stack([b.column(f"x{j}").to_numpy() for j in (3, 0, 1, 2)])
    np.testing.assert_array_equal(X, expected)


def test_default_features_are_all_but_label_and_weight_fixed_by_first_batch():
    b = make_batches([8], d=3, weight=True)[0]
    rb = Rebatcher(8, ColumnPlan(weight="w"))
    later = b.append_column("extra", pa.array(["s"] * 8))  # extra columns later are ignored
    run(rb, [b, later])
    assert rb.features == ["x0", "x1", "x2"] and rb.n_features == 3


def test_max_rows_cuts_the_last_batch_and_stops():
    rb = Rebatcher(16, ColumnPlan(), max_rows=37)
    tbs = run(rb, make_batches([20, 20, 20], d=2))
    assert [t[3] for t in tbs] == [16, 16, 5]
    assert tbs[-1][4] == {"batch": 1, "row": 17}
    assert rb.done and rb.end_position == {"batch": 1, "row": 17}


def test_drop_last_discards_partial_batch_and_resumes_before_it():
    rb = Rebatcher(16, ColumnPlan(), drop_last=True)
    tbs = run(rb, make_batches([20, 20], d=2))
    assert [t[3] for t in tbs] == [16, 16]
    assert rb.end_position == {"batch": 1, "row": 12}


def test_classification_labels_int64():
    batches = make_batches([10, 10], d=2, classes=3)
    tbs = run(Rebatcher(8, ColumnPlan(task="classification")), batches)
    assert all(t[1].dtype == np.int64 for t in tbs)
    np.testing.assert_array_equal(np.concatenate([t[1] for t in tbs]),
                                  np.concatenate([b.column("y").to_numpy() for b in batches]))


def test_cast_true_converts_integer_and_bool_columns():
    batch = pa.record_batch({"i": pa.array([1, 2, 3], pa.int64()), "b": pa.array([True, False, True]),
                             "y": pa.array([1, 0, 1], pa.int32())})
    (X, y, _, _, _), = run(Rebatcher(3, ColumnPlan(cast=True)), [batch])
    np.testing.assert_array_equal(X, [[1, 1], [2, 0], [3, 1]])
    np.testing.assert_array_equal(y, [1.0, 0.0, 1.0])


def test_invalid_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        Rebatcher(0, ColumnPlan())
    with pytest.raises(ValueError, match="on_bad"):
        Rebatcher(4, ColumnPlan(), on_bad="ignore")
    with pytest.raises(ValueError, match="dtype"):
        Rebatcher(4, ColumnPlan(dtype=np.int32))
    with pytest.raises(ValueError, match="both a feature"):
        Rebatcher(4, ColumnPlan(features=["x", "y"]))


def test_max_rows_on_the_zero_copy_path_emits_no_empty_batch():
    import numpy as np
    import pyarrow as pa

    from streamfit._stream.batching import Rebatcher
    from streamfit.sources._base import SourceBatch

    X = np.arange(64 * 4, dtype=np.float32)
    vec = pa.FixedSizeListArray.from_arrays(pa.array(X), 4)
    batch = pa.record_batch([vec, pa.array(np.zeros(64, np.float32))], ["x", "y"])
    sb = SourceBatch(batch, lambda r: {"batch": 0, "row": r})
    rb = Rebatcher(16, ColumnPlan(features=["x"], label="y"), max_rows=48)
    out = list(rb.push(sb)) + list(rb.flush())
    assert [b.n_rows for b in out] == [16, 16, 16]
    assert out[-1].position == {"batch": 0, "row": 48}


def test_extract_ahead_gives_the_same_batches_and_changes_no_state():
    batches = make_batches([30, 50, 20], d=3, weight=True)
    plain = run(Rebatcher(16, ColumnPlan(weight="w"), ring_size=3), batches)
    rb = Rebatcher(16, ColumnPlan(weight="w"), ring_size=3)
    got = []
    for sb in sbs(batches):
        before = (rb.rows_in, dict(rb.skipped_rows), rb._fill)
        ahead = rb.extract_ahead(sb)
        assert (rb.rows_in, dict(rb.skipped_rows), rb._fill) == before  # no state change
        assert (ahead is None) == (sb is sbs(batches)[0] or rb.layout is None)  # no plan before the first batch
        got += [_snap(tb) for tb in rb.push(sb, ahead)]
    got += [_snap(tb) for tb in rb.flush()]
    assert len(got) == len(plain)
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
        assert a[3:] == b[3:]


def test_extract_ahead_leaves_new_schemas_and_column_problems_to_push():
    rb = Rebatcher(4, ColumnPlan())
    good = make_batches([8], d=2)[0]
    list(rb.push(sbs([good])[0]))
    assert rb.extract_ahead(sbs([good])[0]) is not None
    wider = make_batches([8], d=3)[0]  # another schema: push decides (here: a missing/extra column problem)
    assert rb.extract_ahead(sbs([wider])[0]) is None
    bad = good.set_column(0, "x0", pa.array([str(v) for v in good.column("x0").to_pylist()]))
    assert rb.extract_ahead(sbs([bad])[0]) is None
    nan = good.set_column(0, "x0", pa.array([np.nan] + good.column("x0").to_pylist()[1:], pa.float32()))
    ahead = rb.extract_ahead(sbs([nan])[0])
    assert ahead is not None and ahead.checks and ahead.checks[0][0] == "non_finite"  # the check travels with it
