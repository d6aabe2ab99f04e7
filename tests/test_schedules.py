"""Learning-rate schedules against independent references: scikit-learn, closed forms, crafted losses."""

from __future__ import annotations

import json
import math
import warnings
from typing import Callable

import numpy as np
import pytest

from streamfit.schedules import (
    Adaptive,
    Constant,
    CosineDecay,
    InvScaling,
    LinearWarmup,
    Optimal,
    Schedule,
    as_schedule,
    schedule_from_state_dict,
)

sklearn_lm = pytest.importorskip("sklearn.linear_model")
sgd_fast = pytest.importorskip("sklearn.linear_model._sgd_fast")


# -- helpers ------------------------------------------------------------------------------------

def _data(noise: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(200, 3))
    return X, X @ np.array([1.5, -2.0, 0.5]) + 0.3 + rng.normal(scale=noise, size=200)


def _sgd_epoch(X: np.ndarray, y: np.ndarray, schedule: Schedule, w: np.ndarray, b: float,
               dloss: Callable[[float, float], float] = lambda p, y: p - y) -> tuple[np.ndarray, float]:
    """One epoch of scikit-learn's plain SGD at batch size 1, no penalty, rate from ``schedule``."""
    for xi, yi in zip(X, y):
        lr = schedule.lr
        g = min(max(dloss(float(xi @ w + b), float(yi)), -1e12), 1e12)  # sklearn clips dloss at 1e12
        w = w - lr * g * xi
        b = b - lr * g
        schedule.step()
    return w, b


def _sklearn(est_cls: type, **params: object) -> object:
    return est_cls(penalty=None, shuffle=False, fit_intercept=True, **params)


def _lrs(schedule: Schedule, losses: list[float | None]) -> list[float]:
    out = []
    for loss in losses:
        out.append(schedule.lr)
        schedule.step(loss)
    return out


# -- scikit-learn: invscaling and optimal -------------------------------------------------------

@pytest.mark.parametrize("eta0, power_t", [(0.01, 0.25), (0.05, 0.5), (0.02, 1.0)])
def test_invscaling_reproduces_sgdregressor(eta0: float, power_t: float) -> None:
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter=1
        est = _sklearn(sklearn_lm.SGDRegressor, learning_rate="invscaling", eta0=eta0, power_t=power_t,
                       max_iter=1, tol=None).fit(X, y)
    s = InvScaling(eta0, power_t)
    w, b = _sgd_epoch(X, y, s, np.zeros(3), 0.0)
    np.testing.assert_allclose(w, est.coef_, rtol=0, atol=1e-9)
    assert b == pytest.approx(est.intercept_[0], abs=1e-9)
    assert est.t_ == s.t + 1  # sklearn's counter starts at 1.0, ours at 0


@pytest.mark.parametrize("alpha", [0.1, 1.0, 10.0])
def test_optimal_reproduces_sgdregressor(alpha: float) -> None:
    X, y = _data()
    X = 0.3 * X  # keep squared-loss SGD stable at the large 'optimal' first rates
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = _sklearn(sklearn_lm.SGDRegressor, learning_rate="optimal", alpha=alpha, max_iter=1,
                       tol=None).fit(X, y)
    s = Optimal(alpha)
    w, b = _sgd_epoch(X, y, s, np.zeros(3), 0.0)
    np.testing.assert_allclose(w, est.coef_, rtol=0, atol=1e-9)
    assert b == pytest.approx(est.intercept_[0], abs=1e-9)
    assert est.t_ == s.t + 1


@pytest.mark.parametrize("learning_rate", ["invscaling", "optimal"])
def test_partial_fit_continues_the_count_like_sklearn(learning_rate: str) -> None:
    """Two partial_fit calls = one uninterrupted run: sklearn keeps t_ across calls, as our t."""
    X, y = _data()
    X = 0.3 * X
    est = _sklearn(sklearn_lm.SGDRegressor, learning_rate=learning_rate, eta0=0.05, power_t=0.5, alpha=1.0)
    est.partial_fit(X[:120], y[:120])
    est.partial_fit(X[120:], y[120:])
    s = as_schedule(learning_rate, **({"eta0": 0.05, "power_t": 0.5} if learning_rate == "invscaling"
                                      else {"alpha": 1.0}))
    w, b = _sgd_epoch(X, y, s, np.zeros(3), 0.0)
    np.testing.assert_allclose(w, est.coef_, rtol=0, atol=1e-9)
    assert est.t_ == s.t + 1 == 201


@pytest.mark.parametrize("alpha", [1e-4, 1e-2])
def test_optimal_with_sklearn_hinge_dloss_reproduces_sgdclassifier(alpha: float) -> None:
    X, y = _data()
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0, 1.0, -1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = _sklearn(sklearn_lm.SGDClassifier, loss="hinge", learning_rate="optimal", alpha=alpha,
                       max_iter=1, tol=None).fit(X, y)
    hinge = sgd_fast.Hinge(1.0)
    w, b = _sgd_epoch(X, y, Optimal(alpha, hinge.py_dloss), np.zeros(3), 0.0, dloss=hinge.py_dloss)
    np.testing.assert_allclose(w, est.coef_[0], rtol=0, atol=1e-9)
    assert b == pytest.approx(est.intercept_[0], abs=1e-9)


def test_rates_equal_sklearn_formulas_bit_for_bit() -> None:
    """_sgd_fast.pyx.tp: eta = eta0 / pow(t, power_t) and 1 / (alpha * (optimal_init + t - 1)), t = 1.0, 2.0, ..."""
    inv, alpha = InvScaling(0.03, 0.37), 3e-4
    typw = np.sqrt(1.0 / np.sqrt(alpha))
    initial_eta0 = typw / max(1.0, sgd_fast.Hinge(1.0).py_dloss(-typw, 1.0))
    optimal_init = 1.0 / (initial_eta0 * alpha)
    opt = Optimal(alpha, sgd_fast.Hinge(1.0).py_dloss)
    assert opt.optimal_init == optimal_init
    t_sk = 1.0
    for _ in range(1000):
        assert inv.lr == 0.03 / math.pow(t_sk, 0.37)
        assert opt.lr == 1.0 / (alpha * (optimal_init + t_sk - 1))
        inv.step()
        opt.step()
        t_sk += 1
    assert opt.t == inv.t == 1000


def test_optimal_initial_rate_divides_by_a_large_dloss() -> None:
    alpha = 0.04
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    s = Optimal(alpha, loss_dloss=lambda p, y: 4.0 * (y - p))  # dloss(-typw, 1) = 4 (1 + typw) > 1
    assert s.lr == pytest.approx(typw / (4.0 * (1.0 + typw)), rel=1e-15)
    assert Optimal(alpha).lr == pytest.approx(typw, rel=1e-15)  # squared loss: max(1, -typw - 1) = 1


# -- scikit-learn: adaptive (per epoch there, per step here) ------------------------------------

def _adaptive_epochs(X: np.ndarray, y: np.ndarray, schedule: Adaptive, epochs: int) -> np.ndarray:
    """sklearn's epoch loop at batch size 1, one schedule step per epoch with the epoch's mean loss."""
    w, b = np.zeros(X.shape[1]), 0.0
    for _ in range(epochs):
        lr, total = schedule.lr, 0.0
        for xi, yi in zip(X, y):
            p = float(xi @ w + b)
            total += 0.5 * (p - yi) ** 2  # HalfSquaredError, summed before the update as in _plain_sgd
            w, b = w - lr * (p - yi) * xi, b - lr * (p - yi)
        schedule.step(total / len(y))
    return w


@pytest.mark.parametrize("n_iter_no_change, epochs", [(3, 20), (2, 12)])
def test_adaptive_reproduces_sgdregressor_with_an_epoch_as_a_step(n_iter_no_change: int, epochs: int) -> None:
    X, y = _data(noise=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: stopped at max_iter on purpose
        est = _sklearn(sklearn_lm.SGDRegressor, learning_rate="adaptive", eta0=0.05, tol=1e-3,
                       n_iter_no_change=n_iter_no_change, max_iter=epochs).fit(X, y)
    assert est.n_iter_ == epochs  # sklearn did not stop early, so every epoch is comparable
    s = Adaptive(0.05, tol=1e-3, n_iter_no_change=n_iter_no_change)
    np.testing.assert_allclose(_adaptive_epochs(X, y, s, epochs), est.coef_, rtol=0, atol=1e-9)
    assert s.lr < 0.05 / 5  # the rate was lowered at least twice
    # control: one bad step more before lowering gives visibly different weights
    other = _adaptive_epochs(X, y, Adaptive(0.05, tol=1e-3, n_iter_no_change=n_iter_no_change + 1), epochs)
    assert np.abs(other - est.coef_).max() > 1e-4


# -- Adaptive on crafted losses -----------------------------------------------------------------

def test_adaptive_crafted_losses() -> None:
    s = Adaptive(eta0=1.0, tol=0.5, n_iter_no_change=2, factor=4.0)
    # best, then "bad" (loss > best - tol) counter after each loss:
    # 10 (first: good) 10,0 | 9 (<= 9.5) 9,0 | 9.25 9,1 | 8.5 (= 9 - tol: not bad) 8.5,0 |
    # 8.25 (better, but by < tol: bad; best still moves) 8.25,1 | 7.9 (> 7.75) 7.9,2 -> lr / 4, counter 0 |
    # 8.0 7.9,1 | 7.0 7,0 | 7.0 7,1 | 7.0 7,2 -> lr / 4
    losses = [10.0, 9.0, 9.25, 8.5, 8.25, 7.9, 8.0, 7.0, 7.0, 7.0]
    assert _lrs(s, losses) == [1.0] * 6 + [0.25] * 4
    assert s.state_dict() == {"name": "adaptive", "t": 10, "eta0": 1.0, "tol": 0.5, "n_iter_no_change": 2,
                              "factor": 4.0, "min_lr": 1e-6, "lr": 0.0625, "best_loss": 7.0,
                              "no_improvement_count": 0}


def test_adaptive_counter_resets_and_stops_at_min_lr() -> None:
    s = Adaptive(eta0=1.0, tol=0.0, n_iter_no_change=1, factor=10.0, min_lr=0.05)
    # every step after the first is bad: 1 -> 0.1 -> 0.01 (0.1 > min_lr), then 0.01 <= min_lr: no more
    assert _lrs(s, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == pytest.approx([1.0, 1.0, 0.1, 0.01, 0.01, 0.01])
    s = Adaptive(eta0=1.0, tol=0.0, n_iter_no_change=3, factor=2.0)
    # bad, bad, good (resets the counter), bad, bad, bad -> lowered once, after the 7th step;
    # with tol=0 an equal loss is progress (sklearn's strict "loss > best - tol")
    assert _lrs(s, [5.0, 6.0, 6.0, 4.0, 4.5, 5.0, 6.0, 9.0]) == [1.0] * 7 + [0.5]
    assert _lrs(Adaptive(1.0, tol=0.0, n_iter_no_change=1), [3.0] * 5) == [1.0] * 5


def test_adaptive_needs_a_finite_loss_and_changes_nothing_on_error() -> None:
    s = Adaptive(0.1)
    s.step(np.float32(1.5))  # numpy scalars are fine
    before = s.state_dict()
    with pytest.raises(TypeError, match="needs the batch loss"):
        s.step()
    with pytest.raises(ValueError, match="loss must be finite, got nan"):
        s.step(float("nan"))
    with pytest.raises(TypeError, match="loss must be a real number or None"):
        s.step("1.0")  # type: ignore[arg-type]
    assert s.state_dict() == before


# -- warm-up and cosine: closed forms -----------------------------------------------------------

@pytest.mark.parametrize("start_factor", [0.0, 0.1, 1.0])
def test_linear_warmup_closed_form(start_factor: float) -> None:
    s = LinearWarmup(0.2, warmup_steps=5, start_factor=start_factor)
    expected = [0.2 * (start_factor + (1 - start_factor) * t / 5) for t in range(5)] + [0.2] * 4
    assert _lrs(s, [None] * 9) == pytest.approx(expected, rel=1e-15, abs=0)
    assert _lrs(LinearWarmup(0.2, warmup_steps=0), [None] * 3) == [0.2] * 3


def test_linear_warmup_hands_over_to_an_unstepped_schedule() -> None:
    cos = CosineDecay(1.0, decay_steps=10)
    s = LinearWarmup(cos, warmup_steps=4, start_factor=0.5)
    lrs = _lrs(s, [None] * 20)
    assert lrs[:4] == pytest.approx([0.5, 0.625, 0.75, 0.875])
    assert lrs[4:] == [0.5 * (1 + math.cos(math.pi * min(k, 10) / 10)) for k in range(16)]
    assert cos.t == 16 and s.t == 20


def test_linear_warmup_passes_losses_only_after_the_ramp() -> None:
    ada = Adaptive(1.0, tol=0.0, n_iter_no_change=1, factor=2.0)
    s = LinearWarmup(ada, warmup_steps=3)
    for _ in range(3):
        s.step()  # no loss needed while warming up; Adaptive untouched
    assert ada.t == 0 and ada.state_dict()["best_loss"] is None and s.lr == 1.0
    s.step(1.0)
    s.step(2.0)
    assert ada.t == 2 and s.lr == 0.5
    with pytest.raises(TypeError, match="needs the batch loss"):
        s.step()
    assert s.t == 5


def test_cosine_decay_closed_form() -> None:
    s = CosineDecay(eta0=0.3, decay_steps=7, eta_min=0.01)
    expected = [0.01 + 0.5 * 0.29 * (1 + math.cos(math.pi * t / 7)) for t in range(8)] + [0.01] * 5
    assert _lrs(s, [None] * 13) == pytest.approx(expected, rel=1e-15)
    assert s.lr == 0.01
    assert CosineDecay(1.0, 4).lr == 1.0
    assert _lrs(CosineDecay(1.0, 2), [None] * 3) == pytest.approx([1.0, 0.5, 0.0], abs=1e-16)


def test_constant_and_invscaling_closed_forms() -> None:
    assert _lrs(Constant(0.5), [None, 1.0, None]) == [0.5] * 3
    assert _lrs(InvScaling(0.1, 0.5), [None] * 4) == [0.1 / math.sqrt(k) for k in (1, 2, 3, 4)]


# -- state_dict: round trips and errors ---------------------------------------------------------

FACTORIES: dict[str, Callable[[], Schedule]] = {
    "constant": lambda: Constant(0.1),
    "invscaling": lambda: InvScaling(0.1, power_t=0.3),
    "optimal": lambda: Optimal(1e-3, loss_dloss=lambda p, y: 3.0),
    "adaptive": lambda: Adaptive(0.1, tol=0.05, n_iter_no_change=2, factor=3.0, min_lr=1e-3),
    "cosine_decay": lambda: CosineDecay(0.1, decay_steps=15, eta_min=0.001),
    "linear_warmup": lambda: LinearWarmup(Adaptive(0.1, tol=0.05, n_iter_no_change=2), warmup_steps=6,
                                          start_factor=0.2),
    "nested_warmup": lambda: LinearWarmup(LinearWarmup(CosineDecay(0.1, 9), 3), 2),
}
LOSSES = [float(v) for v in np.abs(np.sin(np.arange(40) * 0.7)) + np.linspace(2, 1, 40)]


@pytest.mark.parametrize("kind", FACTORIES)
@pytest.mark.parametrize("via", ["load_state_dict", "schedule_from_state_dict"])
def test_state_round_trip_continues_bit_identically(kind: str, via: str) -> None:
    reference = _lrs(FACTORIES[kind](), LOSSES)
    first = FACTORIES[kind]()
    head = _lrs(first, LOSSES[:17])
    state = json.loads(json.dumps(first.state_dict(), allow_nan=False))  # strict JSON survives
    if via == "load_state_dict":
        resumed = FACTORIES[kind]()
        resumed.load_state_dict(state)
    else:
        resumed = schedule_from_state_dict(state)
        assert type(resumed) is type(first) and repr(resumed) == repr(first)
    assert resumed.t == 17 and resumed.state_dict() == first.state_dict()
    assert head + _lrs(resumed, LOSSES[17:]) == reference
    assert _lrs(first, LOSSES[17:]) == reference[17:]


@pytest.mark.parametrize("kind", FACTORIES)
def test_state_dict_is_plain_and_named(kind: str) -> None:
    state = FACTORIES[kind]().state_dict()
    assert state["name"] == FACTORIES[kind]().name and state["t"] == 0

    def plain(v: object) -> bool:
        if isinstance(v, dict):
            return all(isinstance(k, str) and plain(x) for k, x in v.items())
        return v is None or type(v) in (int, float, str)

    assert plain(state)


def test_load_state_dict_says_what_differs_and_changes_nothing() -> None:
    s = InvScaling(0.2, power_t=0.5)
    s.step()
    with pytest.raises(ValueError, match=r"eta0: state has 0.1, this schedule has 0.2; "
                                         r"power_t: state has 0.25, this schedule has 0.5"):
        s.load_state_dict(InvScaling(0.1).state_dict())
    assert s.t == 1
    w = LinearWarmup(CosineDecay(0.1, 10), warmup_steps=3)
    w.step()
    other = LinearWarmup(CosineDecay(0.1, 20), warmup_steps=3).state_dict()
    with pytest.raises(ValueError, match=r"in 'after'.*decay_steps: state has 20, this schedule has 10"):
        w.load_state_dict(other)
    assert w.t == 1
    with pytest.raises(ValueError, match=r"optimal_init: state has"):
        Optimal(0.01).load_state_dict(Optimal(0.01, loss_dloss=lambda p, y: 5.0).state_dict())


@pytest.mark.parametrize("state, error, match", [
    ({"name": "constant", "t": 0, "eta0": 0.1}, ValueError, "state is for schedule 'constant', this schedule is 'invscaling'"),
    ({"name": "invscaling", "t": 0, "eta0": 0.1, "power_t": 0.25, "gamma": 2}, ValueError, r"unknown key\(s\) \['gamma'\]"),
    ({"name": "invscaling", "t": 0}, ValueError, r"lacks required key\(s\) \['eta0'\]"),
    ({"name": "invscaling", "eta0": 0.1}, ValueError, "lacks required key 't'"),
    ({"name": "invscaling", "t": -1, "eta0": 0.1}, ValueError, "t must be >= 0, got -1"),
    ({"name": "invscaling", "t": 1.5, "eta0": 0.1}, TypeError, "t must be an int, got 1.5"),
    ({"name": "invscaling", "t": 0, "eta0": "0.1"}, TypeError, "eta0 must be a real number, got '0.1'"),
    ([("name", "invscaling")], TypeError, "must be a mapping, got list"),
])
def test_bad_states_raise(state: object, error: type, match: str) -> None:
    s = InvScaling(0.1)
    with pytest.raises(error, match=match):
        s.load_state_dict(state)  # type: ignore[arg-type]
    assert s.t == 0


def test_missing_optional_keys_take_defaults() -> None:
    s = InvScaling(0.1)
    s.load_state_dict({"name": "invscaling", "t": 3, "eta0": 0.1})
    assert s.t == 3 and s.lr == 0.1 / 4 ** 0.25
    a = Adaptive(0.1)
    a.load_state_dict({"name": "adaptive", "t": 5, "eta0": 0.1})  # an older state: hyper + t only
    assert a.state_dict() == Adaptive(0.1).state_dict() | {"t": 5}
    with pytest.raises(ValueError, match="min_lr: state has 1e-06, this schedule has 0.001"):
        Adaptive(0.1, min_lr=1e-3).load_state_dict({"name": "adaptive", "t": 0, "eta0": 0.1})
    with pytest.raises(ValueError, match=r"lacks required key\(s\) \['after'\]"):
        LinearWarmup(0.1, 2).load_state_dict({"name": "linear_warmup", "t": 0, "warmup_steps": 2})


def test_schedule_from_state_dict_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown schedule name 'step' in state; expected one of \['adaptive', "):
        schedule_from_state_dict({"name": "step", "t": 0})
    with pytest.raises(TypeError, match="must be a mapping"):
        schedule_from_state_dict("constant")  # type: ignore[arg-type]


# -- arguments ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, match", [
    (lambda: Constant(-1.0), ValueError, r"^eta0 must be > 0, got -1.0$"),
    (lambda: Constant(0), ValueError, r"^eta0 must be > 0, got 0.0$"),
    (lambda: Constant(float("inf")), ValueError, r"^eta0 must be finite, got inf$"),
    (lambda: Constant(float("nan")), ValueError, r"^eta0 must be finite, got nan$"),
    (lambda: Constant("0.1"), TypeError, r"^eta0 must be a real number, got '0.1'$"),
    (lambda: Constant(True), TypeError, r"^eta0 must be a real number, got True$"),
    (lambda: InvScaling(0.1, power_t=-0.5), ValueError, r"^power_t must be >= 0, got -0.5$"),
    (lambda: Optimal(0.0), ValueError, r"^alpha must be > 0, got 0.0$"),
    (lambda: Optimal(1e-4, loss_dloss="squared"), TypeError, r"loss_dloss must be a callable"),
    (lambda: Optimal(1e-4, loss_dloss=lambda p, y: float("nan")), ValueError, r"loss_dloss\(-typw, 1.0\) must be finite"),
    (lambda: Adaptive(0.1, tol=-1e-3), ValueError, r"^tol must be >= 0, got -0.001$"),
    (lambda: Adaptive(0.1, n_iter_no_change=0), ValueError, r"^n_iter_no_change must be >= 1, got 0$"),
    (lambda: Adaptive(0.1, n_iter_no_change=2.0), TypeError, r"^n_iter_no_change must be an int, got 2.0$"),
    (lambda: Adaptive(0.1, factor=1.0), ValueError, r"^factor must be > 1, got 1.0$"),
    (lambda: Adaptive(0.1, min_lr=-1.0), ValueError, r"^min_lr must be >= 0, got -1.0$"),
    (lambda: CosineDecay(0.1, decay_steps=0), ValueError, r"^decay_steps must be >= 1, got 0$"),
    (lambda: CosineDecay(0.1, decay_steps=10, eta_min=0.2), ValueError, r"^eta_min must be <= 0.1, got 0.2$"),
    (lambda: LinearWarmup("constant", 3), TypeError, r"^after must be a Schedule or a float, got 'constant'$"),
    (lambda: LinearWarmup(0.1, -1), ValueError, r"^warmup_steps must be >= 0, got -1$"),
    (lambda: LinearWarmup(0.1, 3, start_factor=1.5), ValueError, r"^start_factor must be <= 1, got 1.5$"),
])
def test_bad_arguments_raise_with_the_value(make: Callable[[], object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_abstract_schedule_and_minimal_subclass() -> None:
    with pytest.raises(TypeError):
        Schedule()  # type: ignore[abstract]

    class Halving(Schedule):
        name = "halving"
        _params = ("eta0",)

        def __init__(self, eta0: float) -> None:
            self.eta0 = eta0

        def _lr(self, t: int) -> float:
            return self.eta0 / 2 ** t

    s = Halving(1.0)
    assert _lrs(s, [None] * 3) == [1.0, 0.5, 0.25] and s.t == 3
    r = Halving(1.0)
    r.load_state_dict(s.state_dict())
    assert r.t == 3 and r.lr == 0.125 and repr(r) == "Halving(eta0=1.0)"


# -- as_schedule --------------------------------------------------------------------------------

def test_as_schedule() -> None:
    c = Constant(0.1)
    assert as_schedule(c) is c
    assert repr(as_schedule(0.05)) == "Constant(eta0=0.05)"
    assert repr(as_schedule(np.float32(0.5))) == "Constant(eta0=0.5)"
    assert repr(as_schedule(1)) == "Constant(eta0=1.0)"
    assert repr(as_schedule("constant", eta0=0.01)) == "Constant(eta0=0.01)"
    assert repr(as_schedule("invscaling", eta0=0.01, power_t=0.5)) == "InvScaling(eta0=0.01, power_t=0.5)"
    assert as_schedule("optimal", alpha=1e-4).optimal_init == Optimal(1e-4).optimal_init
    assert repr(as_schedule("adaptive", eta0=0.01, n_iter_no_change=3)) == \
        "Adaptive(eta0=0.01, tol=0.001, n_iter_no_change=3, factor=5.0, min_lr=1e-06)"
    assert repr(as_schedule("cosine_decay", eta0=0.1, decay_steps=5)) == \
        "CosineDecay(eta0=0.1, decay_steps=5, eta_min=0.0)"
    assert repr(as_schedule("linear_warmup", after=0.1, warmup_steps=5)) == \
        "LinearWarmup(after=Constant(eta0=0.1), warmup_steps=5, start_factor=0.0)"


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("cosine",), {}, ValueError, r"unknown learning-rate schedule 'cosine'; expected one of "
                                  r"\['adaptive', 'constant', 'cosine_decay', 'invscaling', 'linear_warmup', 'optimal'\]"),
    (("constant",), {"eta0": 0.1, "power_t": 0.5}, TypeError, r"'constant' got unexpected keyword argument\(s\) \['power_t'\]"),
    (("invscaling",), {}, TypeError, r"'invscaling' needs keyword argument\(s\) \['eta0'\]"),
    ((0.1,), {"eta0": 0.2}, TypeError, r"keyword arguments \['eta0'\] apply only to a schedule name"),
    ((True,), {}, TypeError, "expected a Schedule, a float or a schedule name, got True"),
    ((None,), {}, TypeError, "expected a Schedule, a float or a schedule name, got None"),
    (("constant",), {"eta0": -1.0}, ValueError, "eta0 must be > 0, got -1.0"),
])
def test_as_schedule_errors(args: tuple, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        as_schedule(*args, **kwargs)
