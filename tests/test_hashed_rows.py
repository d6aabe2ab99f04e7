"""The one-row path of the hashed linear models (streamfit/models/_hashed_rows.py) against the general path:
the same ids, weights, optimizer state, predictions and errors, bit for bit, for one-row Arrow tables, record
batches, dicts of columns and the stream's encoded rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from streamfit import LinearRegressor, LogisticRegression, train_stream_sync
from streamfit.estimators._cache import caches
from streamfit.exceptions import BadInputError
from streamfit.features import Hashed
from streamfit.features._murmur import murmur3, murmur3_int
from streamfit.models import _hashed_rows
from streamfit.models._rows import row_path
from streamfit.optim import FTRL

CAT = ["c_int", "c_small", "c_str", "c_bool", "c_dict"]
DENSE = ["d0", "d1"]


def _table(n: int = 240, seed: int = 0) -> pa.Table:
    """Categorical columns of every kind the encoder takes (int64, int32, strings with nulls, bool, a
    dictionary of strings), two float64 dense columns, a 0/1 label and a real target."""
    rng = np.random.default_rng(seed)
    strings = np.array(["oslo", "paris", "lima", "", "kyiv"], object)[rng.integers(0, 5, n)]
    str_col = pa.array([None if i % 7 == 3 else s for i, s in enumerate(strings)], pa.string())
    d = rng.standard_normal((n, 2))
    big = rng.integers(-2**62, 2**62, n)
    big[::11] = rng.integers(0, 40, len(big[::11]))
    label = (rng.random(n) < 1 / (1 + np.exp(-(d[:, 0] + (big % 3 == 0))))).astype(np.int64)
    return pa.table({"c_int": pa.array(big, pa.int64()), "c_small": pa.array(rng.integers(0, 9, n), pa.int32()),
                     "c_str": str_col, "c_bool": pa.array(rng.random(n) < 0.3),
                     "c_dict": pa.array(rng.choice(["a", "b", "c"], n)).dictionary_encode(),
                     "d0": d[:, 0], "d1": d[:, 1], "label": label,
                     "target": d[:, 0] * 3 + (big % 5) + rng.standard_normal(n)})


def _numeric(n: int = 240, seed: int = 0) -> pa.Table:
    """Integer and float columns only (a click log's usual row: read as one tensor): int64 ids some of which
    are too large for float64 or null, int32, uint64 beyond 2**63, float64 and float32 dense columns."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, n)
    ids[::9] = rng.integers(2**53, 2**62, len(ids[::9]))
    d = rng.standard_normal((n, 2))
    label = (rng.random(n) < 1 / (1 + np.exp(-(d[:, 0] + (ids % 3 == 0))))).astype(np.int64)
    return pa.table({"n_int": pa.array([None if i % 13 == 5 else int(v) for i, v in enumerate(ids)], pa.int64()),
                     "n_small": pa.array(rng.integers(-5, 9, n), pa.int32()),
                     "n_u": pa.array(rng.integers(0, 2**64 - 1, n, dtype=np.uint64) | np.uint64(1 << 63)
                                     if seed % 2 else rng.integers(0, 99, n, dtype=np.uint64)),
                     "d0": d[:, 0], "d1": pa.array(d[:, 1].astype(np.float32)), "label": label,
                     "target": d[:, 0] * 3 + (ids % 5) + rng.standard_normal(n)})


NUMERIC = ["n_int", "n_small", "n_u"]


def _forms(table: pa.Table, i: int):
    """Row ``i`` as each input form a per-event caller uses, in turn (a null or a uint64 beyond int64 as a
    table: in a dict, ``pa.array`` refuses ``[None]`` as typeless and ``[2**63]`` as too large)."""
    row = table.slice(i, 1)
    form = i % 4
    values = row.to_pylist()[0].values()
    if form == 0 or (form >= 2 and any(v is None or type(v) is int and v >= 2**63 for v in values)):
        return row
    if form == 1:
        return row.to_batches()[0]
    if form == 2 or "c_str" not in row.schema.names:  # a dict of one-element lists, the label beside
        return row.to_pydict()
    return {c: row.column(c).to_numpy(zero_copy_only=False) for c in ["c_int", "c_small", "c_bool", "d0", "d1"]} | \
        {"c_str": np.array([row["c_str"][0].as_py()]), "c_dict": [row["c_dict"][0].as_py()]}


def _general(est) -> None:
    caches(est).rows = None


def _state(est) -> dict:
    s = est.state_dict()
    return {**{f"w/{k}": v for k, v in s["trainer"]["weights"].items()},
            **{f"o/{k}": v for k, v in s["trainer"]["optimizer"].items()},
            **({"target": s["target_scaler"]} if "target_scaler" in s else {})}


def _assert_same_state(a, b) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        if isinstance(sa[key], dict):
            for name in sa[key]:
                np.testing.assert_array_equal(sa[key][name], sb[key][name], err_msg=f"{key}/{name}")
        else:
            np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)


def test_python_hash_of_integers_is_the_kernels():
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.integers(-2**63, 2**63 - 1, 300, dtype=np.int64), [0, -1, 2**63 - 1, -2**63]])
    for seed in (0, 7, 2**32 - 1):
        assert [murmur3_int(int(v), seed) for v in values] == murmur3(values, seed).tolist()
    assert murmur3_int(2**64 - 1, 3) == murmur3_int(-1, 3)  # a uint64 wraps as the kernel's int64 does


@pytest.mark.parametrize("optimizer,numeric", [("adagrad", False), (FTRL(beta=1.0, l1=0.01, l2=0.1), False),
                                               ("sgd", True), (FTRL(beta=1.0, l1=0.01, l2=0.1), True)],
                         ids=["adagrad", "ftrl", "sgd-numeric", "ftrl-numeric"])
def test_classifier_row_path_equals_the_general_path(optimizer, numeric):
    table = _numeric(seed=1) if numeric else _table()
    kw = dict(categorical=NUMERIC if numeric else CAT, dense=DENSE, buckets=97, optimizer=optimizer, eta0=0.1, penalty=None, batch_size=1,
              random_state=0)
    fast, general = LogisticRegression(**kw), LogisticRegression(**kw)
    y = table.column("label").to_numpy()
    fast_out, general_out = [], []
    for i in range(table.num_rows):
        X = _forms(table, i)
        if i % 3 == 0:
            fast_out.append(fast.partial_fit_predict(X, y[i:i + 1], classes=[0, 1] if i == 0 else None))
            general_out.append(general.partial_fit_predict(X, y[i:i + 1], classes=[0, 1]))
        else:
            if i > 1:
                fast_out.append(fast.predict(X))
                _general(general)
                general_out.append(general.predict(X))
            fast.partial_fit(X, y[i:i + 1])
            general.partial_fit(X, y[i:i + 1], classes=[0, 1])  # classes= on every call: the general path
        _general(general)
    rows = caches(fast).rows
    assert rows.rows > 0.9 * table.num_rows  # nulls in a tensor's columns and the first row took the other one
    for a, b in zip(fast_out, general_out):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    _assert_same_state(fast, general)
    assert fast.t_ == general.t_ == table.num_rows and fast.loss_ == general.loss_
    np.testing.assert_array_equal(fast.predict_proba(table), general.predict_proba(table))


@pytest.mark.parametrize("standardize_target,numeric", [(True, False), (False, True)])
def test_regressor_row_path_equals_the_general_path(standardize_target, numeric):
    table = _numeric(seed=2) if numeric else _table(seed=2)
    kw = dict(categorical=NUMERIC if numeric else CAT, dense=DENSE, buckets=61, optimizer="adagrad", eta0=0.05, penalty=None,
              batch_size=1, random_state=0, standardize_target=standardize_target)
    fast, general = LinearRegressor(**kw), LinearRegressor(**kw)
    y = table.column("target").to_numpy()
    fast_out, general_out = [], []
    for i in range(table.num_rows):
        X = _forms(table, i)
        if i % 3 == 0:
            fast_out.append(fast.partial_fit_predict(X, y[i:i + 1]))
            general_out.append(general.partial_fit_predict(X, y[i:i + 1]))
        else:
            if i > 1:
                fast_out.append(fast.predict(X))
                _general(general)
                general_out.append(general.predict(X))
            fast.partial_fit(X, y[i:i + 1].tolist())
            general.partial_fit(X, y[i:i + 1])
        _general(general)
    assert caches(fast).rows.rows > 0.9 * table.num_rows
    for a, b in zip(fast_out, general_out):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    _assert_same_state(fast, general)
    np.testing.assert_array_equal(fast.predict(table), general.predict(table))


def _fitted(**kw):
    clf = LogisticRegression(categorical=CAT, dense=DENSE, buckets=97, optimizer="adagrad", batch_size=1, **kw)
    table = _table(n=20)
    clf.partial_fit(table.slice(0, 1), [0], classes=[0, 1])
    clf.partial_fit(table.slice(1, 1), [1])  # a label not encoded before: the general path
    clf.partial_fit(table.slice(2, 1), [1])
    assert caches(clf).rows.rows == 1
    return clf, table


def _error(est, X, y=(1,)):
    with pytest.raises(BadInputError) as info:
        est.partial_fit(X, list(y))
    return str(info.value), info.value


@pytest.mark.parametrize("case", ["nan", "null_dense", "int_dense", "kind", "missing", "overflow"])
def test_bad_rows_raise_the_general_paths_error_naming_the_column(case):
    fast, table = _fitted()
    general, _ = _fitted()
    row = table.slice(3, 1)
    column = {"nan": "d1", "null_dense": "d0", "int_dense": "d0", "kind": "c_small", "missing": "c_bool",
              "overflow": "d1"}[case]
    i = row.schema.get_field_index(column)
    if case == "nan":
        bad = row.set_column(i, column, pa.array([float("nan")]))
    elif case == "overflow":  # finite in float64, not in the float32 input
        bad = row.set_column(i, column, pa.array([1e300]))
    elif case == "null_dense":
        bad = row.set_column(i, column, pa.array([None], pa.float64()))
    elif case == "int_dense":
        bad = row.set_column(i, column, pa.array([3], pa.int64()))
    elif case == "kind":  # an int column that holds strings now: ids would change
        bad = row.set_column(i, column, pa.array(["3"]))
    else:
        bad = row.remove_column(i)
    before = fast.trainer_.get_weights()
    message, exc = _error(fast, bad)
    _general(general)
    assert message == _error(general, bad)[0]
    assert column in message and getattr(exc, "column", column) == column
    for name, w in fast.trainer_.get_weights().items():  # nothing trained on the bad row
        np.testing.assert_array_equal(w, before[name])
    as_dict = {c: bad.column(c).to_pylist() for c in bad.schema.names}
    with pytest.raises(BadInputError, match=column):
        fast.partial_fit(as_dict, [1])


def test_row_path_follows_replaced_state_and_parameters():
    clf, table = _fitted()
    rows = caches(clf).rows
    clf.partial_fit(table.slice(3, 1), [0])
    assert rows.rows == 2
    clf.set_params(buckets=101)  # the general path decides what a changed parameter does
    assert row_path(clf) is None
    clf.set_params(buckets=97)
    assert row_path(clf) is rows
    clone = LogisticRegression(**clf.get_params())
    clone.load_state_dict(clf.state_dict())  # a new trainer: the old path is not current for it
    assert row_path(clone) is None
    clone.partial_fit(table.slice(4, 1), [1])
    clone.partial_fit(table.slice(5, 1), [1])
    assert caches(clone).rows.rows == 1 and clone.t_ == clf.t_ + 2


def test_one_row_steps_find_distinct_ids_without_numpy_sorting(monkeypatch):
    from streamfit._engine.steps import sparse_tables as sparse

    clf, table = _fitted()
    monkeypatch.setattr(sparse, "_distinct", lambda *a: (_ for _ in ()).throw(AssertionError("numpy path")))
    clf.partial_fit(table.slice(4, 1), [1])
    clf.partial_fit(table.slice(2, 3), [1, 0, 1], )  # 15 ids: still a few


def test_few_ids_path_equals_the_sorting_path():
    from streamfit._engine.steps.sparse_tables import _distinct, _distinct_few, _FEW

    rng = np.random.default_rng(3)

    class Owner:
        _arange = np.zeros(0, np.int64)
        _keys = np.zeros(0, np.int64)

    for trial in range(200):
        rows = int(rng.integers(1, 50))
        shapes = [(1, int(rng.integers(1, 8))) for _ in range(int(rng.integers(1, 3)))]
        xs = tuple(rng.integers(-rows, rows, s) for s in shapes)
        slots = [(k, f"ids{k}") for k in range(len(xs))]
        size = sum(x.size for x in xs)
        assert size <= _FEW
        inv_a, inv_b = np.empty(size, np.int64), np.empty(size, np.int64)
        flat = np.concatenate([x.reshape(-1) for x in xs])
        flat = np.where(flat < 0, flat + rows, flat)
        np.testing.assert_array_equal(_distinct_few(xs, slots, rows, inv_a, "t"), _distinct(flat, rows, inv_b, Owner()))
        np.testing.assert_array_equal(inv_a, inv_b)
    with pytest.raises(BadInputError, match=r"input 'ids1': id 9 at row 0, position \(1,\) is outside the table 't'"):
        _distinct_few((np.array([[1]]), np.array([[0, 9]])), [(0, "ids0"), (1, "ids1")], 9, np.empty(3, np.int64), "t")


def test_stream_of_one_row_batches_takes_the_row_path_and_equals_it_without(monkeypatch):
    table = _numeric(n=120, seed=4).drop_columns(["target"])
    kw = dict(categorical=NUMERIC, dense=DENSE, buckets=53, optimizer="adagrad", eta0=0.1, penalty=None, batch_size=1,
              random_state=0)
    fast = LogisticRegression(**kw)
    fast_summary = train_stream_sync(fast, table, label="label", batch_size=1, classes=[0, 1])
    # all but the first row (with classes=; the loop commits the encoder's kinds after it, so the second is
    # general too) and the first row of the other label (not encoded yet)
    assert caches(fast).rows.rows >= table.num_rows - 3
    monkeypatch.setattr(_hashed_rows.HashedRow, "fits", classmethod(lambda cls, est: False))
    general = LogisticRegression(**kw)
    general_summary = train_stream_sync(general, table, label="label", batch_size=1, classes=[0, 1])
    assert caches(general).rows is None
    assert fast_summary.rows == general_summary.rows == table.num_rows
    assert fast_summary.stream_metrics == general_summary.stream_metrics
    _assert_same_state(fast, general)


@pytest.mark.parametrize("numeric", [False, True])
def test_ids_of_the_row_path_are_the_encoders(numeric):
    table = _numeric(n=60, seed=3) if numeric else _table(n=60)
    cat = NUMERIC if numeric else CAT
    clf = LogisticRegression(categorical=cat, dense=DENSE, buckets=97, batch_size=1)
    clf.partial_fit(table, table.column("label").to_numpy(), classes=[0, 1])
    rows = _hashed_rows.HashedRow(clf)
    enc = Hashed(cat, 97)
    taken = 0
    for i in range(table.num_rows):
        X = _forms(table, i)
        arrays = rows.read(X)
        if arrays is None:  # a null where the row is read as one tensor: the general path's
            continue
        taken += 1
        X = pa.table({k: pa.array(v) for k, v in X.items()}) if isinstance(X, dict) else X
        np.testing.assert_array_equal(arrays["ids"], enc.encode(enc.new_state(), [X.column(c) for c in cat]))
    assert taken > 0.85 * table.num_rows
