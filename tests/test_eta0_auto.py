"""eta0="auto": each optimizer of the ready-made models starts from its own rate, and that rate works.

The quality checks are against references: River's SGD on Phishing (the same progressive accuracy) and the former
default 0.01 on hashed string columns (FTRL at 0.01 was 12 % worse than Vowpal Wabbit; ``bench/perrow.py``
measures VW itself).
"""

from __future__ import annotations

import numpy as np
import pytest

from streamfit import (FMClassifier, LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor, OnnxRegressor)
from streamfit.optim import FTRL, Nesterov
from streamfit.testing import ClickStream

rng = np.random.default_rng(0)
X = rng.standard_normal((64, 3)).astype(np.float32)
Y_CLS = (X[:, 0] > 0).astype(int)
Y_REG = X @ np.array([1.0, -2.0, 0.5], np.float32)


def _rate(est, regression: bool) -> float:
    est.partial_fit(X, Y_REG if regression else Y_CLS, **({} if regression else {"classes": [0, 1]}))
    return float(est.trainer_.schedule.lr)


@pytest.mark.parametrize("make,regression,rate", [
    (lambda: LinearRegressor(), True, 0.01),  # Adam, the default, at the default batch_size=32
    (lambda: LinearRegressor(batch_size=1), True, 0.005),  # Adam one row a step: 0.005 * sqrt(batch_size)
    (lambda: LogisticRegression(batch_size=2), False, 0.005 * 2 ** 0.5),
    (lambda: LogisticRegression(batch_size=4, optimizer="adamw"), False, 0.01),  # at most 0.01
    (lambda: LinearRegressor(optimizer="sgd"), True, 0.01),
    (lambda: LogisticRegression(optimizer="ftrl"), False, 0.1),
    (lambda: LogisticRegression(optimizer="adagrad"), False, 0.1),
    (lambda: LogisticRegression(optimizer="rowwise_adagrad"), False, 0.1),
    (lambda: LogisticRegression(optimizer="momentum"), False, 0.001),
    (lambda: LogisticRegression(optimizer=Nesterov(momentum=0.5)), False, 0.005),
    (lambda: LogisticRegression(optimizer=FTRL(beta=0.5)), False, 0.1),
    (lambda: MLPRegressor(hidden_layer_sizes=(4,), random_state=0), True, 0.001),
    (lambda: MLPClassifier(hidden_layer_sizes=(4,), optimizer="adamw", random_state=0), False, 0.001),
    (lambda: MLPClassifier(hidden_layer_sizes=(4,), optimizer="sgd", random_state=0), False, 0.01),
    (lambda: LogisticRegression(optimizer="sgd", eta0=0.3), False, 0.3),  # a number is used as given
], ids=["linear-adam", "linear-adam-b1", "logistic-adam-b2", "logistic-adamw-b4", "linear-sgd", "ftrl", "adagrad", "rowwise", "momentum", "nesterov-0.5", "ftrl-instance",
        "mlp-adam", "mlp-adamw", "mlp-sgd", "given"])
def test_the_rate_each_optimizer_starts_from(make, regression, rate):
    est = make()
    assert _rate(est, regression) == pytest.approx(rate, rel=1e-12)


def test_params_and_clone_keep_auto():
    from sklearn.base import clone

    for est in (LinearRegressor(), LogisticRegression(optimizer="ftrl"), MLPClassifier(), MLPRegressor(),
                FMClassifier(["c"])):
        assert est.get_params()["eta0"] == "auto", est
        assert clone(est).get_params()["eta0"] == "auto"
    fitted = LogisticRegression(optimizer="ftrl")
    fitted.partial_fit(X, Y_CLS, classes=[0, 1])
    assert clone(fitted).get_params()["eta0"] == "auto" and fitted.trainer_.schedule.lr == 0.1


def test_factorization_machines_and_the_general_estimators():
    stream = ClickStream(seed=0, n_categorical=2, n_dense=0, cardinalities=(10, 20))
    batch = stream.batch(0, 64)
    for optimizer, rate in (("adagrad", 0.05), ("ftrl", 0.1)):
        fm = FMClassifier(stream.categorical, buckets=256, n_factors=2, optimizer=optimizer, random_state=0)
        fm.partial_fit(batch, batch.column("label").to_numpy(), classes=[0, 1])
        assert fm.trainer_.schedule.lr == rate, optimizer
    from streamfit.testing import linear_model

    assert OnnxRegressor(linear_model(3)).get_params()["eta0"] == 0.01  # unchanged: scikit-learn's SGD default
    reg = OnnxRegressor(linear_model(3), optimizer="adagrad", learning_rate="constant", eta0="auto")
    reg.partial_fit(X, Y_REG)
    assert reg.trainer_.schedule.lr == 0.1


def test_auto_with_the_other_schedules_and_passive_aggressive():
    inv = LinearRegressor(optimizer="ftrl", learning_rate="invscaling", power_t=0.5)
    inv.partial_fit(X, Y_REG)
    assert inv.trainer_.schedule.eta0 == 0.1
    pa = [LinearRegressor(optimizer="sgd", learning_rate="pa1", loss="epsilon_insensitive", eta0=e, random_state=0)
          for e in ("auto", 1.0)]
    for est in pa:
        est.partial_fit(X, Y_REG)
    np.testing.assert_array_equal(pa[0].predict(X), pa[1].predict(X))  # "auto" is scikit-learn's C = 1


def test_a_string_other_than_auto_is_refused():
    with pytest.raises(ValueError, match="eta0 must be a positive number or 'auto', got 'fast'"):
        LinearRegressor(eta0="fast").partial_fit(X, Y_REG)


def test_sgd_auto_is_rivers_sgd_on_phishing():
    """optimizer="sgd" with the default rate: River's StandardScaler | LogisticRegression (SGD at 0.01) accuracy."""
    datasets = pytest.importorskip("river.datasets")
    from river import linear_model, preprocessing

    data = list(datasets.Phishing())
    keys = list(data[0][0])
    Xp = np.array([[x[k] for k in keys] for x, _ in data], np.float32)
    yp = np.array([label for _, label in data])
    river = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    hits = 0
    for x, label in data:
        hits += river.predict_one(x) == label
        river.learn_one(x, label)
    clf = LogisticRegression(optimizer="sgd", batch_size=1, penalty=None)
    proba = [clf.partial_fit_predict(Xp[i:i + 1], yp[i:i + 1], classes=[False, True])[0, 1] for i in range(len(Xp))]
    ours = float(np.mean((np.array(proba) > 0.5) == yp))
    assert abs(ours - hits / len(data)) <= 0.005, (ours, hits / len(data))


def test_ftrl_auto_on_hashed_string_columns_beats_the_former_default():
    """FTRL at 0.01 (the former default for every optimizer) was 12 % worse than VW's log loss; "auto" is 0.1."""
    stream = ClickStream(seed=0, n_categorical=16, n_dense=0, strings=True)
    table = stream.table(40_000)
    y = table.column("label").to_numpy().astype(np.float64)
    features = table.drop_columns(["label"])

    def progressive(eta0):
        est = LogisticRegression(categorical=stream.categorical, optimizer="ftrl", eta0=eta0, batch_size=1024,
                                 buckets=1 << 18)
        p = np.concatenate([est.partial_fit_predict(features.slice(i, 1024), y[i:i + 1024], classes=[0, 1])[:, 1]
                            for i in range(0, len(y), 1024)])
        p = np.clip(p, 1e-7, 1 - 1e-7)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    auto, former = progressive("auto"), progressive(0.01)
    assert auto < 0.95 * former, (auto, former)
