"""Every bad-input kind under on_bad="raise" and on_bad="skip", in the rebatcher and through the loop."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pytest
from sklearn.linear_model import SGDClassifier, SGDRegressor

from streamfit._stream import train_stream
from streamfit._stream.batching import Rebatcher
from streamfit._columns.plan import ColumnPlan
from streamfit.sources._base import SourceBatch
from streamfit.exceptions import BadInputError

import streamfit._stream.loop as loop_module
from tests.stream.helpers import UNDECODABLE, ListSource, fit_reference, make_batches, reference_chunks

N, BAD_ROW = 20, 5


def _set(batch: pa.RecordBatch, name: str, arr: pa.Array) -> pa.RecordBatch:
    return batch.set_column(batch.schema.get_field_index(name), name, arr)


def _with_value(batch, name, value):
    v = batch.column(name).to_numpy().copy()
    v[BAD_ROW] = value
    return _set(batch, name, pa.array(v))


def _with_null(batch, name):
    v = batch.column(name).to_numpy()
    mask = np.zeros(len(v), dtype=bool)
    mask[BAD_ROW] = True
    return _set(batch, name, pa.array(v, mask=mask))


# kind: (mutation of record batch 1, reason, column, row-level?, message fragment)
KINDS = {
    "missing_feature": (lambda b: b.drop_columns(["x2"]), "missing_column", "x2", False,
                        "column 'x2' is missing, expected float32"),
    "missing_label": (lambda b: b.drop_columns(["y"]), "missing_column", "y", False,
                      "label column 'y' is missing, expected float32"),
    "string_feature": (lambda b: _set(b, "x1", pa.array([str(v) for v in b.column("x1").to_pylist()])),
                       "wrong_type", "x1", False, "column 'x1' is string, expected float32"),
    "int_feature": (lambda b: _set(b, "x1", pa.array(np.arange(N), pa.int64())), "wrong_type", "x1", False,
                    "column 'x1' is int64, expected float32 (pass cast=True"),
    "null_feature": (lambda b: _with_null(b, "x1"), "null", "x1", True, "column 'x1' has a null"),
    "null_label": (lambda b: _with_null(b, "y"), "null", "y", True, "label column 'y' has a null"),
    "nan_feature": (lambda b: _with_value(b, "x0", np.nan), "non_finite", "x0", True,
                    "column 'x0' has nan, expected a finite float32"),
    "inf_label": (lambda b: _with_value(b, "y", np.inf), "non_finite", "y", True, "label column 'y' has inf"),
    "nan_weight": (lambda b: _with_value(b, "w", np.nan), "non_finite", "w", True, "weight column 'w' has nan"),
    "negative_weight": (lambda b: _with_value(b, "w", -1.0), "negative_weight", "w", True,
                        "weight column 'w' has -1.0, expected a weight >= 0"),
    "empty_batch": (lambda b: b.slice(0, 0), "empty_batch", None, False, "empty record batch"),
    "undecodable": (lambda b: UNDECODABLE, "undecodable", None, False, "undecodable message: not an Arrow IPC"),
}


def stream_with(kind):
    batches = make_batches([N, N, N], d=3, weight=True, seed=1)
    items = list(batches)
    items[1] = KINDS[kind][0](batches[1])
    return batches, items


def expected_error_position(kind):
    reason, row_level = KINDS[kind][1], KINDS[kind][3]
    if reason == "undecodable":
        return {"batch": 2, "row": 0}  # SourceBatch contract: position after the bad message
    return {"batch": 1, "row": BAD_ROW if row_level else 0}


def push_all(rebatcher, source_items):
    from streamfit.sources._base import SourceBatch
    from streamfit.exceptions import BadInputError as E
    n = 0
    for i, item in enumerate(source_items):
        if item is UNDECODABLE:
            sb = SourceBatch(None, lambda r, i=i: {"batch": i + 1, "row": 0},
                             error=E("not an Arrow IPC stream", reason="undecodable"), where=f"batch {i}")
        else:
            sb = SourceBatch(item, lambda r, i=i: {"batch": i, "row": r}, where=f"batch {i}")
        n += sum(t.n_rows for t in rebatcher.push(sb))
    return n + sum(t.n_rows for t in rebatcher.flush())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_raise_names_column_position_and_expectation(kind):
    _, items = stream_with(kind)
    _, reason, column, _, fragment = KINDS[kind]
    with pytest.raises(BadInputError) as info:
        push_all(Rebatcher(8, ColumnPlan(weight="w")), items)
    err = info.value
    assert err.reason == reason and err.column == column
    assert err.position == expected_error_position(kind)
    msg = str(err)
    assert fragment in msg, msg
    assert "batch 1" in msg and f"position {expected_error_position(kind)!r}" in msg, msg


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skip_counts_by_reason_and_logs_position(kind, caplog):
    _, items = stream_with(kind)
    _, reason, column, row_level, fragment = KINDS[kind]
    rb = Rebatcher(8, ColumnPlan(weight="w"), on_bad="skip")
    with caplog.at_level(logging.WARNING, logger="streamfit.stream"):
        trained = push_all(rb, items)
    if row_level:
        assert rb.skipped_rows == {reason: 1} and rb.skipped_messages == {}
        assert trained == 3 * N - 1
    else:
        rows = N if reason in ("missing_column", "wrong_type") else 0
        assert rb.skipped_messages == {reason: 1}
        assert rb.skipped_rows == ({reason: rows} if rows else {})
        assert trained == 2 * N
    (record,) = caplog.records
    assert fragment in record.getMessage() and str(expected_error_position(kind)) in record.getMessage()


def test_each_bad_row_is_counted_once_under_its_first_reason():
    b = make_batches([N], d=3, weight=True)[0]
    b = _with_value(b, "x0", np.nan)
    b = _with_null(b, "x1")                            # row 5: null and NaN -> counted as null
    y = b.column("y").to_numpy().copy(); y[7] = -np.inf
    w = b.column("w").to_numpy().copy(); w[9] = -2.0; w[7] = -1.0  # row 7: non-finite label first
    b = _set(_set(b, "y", pa.array(y)), "w", pa.array(w))
    rb = Rebatcher(4, ColumnPlan(weight="w"), on_bad="skip")
    assert push_all(rb, [b]) == N - 3
    assert rb.skipped_rows == {"null": 1, "non_finite": 1, "negative_weight": 1}


def test_raise_reports_the_first_bad_row():
    b = make_batches([N], d=2)[0]
    b = _with_value(_with_value(b, "x1", np.inf), "x0", 3.0)
    y = b.column("y").to_numpy().copy(); y[2] = np.nan
    b = _set(b, "y", pa.array(y))
    with pytest.raises(BadInputError, match="label column 'y' has nan") as info:
        push_all(Rebatcher(4, ColumnPlan()), [b])
    assert info.value.position == {"batch": 0, "row": 2}


def test_vector_problems():
    d = 4
    good = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(N * d, dtype=np.float32)), d)
    y = pa.array(np.ones(N, np.float32))
    other_width = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(N * 2, dtype=np.float32)), 2)
    vals = np.arange(N * d, dtype=np.float32); vals[BAD_ROW * d + 2] = np.nan
    with_nan = pa.FixedSizeListArray.from_arrays(pa.array(vals), d)
    with_null = pa.array([None if i == BAD_ROW else [1.0] * d for i in range(N)], pa.list_(pa.float32(), d))
    batches = [pa.record_batch({"emb": a, "y": y}) for a in (good, other_width, with_nan, with_null)]
    with pytest.raises(BadInputError, match=r"column 'emb' is fixed_size_list<item: float>\[2\], "
                                            r"expected fixed_size_list<float32>\[4\]"):
        push_all(Rebatcher(8, ColumnPlan(features="emb")), batches)
    with pytest.raises(BadInputError, match="column 'emb' has nan") as info:
        push_all(Rebatcher(8, ColumnPlan(features="emb")), [batches[0], batches[2]])
    assert info.value.position == {"batch": 1, "row": BAD_ROW}
    rb = Rebatcher(8, ColumnPlan(features="emb"), on_bad="skip")
    assert push_all(rb, batches) == 4 * N - N - 2
    assert rb.skipped_rows == {"wrong_type": N, "non_finite": 1, "null": 1}


def test_classification_label_types():
    b = make_batches([N], d=2, classes=3)[0]
    as_float = _set(b, "y", pa.array(b.column("y").to_numpy().astype(np.float64)))
    with pytest.raises(BadInputError, match="label column 'y' is double, expected integer, string, dictionary or "
                                            r"bool class labels \(pass cast=True"):
        push_all(Rebatcher(8, ColumnPlan(task="classification")), [as_float])
    fractional = _with_value(as_float, "y", 1.5)
    with pytest.raises(BadInputError, match="label column 'y' has 1.5, expected a whole-number class label"):
        push_all(Rebatcher(8, ColumnPlan(task="classification", cast=True)), [fractional])
    rb = Rebatcher(8, ColumnPlan(task="classification", cast=True), on_bad="skip")
    assert push_all(rb, [fractional]) == N - 1 and rb.skipped_rows == {"non_integer_label": 1}
    timestamps = _set(b, "y", pa.array(np.arange(N).astype("datetime64[s]")))
    with pytest.raises(BadInputError, match="label column 'y' is timestamp.s., expected integer, string"):
        push_all(Rebatcher(8, ColumnPlan(task="classification")), [timestamps])


def test_string_dictionary_and_bool_class_labels_unknown_class_is_a_bad_row():
    b = make_batches([N], d=2, classes=3)[0]
    names = np.array(["ant", "bee", "cat"])[b.column("y").to_numpy()]
    for labels, classes in ((pa.array(names), ["ant", "bee", "cat"]),
                            (pa.array(names).dictionary_encode(), ["ant", "bee", "cat"]),
                            (pa.array(b.column("y").to_numpy() > 0), [False, True])):
        batches = [_set(b, "y", labels)]
        rb = Rebatcher(8, ColumnPlan(task="classification", classes=classes))
        ys = [t.y for t in rb.push(SourceBatch(batches[0], lambda r: {"row": r}))] + [t.y for t in rb.flush()]
        assert np.concatenate(ys).tolist() == labels.to_pylist() if not pa.types.is_dictionary(labels.type) \
            else np.concatenate(ys).tolist() == names.tolist()
    odd = names.copy()
    odd[BAD_ROW] = "dog"
    with pytest.raises(BadInputError, match=r"label column 'y' has 'dog', expected one of the classes \['ant', "
                                            r"'bee', 'cat'\]") as info:
        push_all(Rebatcher(8, ColumnPlan(task="classification", classes=["ant", "bee", "cat"])), [_set(b, "y", pa.array(odd))])
    assert info.value.reason == "unknown_class" and info.value.position == {"batch": 0, "row": BAD_ROW}
    rb = Rebatcher(8, ColumnPlan(task="classification"), on_bad="skip")  # classes learned from the first batch
    assert push_all(rb, [_set(b, "y", pa.array(names)), _set(b, "y", pa.array(odd))]) == 2 * N - 1
    assert rb.classes.tolist() == sorted(set(names.tolist())) and rb.skipped_rows == {"unknown_class": 1}


# ---------------------------------------------------------------------------------- through the loop
@pytest.fixture(params=["on the event loop", "extracted ahead in a thread"])
def extraction(request, monkeypatch):
    """Both places the loop checks and extracts a record batch (large ones go to a worker thread)."""
    if request.param != "on the event loop":
        monkeypatch.setattr(loop_module, "_AHEAD_VALUES", 0)
    return request.param


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["string_feature", "nan_feature", "undecodable", "negative_weight"])
async def test_loop_raise_trains_the_batches_before_and_raises_the_error_itself(kind, extraction):
    _, items = stream_with(kind)
    source = ListSource(items)
    events = []
    with pytest.raises(BadInputError) as info:
        await train_stream(SGDRegressor(random_state=0), source, weight="w", batch_size=10, on_bad="raise",
                           on_batch=events.append)
    assert info.value.reason == KINDS[kind][1] and info.value.position == expected_error_position(kind)
    assert [e.position for e in events] == [{"batch": 0, "row": 10}, {"batch": 0, "row": 20}]
    assert source.close_calls == 1


@pytest.mark.anyio
@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_loop_skip_trains_exactly_the_good_rows(kind, extraction):
    batches, items = stream_with(kind)
    _, reason, _, row_level, _ = KINDS[kind]
    source = ListSource(items)
    est = SGDRegressor(random_state=0)
    summary = await train_stream(est, source, weight="w", batch_size=8, on_bad="skip")
    keep = np.ones(3 * N, dtype=bool)
    if row_level:
        keep[N + BAD_ROW] = False
    else:
        keep[N:2 * N] = False
    ref = fit_reference(SGDRegressor(random_state=0),
                        reference_chunks(batches, ["x0", "x1", "x2"], 8, weight="w", keep=keep))
    assert np.all(np.isfinite(est.coef_)) and np.isfinite(est.intercept_).all()
    np.testing.assert_array_equal(est.coef_, ref.coef_)
    np.testing.assert_array_equal(est.intercept_, ref.intercept_)
    assert summary.rows == keep.sum()
    if row_level:
        assert summary.skipped_rows == {reason: 1} and summary.skipped_messages == {}
    else:
        assert summary.skipped_messages == {reason: 1}
    assert summary.position == {"batch": 2, "row": N}


@pytest.mark.anyio
async def test_loop_classifier_skip_keeps_weights_finite(extraction):
    batches = make_batches([N, N], d=2, classes=3, seed=3)
    bad = _set(batches[1], "x0", pa.array(np.full(N, np.nan, np.float32)))
    est = SGDClassifier(loss="log_loss", random_state=0)
    summary = await train_stream(est, ListSource([batches[0], bad]), classes=[0, 1, 2], batch_size=8,
                                 on_bad="skip")
    assert summary.skipped_rows == {"non_finite": N} and summary.rows == N
    assert np.isfinite(est.coef_).all()
