"""Ready-made models: scikit-learn's estimator checks, graphs, online standardization, state and pickling."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import onnxruntime as ort
import pytest

from streamfit import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor
from streamfit.exceptions import BadInputError
from streamfit.models import RunningScaler
from streamfit.models.scaler import update_steps_together
from streamfit.models._graphs import dense_model, standardized

sklearn = pytest.importorskip("sklearn")
estimator_checks = pytest.importorskip("sklearn.utils.estimator_checks")
if "expected_failed_checks" not in inspect.signature(estimator_checks.parametrize_with_checks).parameters:
    pytest.skip("the estimator checks need scikit-learn >= 1.6 (expected_failed_checks)", allow_module_level=True)

_MINIBATCH = ("sample_weight is not equivalent to removing/repeating samples: a step averages the loss over the "
              "rows of its minibatch, so repeating a row changes the batches and the number of steps (scikit-learn "
              "expects the same failure of its SGD estimators)")
_GEMM_ORDER = ("onnxruntime's float32 MatMul sums in another order for 1 row than for 20 rows, so an MLP's "
               "prediction of one row may differ from the same row's in a batch in the last bits (2e-7 relative), "
               "just beyond the check's rtol=1e-7; linear models happen to be bit-identical here")


def _expected_failures(estimator):
    """The checks that cannot pass, and why (the same for standardize=True)."""
    failures = {"check_sample_weight_equivalence_on_dense_data": _MINIBATCH}
    if isinstance(estimator, MLPRegressor):
        failures["check_methods_subset_invariance"] = _GEMM_ORDER
    return failures


CHECKED = [LinearRegressor(), LogisticRegression(), MLPRegressor(), MLPClassifier(),  # standardizing (defaults)
           LinearRegressor(standardize=False, standardize_target=False), LogisticRegression(standardize=False),
           MLPRegressor(standardize=False, standardize_target=False), MLPClassifier(standardize=False)]


@estimator_checks.parametrize_with_checks(CHECKED, expected_failed_checks=_expected_failures)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# -- graphs ------------------------------------------------------------------------------------------
def _forward(layers, activation, X):
    act = {"identity": lambda z: z, "relu": lambda z: np.maximum(z, 0), "tanh": np.tanh,
           "logistic": lambda z: 1 / (1 + np.exp(-z))}[activation]
    for i, (W, b) in enumerate(layers):
        X = X @ W + b
        if i < len(layers) - 1:
            X = act(X)
    return X


@pytest.mark.parametrize("activation", ["identity", "relu", "tanh", "logistic"])
def test_dense_model_computes_the_perceptron(activation):
    rng = np.random.default_rng(0)
    layers = [(rng.standard_normal((4, 6)), rng.standard_normal(6)),
              (rng.standard_normal((6, 3)), rng.standard_normal(3))]
    X = rng.standard_normal((9, 4)).astype(np.float32)
    out = ort.InferenceSession(dense_model(layers, activation).SerializeToString()).run(None, {"X": X})[0]
    np.testing.assert_allclose(out, _forward(layers, activation, X.astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_standardized_graph_equals_numpy_scaling_bit_for_bit():
    rng = np.random.default_rng(1)
    model = dense_model([(np.eye(3), np.zeros(3))])
    mean, scale = rng.standard_normal(3) * 100, rng.uniform(0.01, 1000, 3)
    X = (rng.standard_normal((50, 3)) * 1000).astype(np.float32)
    out = ort.InferenceSession(standardized(model, mean, scale).SerializeToString()).run(None, {"X": X})[0]
    s = RunningScaler(3)
    s.mean_, s.m2_, s.count = mean, scale ** 2, 1.0
    np.testing.assert_array_equal(out, s.transform(X))


# -- running statistics --------------------------------------------------------------------------------
def test_running_scaler_equals_two_pass_statistics_for_any_split_weights_and_offsets():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((1000, 4)) * [1e-3, 1, 1e3, 1e5] + [0, 5, -1e4, 1e6]
    w = rng.integers(0, 4, 1000).astype(np.float64)
    s = RunningScaler(4)
    cuts = np.sort(rng.choice(np.arange(1, 1000), 30, replace=False))
    for k, (part, wp) in enumerate(zip(np.split(X, cuts), np.split(w, cuts))):
        if k % 3 == 0:  # some parts row by row, unweighted rows repeated by their weight
            for row, weight in zip(part, wp):
                for _ in range(int(weight)):
                    s.update_row(row.tolist())
        elif k % 3 == 1:
            s.update(part, wp)
        else:
            for row, weight in zip(part, wp):
                s.update_steps(np.repeat(row[None], int(weight), axis=0))
    ref_mean = np.average(X, axis=0, weights=w)
    np.testing.assert_allclose(s.mean_, ref_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s.var_, np.average((X - ref_mean) ** 2, axis=0, weights=w), rtol=1e-10)
    assert s.count == w.sum() and isinstance(s.count, float)


@pytest.mark.parametrize("weighted", [True, False], ids=["fractional-count", "whole-count"])
def test_update_steps_gives_the_statistics_of_update_row_bit_for_bit(weighted):
    """Per row (the counts summed one by one from a fractional count, or counted from a whole one)."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((300, 5)) * [1e-2, 1, 10, 1e3, 0] + [0.5, -3, 40, 1e5, 7]
    a, b = RunningScaler(5), RunningScaler(5)
    a.update(X[:7], rng.uniform(0, 2, 7) if weighted else None)  # a fractional count first, or 7
    b.load_state_dict(a.state_dict())
    means, scales = a.update_steps(X[7:])
    for k, row in enumerate(X[7:].tolist()):
        b.update_row(row)
        mean, scale = b.float64()
        assert means[k].tolist() == mean and scales[k].tolist() == scale, k
    for key, value in a.state_dict().items():
        np.testing.assert_array_equal(value, b.state_dict()[key])
    assert scales[-1, 4] == 1.0  # the constant feature


def test_update_steps_of_one_feature_sum_a_short_last_step_in_order():
    """One feature, a last step of 30 rows: its sums are added in row order as update() adds them (numpy sums a
    lone column pairwise: that layout gave other bits for 4 of 5 such steps)."""
    rng = np.random.default_rng(3)
    for trial in range(20):
        X = rng.standard_normal((62, 1)) * 10 ** rng.uniform(-3, 5)
        a, b = RunningScaler(1), RunningScaler(1)
        means, scales = a.update_steps(X, 32)
        for start in (0, 32):
            b.update(X[start:start + 32])
        assert (means[-1].tolist(), scales[-1].tolist()) == b.float64(), trial
        assert a.state_dict()["s2"].tolist() == b.state_dict()["s2"].tolist(), trial


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("features", [1, 5])
@pytest.mark.parametrize("size", [3, 32])
def test_update_steps_of_several_rows_equal_update_per_step_bit_for_bit(size, features, dtype):
    """A step's rows summed, then added to the running sums: steps of ``size`` rows at once and one update() per
    step give the same bits (a short last step included, of one column too), however many blocks are summed at
    once, from float64 rows or float32 ones (what the ready-made estimators give), in Fortran order (the column
    selection below makes one: update() summed its rows pairwise then)."""
    rng = np.random.default_rng(9)
    X = (rng.standard_normal((10 * size + 2, 5)) * [1e-2, 1, 10, 1e3, 0] + [0.5, -3, 40, 1e5, 7])
    X = X[:, [3, 0, 1, 2, 4][:features]].astype(dtype)  # one feature: the widest
    a, b = RunningScaler(features), RunningScaler(features)
    for s in (a, b):
        s.update(X[:4], np.full(4, 0.5))  # a fractional count first
    means, scales = a.update_steps(X[4:], size)
    for k, start in enumerate(range(4, len(X), size)):
        b.update(X[start:start + size])
        mean, scale = b.float64()
        assert means[k].tolist() == mean and scales[k].tolist() == scale, k
    for key, value in a.state_dict().items():
        np.testing.assert_array_equal(value, b.state_dict()[key])


@pytest.mark.parametrize("size", [1, 3])
def test_scalers_updated_together_have_the_bits_of_each_updated_alone(size):
    """A regressor's input and target scalers, updated per step in one pass over their columns side by side
    (update_steps_together), give each scaler's own statistics, state and bound arrays, bit for bit; scalers that
    have counted different rows are updated one by one."""
    rng = np.random.default_rng(10)
    X = rng.standard_normal((61, 4)) * [1e-2, 1, 1e3, 0] + [0.5, -3, 1e5, 7]
    T = rng.standard_normal((61, 1)) * 30 + 200
    together, alone = (RunningScaler(4), RunningScaler(1)), (RunningScaler(4), RunningScaler(1))
    bound = [(np.zeros(w, np.float32), np.ones(w, np.float32)) for w in (4, 1)]
    for pair in (together, alone):
        pair[0].update(X[:5])
        pair[1].update(T[:5])
    for s, arrays in zip(together, bound):
        s.bind(*arrays)
    got = update_steps_together(together, [X[5:], T[5:]], size)
    for s, rows, (mean, scale), arrays in zip(alone, (X[5:], T[5:]), got, bound):
        ref_mean, ref_scale = s.update_steps(rows, size)
        assert mean.tobytes() == np.ascontiguousarray(ref_mean).tobytes()
        assert scale.tobytes() == np.ascontiguousarray(ref_scale).tobytes()
        np.testing.assert_array_equal(arrays[0], np.array(s.float64()[0], np.float32))
    for a, b in zip(together, alone):
        for key, value in a.state_dict().items():
            np.testing.assert_array_equal(value, b.state_dict()[key])
    fresh, ref = (RunningScaler(4), RunningScaler(1)), (RunningScaler(4), RunningScaler(1))  # shifts set by the first row
    for (mean, _), s, rows in zip(update_steps_together(fresh, [X, T], size), ref, (X, T)):
        assert mean.tobytes() == np.ascontiguousarray(s.update_steps(rows, size)[0]).tobytes()
    together[1].update(T[:2])  # counts differ now: one by one, each its own
    first, second = update_steps_together(together, [X[:6], T[:6]], size)
    alone[1].update(T[:2])
    assert first[0].tobytes() == alone[0].update_steps(X[:6], size)[0].tobytes()
    assert second[0].tobytes() == alone[1].update_steps(T[:6], size)[0].tobytes()


def test_a_scaler_snapshot_restores_every_kind_of_update_and_the_bound_arrays():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((40, 3)) * 5 + 2
    s = RunningScaler(3)
    mean32, scale32 = np.zeros(3, np.float32), np.ones(3, np.float32)
    s.bind(mean32, scale32)
    s.update(X[:5])
    before, bound = s.state_dict(), (mean32.copy(), scale32.copy())
    snap = s.snapshot()
    s.update(X[5:9], rng.uniform(0, 2, 4))
    s.update_steps(X[9:30], 4)
    s.update_row(X[30].tolist())
    assert not np.array_equal(mean32, bound[0])
    s.restore(snap)
    for key, value in before.items():
        np.testing.assert_array_equal(s.state_dict()[key], value)
    np.testing.assert_array_equal(mean32, bound[0])  # what the trainer's graph reads is put back too
    np.testing.assert_array_equal(scale32, bound[1])


def test_update_steps_refreshes_the_bound_arrays_with_the_bits_of_float64():
    X = np.random.default_rng(8).standard_normal((50, 4)) * 3 + 1
    s = RunningScaler(4)
    mean32, scale32 = np.zeros(4, np.float32), np.ones(4, np.float32)
    s.bind(mean32, scale32)
    s.update_steps(X, 3)
    mean, scale = s.float64()
    np.testing.assert_array_equal(mean32, np.array(mean, np.float32))
    np.testing.assert_array_equal(scale32, np.array(scale, np.float32))


def test_update_row_writes_the_bound_float32_arrays_as_numpy_casts_them_and_pickles_without_its_views():
    """update_row packs the float32 mean and scale into the bound arrays with ``struct`` (once per event): the
    bits of numpy's cast, subnormals included; a mean beyond float32's range becomes inf as numpy makes it."""
    import copy
    import pickle

    rng = np.random.default_rng(10)
    X = rng.standard_normal((200, 4)) * [1e-41, 1, 1e30, 3] + [0, 2, -1e30, 5]
    s = RunningScaler(4)
    mean32, scale32 = np.zeros(4, np.float32), np.ones(4, np.float32)
    s.bind(mean32, scale32)
    for row in X.tolist():
        s.update_row(row)
        mean, scale = s.float64()
        np.testing.assert_array_equal(mean32, np.array(mean, np.float32))
        np.testing.assert_array_equal(scale32, np.array(scale, np.float32))
    clone = pickle.loads(pickle.dumps(copy.deepcopy(s)))
    clone.update_row(X[1].tolist())  # its own arrays, written by views made again
    s.update_row(X[1].tolist())
    np.testing.assert_array_equal(clone.float32()[0], mean32)
    big = X[0].tolist()
    big[2] = 1e39  # beyond float32's largest (3.4e38): the float64 sums take it, the float32 scale is inf
    with np.errstate(over="ignore"):  # numpy's cast to inf warns (the fallback's and the reference's)
        for _ in range(40):
            s.update_row(big)
            mean, scale = s.float64()
            np.testing.assert_array_equal(scale32, np.array(scale, np.float32))
    assert np.isinf(scale32[2])


def test_an_older_scaler_state_of_mean_and_m2_still_loads():
    s = RunningScaler(2)
    s.load_state_dict({"count": np.array(4.0), "mean": np.array([1.0, 2.0]), "m2": np.array([4.0, 0.0])})
    np.testing.assert_array_equal(s.mean_, [1.0, 2.0])
    np.testing.assert_array_equal(s.scale_, [1.0, 1.0])  # sqrt(4 / 4); the second feature constant
    s.update_row([3.0, 2.0])
    np.testing.assert_allclose(s.mean_, [1.4, 2.0])
    np.testing.assert_allclose(s.var_, [(4.0 + 4 * 0.4 ** 2 + 1.6 ** 2) / 5, 0.0])


def test_scaler_state_is_plain_arrays_and_constant_features_keep_scale_one():
    s = RunningScaler(2)
    s.update(np.array([[1.0, 7.0], [3.0, 7.0], [5.0, 7.0]]))
    state = s.state_dict()
    assert {k: (v.dtype, v.shape) for k, v in state.items()} == {
        "count": (np.float64, ()), "shift": (np.float64, (2,)), "s1": (np.float64, (2,)), "s2": (np.float64, (2,)),
        "mean": (np.float64, (2,)), "m2": (np.float64, (2,))}
    np.testing.assert_array_equal(state["mean"], [3.0, 7.0])
    np.testing.assert_array_equal(state["m2"], [8.0, 0.0])
    twin = RunningScaler(2)
    twin.load_state_dict(state)
    np.testing.assert_array_equal(twin.scale_, [np.sqrt(8 / 3), 1.0])
    with pytest.raises(ValueError, match="scaler state has 2 features, expected 3"):
        RunningScaler(3).load_state_dict(state)


# -- standardization on a stream -----------------------------------------------------------------------
_SCALES = np.array([1e-2, 1e-1, 1.0, 1e1, 1e2])  # 1e4 between the smallest and the largest
_OFFSETS = np.array([0.05, -3.0, 1.0, 40.0, -700.0])


def _stream(n_batches=150, rows=64, seed=0):
    """Batches of features on wildly different scales; labels from a rule on the standardized features."""
    rng = np.random.default_rng(seed)
    coef = np.array([1.5, -2.0, 1.0, 2.5, -1.0])
    for _ in range(n_batches):
        Z = rng.standard_normal((rows, 5))
        y = (Z @ coef + 0.5 * rng.standard_normal(rows) > 0.3).astype(int)
        yield Z * _SCALES + _OFFSETS, Z, y


def _progressive_accuracy(est, use_raw, skip=20):
    """Predict each batch before training on it; accuracy over the batches after the first ``skip``."""
    hits = total = 0
    for i, (raw, Z, y) in enumerate(_stream()):
        X = raw if use_raw else Z
        if i >= skip:
            hits += int((est.predict(X) == y).sum())
            total += len(y)
        est.partial_fit(X, y, classes=[0, 1])
    return 100.0 * hits / total


@pytest.mark.parametrize("make", [lambda **kw: LogisticRegression(random_state=0, **kw),
                                  lambda **kw: MLPClassifier(hidden_layer_sizes=(16,), eta0=0.01, random_state=0,
                                                             **kw)],
                         ids=["logistic", "mlp"])
def test_standardize_trains_raw_features_as_well_as_prescaled_ones(make):
    prescaled = _progressive_accuracy(make(standardize=False), use_raw=False)
    standardized_raw = _progressive_accuracy(make(), use_raw=True)  # standardize=True is the default
    unscaled_raw = _progressive_accuracy(make(standardize=False), use_raw=True)
    assert standardized_raw >= prescaled - 1.0, (standardized_raw, prescaled)
    assert unscaled_raw < prescaled - 5.0, (unscaled_raw, prescaled)  # the test would notice no scaling


def test_exported_standardizing_model_gives_the_estimator_predictions():
    est = LogisticRegression(standardize=True, random_state=0)
    for raw, _, y in _stream(n_batches=20):
        est.partial_fit(raw, y, classes=[0, 1])
    raw = next(_stream(n_batches=1, seed=5))[0].astype(np.float32)
    sess = ort.InferenceSession(est.to_onnx().SerializeToString())
    scores = sess.run(None, {"X": raw})[0].ravel()
    # the same float32 arithmetic; onnxruntime's graph optimizations (MatMul+Add -> Gemm) may move the last bit
    np.testing.assert_allclose(scores, est.decision_function(raw), rtol=1e-6, atol=1e-6)
    assert np.array_equal(est.classes_[(scores > 0).astype(int)], est.predict(raw))
    reg = MLPRegressor(hidden_layer_sizes=(8,), standardize=True, random_state=0, max_iter=3).fit(raw, raw[:, 4])
    out = ort.InferenceSession(reg.to_onnx().SerializeToString()).run(None, {"X": raw})[0].ravel()
    np.testing.assert_allclose(out, reg.predict(raw), rtol=1e-6, atol=1e-6)


def test_statistics_are_updated_before_training_on_each_batch():
    est = LinearRegressor(standardize=True)
    X = np.array([[1.0, 100.0], [3.0, 300.0]])
    est.partial_fit(X, [0.0, 1.0])
    np.testing.assert_allclose(est.scaler_.mean_, [2.0, 200.0])
    seen = []
    step = est.trainer_.step
    host = est.trainer_.host_arrays  # the graph's first nodes scale X with these (the scaler writes them)
    est.trainer_.step = lambda Xb, *a, **kw: seen.append((Xb.copy(), host["sf_mean"].copy(),
                                                        host["sf_scale"].copy())) or step(Xb, *a, **kw)
    est.partial_fit(X + [2.0, 1.0], [0.0, 1.0])
    np.testing.assert_allclose(est.scaler_.mean_, [3.0, 200.5])
    np.testing.assert_allclose(est.scaler_.var_, [2.0, 10000.25])
    assert est.scaler_.count == 4.0
    # the batch was scaled with statistics that already include it
    Xb, mean, scale = seen[0]
    np.testing.assert_array_equal(Xb, X + [2.0, 1.0])
    np.testing.assert_array_equal(mean, est.scaler_.mean_.astype(np.float32))
    np.testing.assert_array_equal(scale, est.scaler_.scale_.astype(np.float32))


# -- state, pickling, parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: LinearRegressor(standardize=True, random_state=0),
                                  lambda: MLPRegressor(hidden_layer_sizes=(5, 3), standardize=True, random_state=0),
                                  lambda: LogisticRegression(optimizer="momentum", standardize=True),
                                  lambda: MLPClassifier(hidden_layer_sizes=(4,), activation="tanh", random_state=0)],
                         ids=["linear", "mlp-regressor", "logistic", "mlp-classifier"])
def test_state_dict_restores_a_fresh_estimator_exactly(make):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((200, 3)) * [1, 10, 100]
    y = (X[:, 0] + X[:, 1] / 10 > 0).astype(int) + (X[:, 2] > 50)
    est = make()
    is_clf = isinstance(est, (LogisticRegression, MLPClassifier))
    fit_kw = {"classes": [0, 1, 2]} if is_clf else {}
    y = y if is_clf else y.astype(float)
    est.partial_fit(X[:100], y[:100], **fit_kw)
    state = est.state_dict()
    twin = make()
    twin.load_state_dict(state)
    for e in (est, twin):  # both continue identically: weights, optimizer state, schedule, statistics
        e.partial_fit(X[100:], y[100:])
    np.testing.assert_array_equal(twin.predict(X), est.predict(X))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict(X), est.predict(X))
    assert ("scaler" in state) == est.standardize
    if est.standardize:
        np.testing.assert_array_equal(twin.scaler_.mean_, est.scaler_.mean_)
    if not is_clf:
        assert "target_scaler" in state
        np.testing.assert_array_equal(twin.target_scaler_.mean_, est.target_scaler_.mean_)


# -- target standardization (the regressors' default) ------------------------------------------------------
def _level_stream(n=400, seed=7):
    """Rows whose target sits far from 0 (as TrumpApproval's ~43): what target standardization is for."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3)) * [1.0, 5.0, 0.2] + [0.0, 100.0, -3.0]
    return X, 500.0 + 30.0 * (X[:, 0] - (X[:, 1] - 100.0) / 5.0) + rng.standard_normal(n)


@pytest.mark.parametrize("make", [lambda **kw: LinearRegressor(random_state=0, **kw),
                                  lambda **kw: MLPRegressor(hidden_layer_sizes=(8,), eta0=0.01, random_state=0, **kw)],
                         ids=["linear", "mlp"])
def test_standardized_targets_learn_a_far_level_at_the_default_rate(make):
    X, y = _level_stream()

    def progressive_mae(est):
        errors = [abs(est.partial_fit_predict(X[i:i + 1], y[i:i + 1])[0] - y[i]) for i in range(len(X))]
        return float(np.mean(errors[100:]))

    scaled, raw = progressive_mae(make()), progressive_mae(make(standardize_target=False))
    assert scaled < 10.0 and raw > 5 * scaled, (scaled, raw)  # without it the model is still climbing to 500


def test_progressive_predictions_never_see_their_own_targets():
    X, y = _level_stream(n=40)
    est = LinearRegressor(random_state=0, standardize=False).fit(X, y)  # (the feature statistics would move)
    before = est.predict(X[:5])
    shifted = est.partial_fit_predict(X[:5], y[:5] + 1e6)  # targets that would drag the level if they leaked
    np.testing.assert_allclose(shifted, before, rtol=1e-6)
    assert est.target_scaler_.mean_[0] > 1e5  # ... and they did move the statistics, for the next batches
    first = LinearRegressor().partial_fit_predict(X[:3], y[:3])
    np.testing.assert_array_equal(first, np.zeros(3))  # the first batch: predicted from no statistics


def test_exported_regressor_maps_its_outputs_back_and_coef_is_in_raw_units():
    X, y = _level_stream(n=200)
    Y = np.column_stack([y, -2.0 * y + 7.0])
    for target in (y, Y):
        reg = LinearRegressor(random_state=0, max_iter=3).fit(X, target)
        X32 = X.astype(np.float32)
        out = ort.InferenceSession(reg.to_onnx().SerializeToString()).run(None, {"X": X32})[0]
        np.testing.assert_allclose(out.reshape(reg.predict(X).shape), reg.predict(X), rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(X @ reg.coef_.T + reg.intercept_, reg.predict(X), rtol=1e-5, atol=1e-3)
    clf = LogisticRegression(random_state=0).fit(X, y > 500)
    np.testing.assert_allclose(X @ clf.coef_.T + clf.intercept_, clf.decision_function(X).reshape(-1, 1),
                               rtol=1e-5, atol=1e-4)


def test_state_of_another_architecture_is_refused():
    est = MLPRegressor(hidden_layer_sizes=(4,)).partial_fit(np.ones((4, 2)), np.ones(4))
    with pytest.raises(ValueError, match=r"hidden layers \(4,\), but this MLPRegressor has hidden_layer_sizes=\(8,\)"):
        MLPRegressor(hidden_layer_sizes=(8,)).load_state_dict(est.state_dict())


def test_partial_fit_needs_classes_first_and_random_state_fixes_initial_weights():
    X, y = np.random.default_rng(4).standard_normal((30, 3)), np.arange(30) % 3
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        MLPClassifier().partial_fit(X, y)
    a = MLPClassifier(hidden_layer_sizes=(7,), random_state=3).partial_fit(X, y, classes=[0, 1, 2])
    b = MLPClassifier(hidden_layer_sizes=(7,), random_state=3).partial_fit(X, y, classes=[0, 1, 2])
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    assert [c.shape for c in a.coefs_] == [(3, 7), (7, 3)] and a.intercepts_[1].shape == (3,)


def test_warm_start_continues_and_cold_fit_restarts():
    X = np.random.default_rng(5).standard_normal((64, 2))
    y = X @ [2.0, -1.0]
    cold = LinearRegressor(max_iter=2, random_state=0)
    first = cold.fit(X, y).coef_.copy()
    np.testing.assert_array_equal(cold.fit(X, y).coef_, first)
    warm = LinearRegressor(max_iter=2, random_state=0, warm_start=True)
    warm.fit(X, y)
    assert not np.array_equal(warm.fit(X, y).coef_, first)


def test_multioutput_regression_and_bad_inputs():
    X = np.random.default_rng(6).standard_normal((50, 3))
    Y = np.column_stack([X @ [1.0, 0, 0], X @ [0, 1.0, 0]])
    reg = LinearRegressor(eta0=0.1, max_iter=30).fit(X, Y)
    assert reg.predict(X).shape == (50, 2) and reg.coef_.shape == (2, 3) and reg.score(X, Y) > 0.95
    with pytest.raises(BadInputError, match="contains NaN or infinity"):
        reg.partial_fit(np.where(X > 2, np.nan, X), Y)
    with pytest.raises(TypeError, match="sparse input"):
        pytest.importorskip("scipy.sparse")
        import scipy.sparse

        reg.predict(scipy.sparse.csr_matrix(X))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        LogisticRegression().fit(X, X[:, 0])
