"""The River wrappers: River's own estimator checks, River's evaluation against River's models, widening."""

from __future__ import annotations

import numpy as np
import pytest

river = pytest.importorskip("river")
pd = pytest.importorskip("pandas")

import streamfit as sf  # noqa: E402
from streamfit.exceptions import BadInputError  # noqa: E402
from streamfit.river import RiverClassifier, RiverRegressor, to_river  # noqa: E402


@pytest.mark.parametrize("wrapper", [
    lambda: RiverClassifier(sf.LogisticRegression(batch_size=1)),
    lambda: RiverRegressor(sf.LinearRegressor(batch_size=1)),
    lambda: RiverClassifier(sf.MLPClassifier(hidden_layer_sizes=(8,), batch_size=1)),
], ids=["logistic", "linear", "mlp"])
def test_rivers_check_estimator(wrapper):
    """Cloning, pickling, learn_many == learn_one in a loop, features appearing and disappearing, predictions
    before any learning, bounded memory: every check River runs on its own estimators."""
    from river import base, checks

    model = wrapper()
    assert isinstance(model, (base.MiniBatchClassifier, base.MiniBatchRegressor))
    names = {check.__name__ for check in checks.yield_checks(model)}
    assert {"check_learn_many_matches_learn_one", "check_emerging_features", "check_clone_is_independent",
            "check_predict_one_before_any_learn"} <= names  # pandas installed: the mini-batch checks run too
    checks.check_estimator(model)


def _progressive(dataset, model, metric):
    from river import evaluate

    return evaluate.progressive_val_score(dataset, model, metric).get()


def test_progressive_val_score_on_phishing_beside_rivers_logistic_regression():
    from river import datasets, linear_model, metrics, preprocessing

    ours = _progressive(datasets.Phishing(), RiverClassifier(), metrics.Accuracy())
    theirs = _progressive(datasets.Phishing(), preprocessing.StandardScaler() | linear_model.LogisticRegression(),
                          metrics.Accuracy())
    assert ours >= theirs - 0.005, (ours, theirs)


def test_progressive_val_score_on_trump_approval_beside_rivers_linear_regression():
    from river import datasets, linear_model, metrics, preprocessing

    ours = _progressive(datasets.TrumpApproval(), RiverRegressor(), metrics.MAE())
    theirs = _progressive(datasets.TrumpApproval(), preprocessing.StandardScaler() | linear_model.LinearRegression(),
                          metrics.MAE())
    assert ours <= 1.05 * theirs, (ours, theirs)


def test_in_a_river_pipeline():
    """River's own preprocessing in front: the wrapper is one step of a pipeline."""
    from river import compose, datasets, metrics, preprocessing

    model = compose.Select("empty_server_form_handler", "popup_window", "https", "request_from_other_domain",
                           "anchor_from_other_domain", "is_popular", "long_url", "age_of_domain", "ip_in_url") \
        | preprocessing.StandardScaler() | RiverClassifier(sf.LogisticRegression(batch_size=1, standardize=False))
    assert _progressive(datasets.Phishing(), model, metrics.Accuracy()) > 0.85


def test_a_new_feature_is_a_feature_that_was_zero_so_far():
    """Widening the model when a feature appears gives what the model had learned with that feature at 0 in
    every earlier row: the same scaler statistics (exactly), weights and predictions (within float32 rounding: a
    linear model's one-row step takes ``[x, 1] @ theta`` as one product, whose sum of 3 terms and of 4 with a 0
    may round apart, streamfit/_engine/steps/scan_dense.py)."""
    rng = np.random.default_rng(0)
    rows = [({"a": float(a), "b": float(b)}, float(a - 2 * b)) for a, b in rng.standard_normal((40, 2))]
    late, early = RiverRegressor(), RiverRegressor()
    for x, y in rows:
        late.learn_one(x, y)
        early.learn_one({**x, "c": 0.0}, y)
    assert late.estimator_.n_features_in_ == 2
    for x, y in [({"a": 0.5, "b": 1.0, "c": 2.0}, 1.0), ({"c": -1.0, "a": 0.1}, 0.3)]:
        late.learn_one(x, y)
        early.learn_one(x, y)
    assert late.estimator_.n_features_in_ == 3
    a, b = late.estimator_.state_dict(), early.estimator_.state_dict()
    for key in ("coef_0", "intercept_0"):
        np.testing.assert_allclose(a["trainer"]["weights"][key], b["trainer"]["weights"][key], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(a["scaler"]["m2"], b["scaler"]["m2"])
    probe = {"a": 0.3, "b": -0.2, "c": 0.7, "unseen": 5.0}
    assert late.predict_one(probe) == pytest.approx(early.predict_one(probe), rel=1e-6, abs=1e-6)


def test_learn_many_is_learn_one_in_a_loop_nan_cells_missing():
    """A frame with NaN cells (pandas' missing values), learned at once (the chunk path: a partial_fit per part of
    the frame between new features) and row by row: the same model (within float32 rounding: the chunks of a
    linear model run its lean one-row step, streamfit/_engine/steps/scan_dense.py)."""
    from river import datasets

    rows = list(datasets.Phishing().take(60))
    frame = pd.DataFrame([x for x, _ in rows])
    frame.iloc[::7, 2] = np.nan  # some cells missing
    many, one = RiverClassifier(seed=0), RiverClassifier(seed=0)
    many.learn_many(frame, pd.Series([y for _, y in rows]))
    present = [{k: v for k, v in cells.items() if v == v} for _, cells in frame.iterrows()]
    for x, (_, y) in zip(present, rows):
        one.learn_one(x, y)
    assert many.estimator_.t_ == one.estimator_.t_ == len(rows)  # one step per row, the frame cut where "c2" appears
    np.testing.assert_allclose(many.estimator_.state_dict()["trainer"]["weights"]["coef_0"],
                               one.estimator_.state_dict()["trainer"]["weights"]["coef_0"], rtol=1e-6, atol=1e-7)
    proba = many.predict_proba_many(frame)
    assert list(proba.columns) == [False, True]
    np.testing.assert_allclose(proba[True].to_numpy(), [one.predict_proba_one(x)[True] for x in present], rtol=1e-6)
    assert many.predict_many(frame).tolist() == [one.predict_one(x) for x in present]


def test_multiclass_with_given_classes():
    from river import datasets

    rows = list(datasets.ImageSegments().take(300))
    classes = tuple(sorted({y for _, y in rows}))
    model = RiverClassifier(sf.LogisticRegression(batch_size=1), classes=classes)
    assert model._multiclass and model.predict_proba_one(rows[0][0]) == {c: 1 / len(classes) for c in classes}
    hits = 0
    for x, y in rows:
        hits += model.predict_one(x) == y
        model.learn_one(x, y)
    assert set(model.predict_proba_one(rows[0][0])) == set(classes)
    assert hits / len(rows) > 0.6
    with pytest.raises(BadInputError, match="label 'nope' is not one of classes"):
        model.learn_one(rows[0][0], "nope")


def test_labels_that_are_not_booleans_need_classes():
    """Without classes= the wrapper is binary over False/True (River's convention): a string label is refused with
    what to give, not taken as True (bool('ham') is True); with two classes given, they are the labels."""
    model = RiverClassifier()
    with pytest.raises(BadInputError, match="label 'ham' is not a boolean.*classes=\\('ham'"):
        model.learn_one({"a": 1.0}, "ham")
    model.learn_one({"a": 1.0}, 1)
    model.learn_one({"a": -1.0}, False)
    assert set(model.predict_proba_one({"a": 0.5})) == {False, True}
    named = RiverClassifier(classes=("ham", "spam"))
    for k in range(40):
        named.learn_one({"a": float(k % 2)}, "spam" if k % 2 else "ham")
    assert named.predict_one({"a": 1.0}) == "spam" and named.predict_one({"a": 0.0}) == "ham"


def test_bad_values_name_the_feature():
    model = RiverRegressor()
    with pytest.raises(BadInputError, match="feature 'b' is 'x'"):
        model.learn_one({"a": 1.0, "b": "x"}, 1.0)
    model.learn_one({"a": 1.0}, 1.0)
    with pytest.raises(BadInputError, match="feature 'a' is nan"):
        model.learn_one({"a": float("nan")}, 1.0)


def test_to_river_and_what_it_refuses():
    assert isinstance(to_river(sf.MLPRegressor()), RiverRegressor)
    assert isinstance(to_river(sf.LogisticRegression(), seed=1), RiverClassifier)
    with pytest.raises(TypeError, match="ready-made dense model"):
        to_river(sf.LogisticRegression(categorical=["c"]))
    with pytest.raises(TypeError, match="ready-made dense model"):
        RiverClassifier(sf.OnnxClassifier()).learn_one({"a": 1.0}, True)
