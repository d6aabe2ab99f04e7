"""from_sklearn: continue training a fitted scikit-learn model online, from its weights.

The graph is built directly from ``coef_``/``intercept_`` (linear models) or ``coefs_``/``intercepts_``
(perceptrons): the same ``MatMul`` + ``Add`` layers the ready-made estimators train, so the converted
estimator predicts what scikit-learn predicts (to float32 precision) and every weight is trainable.
(skl2onnx's graphs of these models end in label/probability post-processing, which is not trainable.)
The training settings follow the scikit-learn estimator's: SGD models keep their loss, penalty and
learning-rate schedule, continued from the step they reached (``t_``), with one row per step; MLPs keep
their solver (Adam or SGD with momentum) and its state.  scikit-learn is imported only when called.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np

from streamfit._engine.build import Names
from streamfit.models import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor
from streamfit.models._base import ReadyClassifier, ReadyMade

__all__ = ["from_sklearn", "SUPPORTED"]

#: The scikit-learn estimators :func:`from_sklearn` converts (also as the last step of a Pipeline after a
#: StandardScaler).
SUPPORTED = ("SGDRegressor", "SGDClassifier", "LinearRegression", "LogisticRegression", "MLPRegressor",
             "MLPClassifier")


def from_sklearn(estimator: Any, **params: Any) -> ReadyMade:
    """A fitted streamfit estimator that starts from ``estimator``'s weights and keeps training.

    ``estimator`` is a fitted ``SGDRegressor``, ``SGDClassifier``, ``LinearRegression``,
    ``LogisticRegression``, ``MLPRegressor`` or ``MLPClassifier``, or a ``Pipeline`` of a
    ``StandardScaler`` and one of them (the scaler's statistics become ``standardize=True`` running
    statistics).  ``params`` override the converted estimator's parameters (``eta0``, ``batch_size``,
    ``loss``...).  The result has ``warm_start=True``: ``fit`` continues too.

    >>> import numpy as np
    >>> from sklearn.linear_model import SGDRegressor
    >>> X = np.random.default_rng(0).standard_normal((200, 3)); y = X @ [1.0, 2.0, 3.0]
    >>> sk = SGDRegressor(max_iter=5, tol=None, random_state=0).fit(X, y)
    >>> reg = from_sklearn(sk)
    >>> type(reg).__name__, bool(np.allclose(reg.predict(X), sk.predict(X), rtol=1e-5, atol=1e-5))
    ('LinearRegressor', True)
    """
    try:
        from sklearn.utils.validation import check_is_fitted
    except ImportError:  # pragma: no cover - exercised only without the [sklearn] extra
        raise ImportError("from_sklearn needs scikit-learn: pip install 'streamfit[sklearn]'") from None
    scaler = None
    if type(estimator).__name__ == "Pipeline":
        scaler, estimator = _split_pipeline(estimator)
    converter = _converters().get(type(estimator).__name__)
    if converter is None or not type(estimator).__module__.startswith("sklearn."):
        raise TypeError(f"from_sklearn converts {', '.join(SUPPORTED)} (or a Pipeline of a StandardScaler and "
                        f"one of them); got {type(estimator).__name__}")
    check_is_fitted(estimator)
    out, layers, classes, state = converter(estimator)
    out.set_params(**params)
    if out.loss is None:
        raise ValueError(f"{type(estimator).__name__}(loss={estimator.loss!r}) has no streamfit equivalent; pass "
                         "loss=... (e.g. 'squared_error', 'huber' or 'absolute_error') to continue with another")
    out.set_params(warm_start=True, standardize=scaler is not None)
    if "standardize_target" in out.get_params():  # scikit-learn's weights give the targets themselves
        out.set_params(standardize_target=False)
    if isinstance(out, ReadyClassifier):
        out._initialize(layers, classes)
    else:
        out._initialize(layers)
    if scaler is not None:
        out.scaler_.load_state_dict(_scaler_state(scaler))
    _continue_state(out, state)
    return out


# -- pieces ------------------------------------------------------------------------------------------
Converted = tuple[ReadyMade, list, Any, dict]


def _converters() -> dict[str, Callable[[Any], Converted]]:
    return {"SGDRegressor": _sgd_regressor, "SGDClassifier": _sgd_classifier,
            "LinearRegression": _linear_regression, "LogisticRegression": _logistic_regression,
            "MLPRegressor": _mlp, "MLPClassifier": _mlp}


def _split_pipeline(pipe: Any) -> tuple[Any, Any]:
    steps = [step for _, step in pipe.steps if step not in (None, "passthrough")]
    if len(steps) != 2 or type(steps[0]).__name__ != "StandardScaler":
        raise TypeError("from_sklearn converts a Pipeline only as (StandardScaler, model); got steps "
                        f"{[type(s).__name__ for s in steps]}")
    scaler = steps[0]
    if not (scaler.with_mean and scaler.with_std):
        raise ValueError("from_sklearn needs StandardScaler(with_mean=True, with_std=True) in a Pipeline")
    return scaler, steps[1]


def _scaler_state(scaler: Any) -> dict[str, np.ndarray]:
    count = float(np.max(scaler.n_samples_seen_))
    return {"count": np.array(count), "mean": np.asarray(scaler.mean_, np.float64),
            "m2": np.asarray(scaler.var_, np.float64) * count}


def _linear_layers(coef: Any, intercept: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    coef = np.atleast_2d(np.asarray(coef, np.float64))  # (outputs, features)
    intercept = np.broadcast_to(np.asarray(intercept, np.float64), (coef.shape[0],))
    return [(coef.T.astype(np.float32), intercept.astype(np.float32))]


def _sgd_schedule(sk: Any) -> Any:
    """The schedule name; "optimal" as an instance (its start then equals scikit-learn's for every loss)."""
    if sk.learning_rate != "optimal":
        return sk.learning_rate
    from streamfit.schedules import Optimal

    # scikit-learn starts at typw / max(1, dloss(-typw, 1)); every SGD loss has dloss < 1 there, as has
    # the squared loss Optimal assumes without loss_dloss, so the rates are the same.
    return Optimal(alpha=sk.alpha)


def _sgd_params(sk: Any) -> dict[str, Any]:
    """SGD settings, one row per step as scikit-learn's SGD does."""
    return {"optimizer": "sgd", "learning_rate": _sgd_schedule(sk), "eta0": sk.eta0, "power_t": sk.power_t,
            "alpha": sk.alpha, "l1_ratio": sk.l1_ratio, "penalty": sk.penalty, "batch_size": 1,
            "shuffle": sk.shuffle, "random_state": sk.random_state}


def _sgd_regressor(sk: Any) -> Converted:
    from streamfit.losses import Huber

    losses: dict[str, Any] = {"squared_error": "squared_error", "huber": Huber(delta=sk.epsilon)}
    if sk.epsilon == 0:
        losses["epsilon_insensitive"] = "absolute_error"
    out = LinearRegressor(loss=losses.get(sk.loss), **_sgd_params(sk))
    return out, _linear_layers(sk.coef_, sk.intercept_), None, {"schedule_t": int(sk.t_) - 1}


def _sgd_classifier(sk: Any) -> Converted:
    if sk.loss != "log_loss":
        warnings.warn(f"streamfit has no {sk.loss!r} loss: the converted SGDClassifier predicts as it did but "
                      "continues training with the log loss", UserWarning, stacklevel=3)
    out = LogisticRegression(**_sgd_params(sk))
    return out, _linear_layers(sk.coef_, sk.intercept_), sk.classes_, {"schedule_t": int(sk.t_) - 1}


def _linear_regression(sk: Any) -> Converted:
    return LinearRegressor(), _linear_layers(sk.coef_, sk.intercept_), None, {}


def _logistic_regression(sk: Any) -> Converted:
    if len(sk.classes_) > 2 and sk.coef_.shape[0] == len(sk.classes_) and _is_ovr(sk):
        warnings.warn("the LogisticRegression is one-vs-rest: streamfit's is multinomial (same decision "
                      "function, other probabilities)", UserWarning, stacklevel=3)
    return (LogisticRegression(random_state=sk.random_state), _linear_layers(sk.coef_, sk.intercept_),
            sk.classes_, {})


def _is_ovr(sk: Any) -> bool:
    return getattr(sk, "multi_class", "auto") == "ovr" or sk.solver == "liblinear"


def _mlp(sk: Any) -> Converted:
    is_clf = type(sk).__name__ == "MLPClassifier"
    if getattr(sk, "loss", "squared_error") not in ("squared_error", "log_loss"):
        raise ValueError(f"{type(sk).__name__}(loss={sk.loss!r}) is not supported: its output activation "
                         f"{sk.out_activation_!r} has no streamfit equivalent")
    if is_clf and sk.out_activation_ == "logistic" and sk.n_outputs_ > 1:
        raise ValueError("multilabel MLPClassifier models are not supported (streamfit classifiers predict one "
                         "label per row)")
    batch = sk.batch_size if isinstance(sk.batch_size, (int, np.integer)) else 200
    params: dict[str, Any] = {"hidden_layer_sizes": tuple(int(c.shape[1]) for c in sk.coefs_[:-1]),
                              "activation": sk.activation, "eta0": sk.learning_rate_init, "power_t": sk.power_t,
                              "alpha": sk.alpha / batch,  # scikit-learn divides its L2 term by the batch rows
                              "penalty": "l2", "batch_size": int(batch), "shuffle": sk.shuffle,
                              "random_state": sk.random_state, "momentum": sk.momentum}
    state: dict[str, Any] = {}
    opt = getattr(sk, "_optimizer", None)
    if sk.solver == "adam":
        from streamfit.optim import Adam

        params.update(optimizer=Adam(sk.beta_1, sk.beta_2, sk.epsilon), learning_rate="constant")
        if opt is not None:
            state = {"n_steps": int(opt.t), "slots": {"exp_avg": opt.ms, "exp_avg_sq": opt.vs}}
    elif sk.solver == "sgd":
        optimizer = "sgd" if sk.momentum == 0 else "nesterov" if sk.nesterovs_momentum else "momentum"
        schedule = {"invscaling": "invscaling"}.get(sk.learning_rate, "constant")
        params.update(optimizer=optimizer, learning_rate=schedule)
        if opt is not None:
            if sk.learning_rate == "adaptive":  # continue at the rate it had reduced to
                params["eta0"] = float(opt.learning_rate)
            state = {"schedule_t": int(sk.t_) if schedule == "invscaling" else 0}
            if optimizer != "sgd":
                state["slots"] = {"velocity": opt.velocities}
    out = MLPClassifier(**params) if is_clf else MLPRegressor(**params)
    layers = [(np.asarray(c, np.float32), np.asarray(b, np.float32)) for c, b in zip(sk.coefs_, sk.intercepts_)]
    return out, layers, sk.classes_ if is_clf else None, state


def _continue_state(out: ReadyMade, extra: dict[str, Any]) -> None:
    """Install the schedule position and optimizer state scikit-learn reached."""
    if not extra:
        return
    trainer = out.trainer_  # type: ignore[attr-defined]
    state = trainer.state_dict()
    if "schedule_t" in extra and "t" in state["schedule"]:
        state["schedule"] = dict(state["schedule"], t=max(int(extra["schedule_t"]), 0))
    if "n_steps" in extra:
        state["n_steps"] = int(extra["n_steps"])
    n_layers = len(out._layers())
    for slot, arrays in extra.get("slots", {}).items():
        arrays = list(arrays)  # scikit-learn's order: every coef, then every intercept
        for i in range(n_layers):
            for name, value in ((f"coef_{i}", arrays[i]), (f"intercept_{i}", arrays[n_layers + i])):
                key = Names.slot(name, slot)
                if key in state["optimizer"]:
                    state["optimizer"][key] = np.asarray(value, trainer.dtype).reshape(
                        state["optimizer"][key].shape)
    trainer.load_state_dict(state)
    out.t_ = trainer.n_steps  # type: ignore[attr-defined]
