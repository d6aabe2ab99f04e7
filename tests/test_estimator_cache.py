"""What an estimator derives and keeps between calls is in one typed object (streamfit/estimators/_cache.py),
not in private attributes of its own; pickling leaves the one-row path out, and a clone starts afresh."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.base import clone

from streamfit import FMClassifier, LinearRegressor, LogisticRegression, MLPClassifier
from streamfit.estimators._cache import EstimatorCache, caches
from streamfit.models._rows import row_path
from streamfit.testing import ClickStream

#: private attributes an estimator may hold: its cache, the inputs= parameter as given, the column plan's own
ALLOWED = {"_caches", "_inputs_param", "_input_plan"}


def _private(est: object) -> set[str]:
    return {k for k in vars(est) if k.startswith("_") and not k.endswith("_")}


def _fitted() -> list:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 3))
    y = (X[:, 0] > 0).astype(int)
    dense = LogisticRegression(random_state=0)
    dense.partial_fit(X[:32], y[:32], classes=[0, 1])
    for i in range(32, 40):
        dense.partial_fit(X[i:i + 1], y[i:i + 1])  # one-row calls: the one-row path and the label cache
    mlp = MLPClassifier(hidden_layer_sizes=(4,), random_state=0).fit(X, y)
    shorthand = LinearRegressor(inputs=["a", "b"], random_state=0)
    shorthand.partial_fit({"a": X[:, 0], "b": X[:, 1]}, X[:, 0] - X[:, 1])
    stream = ClickStream(seed=0, n_categorical=3, n_dense=1, cardinalities=(5, 10, 20))
    batch = stream.batch(0, 64)
    label = batch.column("label").to_numpy()
    hashed = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=64)
    hashed.partial_fit(batch, label, classes=[0, 1])
    for i in range(4):
        hashed.partial_fit(batch.slice(i, 1), label[i:i + 1])
    fm = FMClassifier(stream.categorical, dense=stream.dense, buckets=64, n_factors=2, random_state=0)
    fm.partial_fit(batch, label, classes=[0, 1])
    return [dense, mlp, shorthand, hashed, fm]


def test_derived_state_is_one_cache_object():
    for est in _fitted():
        assert _private(est) <= ALLOWED, (type(est).__name__, _private(est) - ALLOWED)
        assert isinstance(est.__dict__["_caches"], EstimatorCache)


def test_pickling_leaves_the_row_path_out_and_keeps_the_rest():
    dense, _, _, hashed, fm = _fitted()
    for est in (dense, hashed):
        assert row_path(est) is not None
        copy = pickle.loads(pickle.dumps(est))
        assert caches(copy).rows is None and caches(est).rows is not None  # the original keeps its path
        assert caches(copy).labels.keys() == caches(est).labels.keys()
    copy = pickle.loads(pickle.dumps(fm))
    assert caches(copy).graph.key == caches(fm).graph.key and copy.model.SerializeToString() == fm.model.SerializeToString()
    assert copy.inputs == fm.inputs


@pytest.mark.parametrize("index", [0, 3])
def test_a_clone_starts_with_a_cache_of_its_own_and_a_set_params_makes_a_parameter_entry_again(index):
    est = _fitted()[index]
    copy = clone(est)  # get_params reads inputs: a hashed model's mapping is made there, in the clone's own cache
    assert caches(copy) is not caches(est) and caches(copy).rows is None and not caches(copy).labels
    if index == 3:
        before = est.inputs
        est.set_params(buckets=128)
        assert est.inputs is not before and row_path(est) is None
        est.set_params(buckets=64)
        assert est.inputs is not before  # made again: an entry holds the last parameters only
