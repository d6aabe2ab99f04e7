"""from_sklearn: continue training a fitted scikit-learn model online, from its weights.

The graph is built directly from ``coef_``/``intercept_`` (linear models) or ``coefs_``/``intercepts_``
(perceptrons): the same ``MatMul`` + ``Add`` layers the ready-made estimators train, so the converted
estimator predicts what scikit-learn predicts (to float32 precision) and every weight is trainable.
(skl2onnx's graphs of these models end in label/probability post-processing; ``OnnxClassifier`` trains
them too, through their probabilities, see ``streamfit/_engine/prepare/sklearn_ops.py``.)
The training settings follow the scikit-learn estimator's: SGD models (and Perceptron, the
passive-aggressive models) keep their loss, penalty and learning-rate schedule, continued from the step
they reached (``t_``), with one row per step, so they take scikit-learn's ``partial_fit`` steps; MLPs keep
their solver (Adam or SGD with momentum) and its state.  Batch solvers (Ridge, Lasso, ElasticNet, LinearSVC,
LinearSVR, LinearRegression, LogisticRegression) keep their loss and penalty and continue with the
ready-made models' default optimizer.  scikit-learn is imported only when called.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from streamfit._engine.common.names import Names
from streamfit._public import reexport
from streamfit.models import LinearRegressor, LogisticRegression, MLPClassifier, MLPRegressor
from streamfit.models._base import ReadyClassifier, ReadyMade
from streamfit.models.scaler import FixedScaler

__all__ = ["from_sklearn", "SUPPORTED", "SCALERS"]

#: The scikit-learn estimators :func:`from_sklearn` converts (also as the last step of a Pipeline).
SUPPORTED = ("SGDRegressor", "SGDClassifier", "Perceptron", "PassiveAggressiveRegressor",
             "PassiveAggressiveClassifier", "LinearRegression", "Ridge", "Lasso", "ElasticNet", "LinearSVR",
             "LinearSVC", "LogisticRegression", "MLPRegressor", "MLPClassifier")
#: The preprocessing steps a converted Pipeline may hold before the model (any number, in any order).
SCALERS = ("StandardScaler", "MinMaxScaler", "MaxAbsScaler")


def from_sklearn(estimator: Any, **params: Any) -> ReadyMade:
    """A fitted streamfit estimator that starts from ``estimator``'s weights and keeps training.

    ``estimator`` is one of :data:`SUPPORTED`, fitted, or a ``Pipeline`` of :data:`SCALERS` steps and one of
    them.  A lone ``StandardScaler`` becomes ``standardize=True`` running statistics (they go on
    updating); other scaler steps are composed into one frozen affine scaling, exported with the model.
    ``params`` override the converted estimator's parameters (``eta0``, ``batch_size``, ``loss``,
    ``alpha``...).  The result has ``warm_start=True``: ``fit`` continues too.

    Ridge and LinearSVR/LinearSVC define their penalty over the whole training set (``alpha`` or ``C``
    against the sum of the losses), whose size the fitted model does not store: the converted model uses
    the default ``alpha`` unless you pass ``alpha=`` (Ridge's ``alpha / n_samples``, or ``1 / (C * n_samples)``).

    Parameters
    ----------
    estimator
        A fitted scikit-learn estimator of :data:`SUPPORTED` (its weights and classes are taken over; the SGD
        and passive-aggressive models also keep their loss, penalty and schedule, continued from ``t_``), or
        a ``Pipeline`` of :data:`SCALERS` steps ending in one.
    **params
        Parameters of the streamfit estimator made, overriding the converted ones (``eta0=0.001``,
        ``batch_size=1``, ``alpha=``...).

    Examples
    --------
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
    scalers: list[Any] = []
    if type(estimator).__name__ == "Pipeline":
        scalers, estimator = _split_pipeline(estimator)
    converter = _converters().get(type(estimator).__name__)
    if converter is None or not type(estimator).__module__.startswith("sklearn."):
        raise TypeError(f"from_sklearn converts {', '.join(SUPPORTED)} (or a Pipeline of {', '.join(SCALERS)} "
                        f"steps and one of them); got {type(estimator).__name__}")
    check_is_fitted(estimator)
    for scaler in scalers:
        check_is_fitted(scaler)
    if getattr(estimator, "average", False):
        raise ValueError(f"{type(estimator).__name__}(average={estimator.average!r}) predicts with averaged "
                         "weights, which streamfit does not keep; refit it with average=False")
    out: Any  # a ReadyMade estimator (its scikit-learn API comes with the concrete class)
    out, layers, classes, state = converter(estimator)
    running = len(scalers) == 1 and _is_full_standard_scaler(scalers[0])
    out.set_params(warm_start=True, standardize=bool(scalers))
    if "standardize_target" in out.get_params():  # scikit-learn's weights give the targets themselves
        out.set_params(standardize_target=False)
    out.set_params(**params)
    if out.loss is None:
        raise ValueError(f"{type(estimator).__name__}(loss={estimator.loss!r}) has no streamfit equivalent; pass "
                         "loss=... (e.g. 'squared_error', 'huber' or 'absolute_error') to continue with another")
    if isinstance(out, ReadyClassifier):
        out._initialize(layers, classes)
    else:
        out._initialize(layers)
    if running:
        out.scaler_.load_state_dict(_scaler_state(scalers[0]))
    elif scalers:
        out.scaler_ = FixedScaler(*_affine(scalers, int(np.shape(layers[0][0])[0])))
        out._bind_scaler()
    _continue_state(out, state)
    return out


# -- pieces ------------------------------------------------------------------------------------------
Converted = tuple[ReadyMade, list, Any, dict]


def _converters() -> dict[str, Callable[[Any], Converted]]:
    return {"SGDRegressor": _sgd_regressor, "SGDClassifier": _sgd_classifier, "Perceptron": _sgd_classifier,
            "PassiveAggressiveRegressor": _sgd_regressor, "PassiveAggressiveClassifier": _sgd_classifier,
            "LinearRegression": _least_squares, "Ridge": _least_squares, "Lasso": _least_squares,
            "ElasticNet": _least_squares, "LinearSVR": _linear_svr, "LinearSVC": _linear_svc,
            "LogisticRegression": _logistic_regression, "MLPRegressor": _mlp, "MLPClassifier": _mlp}


def _split_pipeline(pipe: Any) -> tuple[list[Any], Any]:
    steps = [step for _, step in pipe.steps if step not in (None, "passthrough")]
    if not steps or not all(type(s).__name__ in SCALERS for s in steps[:-1]):
        raise TypeError(f"from_sklearn converts a Pipeline of {', '.join(SCALERS)} steps and a model; got steps "
                        f"{[type(s).__name__ for s in steps]}")
    for scaler in steps[:-1]:
        if getattr(scaler, "clip", False):
            raise ValueError("MinMaxScaler(clip=True) is not an affine scaling: from_sklearn cannot convert it")
    return steps[:-1], steps[-1]


def _is_full_standard_scaler(scaler: Any) -> bool:
    return type(scaler).__name__ == "StandardScaler" and scaler.with_mean and scaler.with_std


def _scaler_state(scaler: Any) -> dict[str, np.ndarray]:
    count = float(np.max(scaler.n_samples_seen_))
    return {"count": np.array(count), "mean": np.asarray(scaler.mean_, np.float64),
            "m2": np.asarray(scaler.var_, np.float64) * count}


def _affine(scalers: list[Any], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The scalers' composition as one ``(X - mean) / scale``."""
    mean, scale = np.zeros(n), np.ones(n)
    for s in scalers:
        kind = type(s).__name__
        if kind == "StandardScaler":
            m = s.mean_ if s.with_mean else np.zeros(n)
            d = s.scale_ if s.with_std else np.ones(n)
        elif kind == "MinMaxScaler":  # X * scale_ + min_
            m, d = -s.min_ / s.scale_, 1.0 / s.scale_
        else:  # MaxAbsScaler: X / scale_
            m, d = np.zeros(n), s.scale_
        # ((X - mean) / scale - m) / d == (X - (mean + m * scale)) / (scale * d)
        mean, scale = mean + np.asarray(m, np.float64) * scale, scale * np.asarray(d, np.float64)
    return mean, scale


def _linear_layers(coef: Any, intercept: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    coef = np.atleast_2d(np.asarray(coef, np.float64))  # (outputs, features)
    intercept = np.broadcast_to(np.asarray(intercept, np.float64), (coef.shape[0],))
    return [(coef.T.astype(np.float32), intercept.astype(np.float32))]


def _sgd_schedule(sk: Any) -> Any:
    """The schedule name; "optimal" as an instance (its start then equals scikit-learn's for every loss)."""
    rate = _learning_rate(sk)
    if rate != "optimal":
        return rate
    from streamfit.schedules import Optimal

    # scikit-learn starts at typw / max(1, dloss(-typw, 1)); every SGD loss has dloss <= 1 there, as has
    # the squared loss Optimal assumes without loss_dloss, so the rates are the same.
    return Optimal(alpha=sk.alpha)


def _learning_rate(sk: Any) -> str:
    """scikit-learn's schedule: Perceptron's is a constant eta0, the passive-aggressive models' "pa1"/"pa2"."""
    name = type(sk).__name__
    if name.startswith("PassiveAggressive"):
        return "pa2" if sk.loss.startswith("squared_") else "pa1"
    return "constant" if name == "Perceptron" else sk.learning_rate


def _sgd_params(sk: Any) -> dict[str, Any]:
    """SGD settings, one row per step as scikit-learn's SGD does."""
    passive = type(sk).__name__.startswith("PassiveAggressive")
    return {"optimizer": "sgd", "learning_rate": _sgd_schedule(sk), "eta0": sk.C if passive else sk.eta0,
            "power_t": getattr(sk, "power_t", 0.5), "alpha": getattr(sk, "alpha", 1e-4),
            "l1_ratio": getattr(sk, "l1_ratio", 0.15), "penalty": None if passive else sk.penalty,
            "batch_size": 1, "shuffle": sk.shuffle, "random_state": sk.random_state}


def _sgd_regressor(sk: Any) -> Converted:
    from streamfit.losses import EpsilonInsensitive, Huber, SquaredEpsilonInsensitive

    eps = getattr(sk, "epsilon", 0.1)
    losses: dict[str, Any] = {"squared_error": "squared_error", "huber": Huber(delta=eps),
                              "epsilon_insensitive": EpsilonInsensitive(eps),
                              "squared_epsilon_insensitive": SquaredEpsilonInsensitive(eps)}
    if type(sk).__name__.startswith("PassiveAggressive"):  # PA-II changes the step, not the loss
        losses["squared_epsilon_insensitive"] = EpsilonInsensitive(eps)
    out = LinearRegressor(loss=losses.get(sk.loss), **_sgd_params(sk))
    return out, _linear_layers(sk.coef_, sk.intercept_), None, {"schedule_t": int(sk.t_) - 1}


def _sgd_classifier(sk: Any) -> Converted:
    from streamfit.losses import Hinge, ModifiedHuber, SquaredHinge

    name = type(sk).__name__
    loss = "perceptron" if name == "Perceptron" else sk.loss
    losses: dict[str, Any] = {"log_loss": "log_loss", "hinge": Hinge(), "squared_hinge": SquaredHinge(),
                              "modified_huber": ModifiedHuber(), "perceptron": Hinge(threshold=0.0)}
    if name.startswith("PassiveAggressive"):  # PA-II changes the step, not the loss
        losses["squared_hinge"] = Hinge()
    if loss not in losses:
        raise ValueError(f"{name}(loss={loss!r}) has no streamfit equivalent")
    # one-vs-rest, as scikit-learn's SGD: every class column trains as its own binary problem
    out = LogisticRegression(loss=losses[loss], **_sgd_params(sk))
    return out, _linear_layers(sk.coef_, sk.intercept_), sk.classes_, {"schedule_t": int(sk.t_) - 1}


def _least_squares(sk: Any) -> Converted:
    """LinearRegression, Ridge, Lasso, ElasticNet: squared error with their penalty (see from_sklearn)."""
    name = type(sk).__name__
    params: dict[str, Any] = {"penalty": None}
    if name == "Ridge":
        params = {"penalty": "l2"}
    elif name in ("Lasso", "ElasticNet"):
        # they minimize (1 / 2n) |y - Xw|^2 + alpha * penalty: SGD's per-row alpha and l1_ratio exactly
        params = {"penalty": "l1" if name == "Lasso" else "elasticnet", "alpha": sk.alpha,
                  "l1_ratio": 1.0 if name == "Lasso" else sk.l1_ratio}
    return LinearRegressor(**params), _linear_layers(sk.coef_, sk.intercept_), None, {}


def _linear_svr(sk: Any) -> Converted:
    from streamfit.losses import EpsilonInsensitive, SquaredEpsilonInsensitive

    loss = {"epsilon_insensitive": EpsilonInsensitive, "squared_epsilon_insensitive": SquaredEpsilonInsensitive}
    return (LinearRegressor(loss=loss[sk.loss](sk.epsilon), penalty="l2"), _linear_layers(sk.coef_, sk.intercept_),
            None, {})


def _linear_svc(sk: Any) -> Converted:
    from streamfit.losses import Hinge, SquaredHinge

    if sk.multi_class != "ovr":
        raise ValueError(f"LinearSVC(multi_class={sk.multi_class!r}) is not supported (one-vs-rest only)")
    loss = {"hinge": Hinge, "squared_hinge": SquaredHinge}[sk.loss]()
    return (LogisticRegression(loss=loss, penalty=sk.penalty, random_state=sk.random_state),
            _linear_layers(sk.coef_, sk.intercept_), sk.classes_, {})


def _logistic_regression(sk: Any) -> Converted:
    # a one-vs-rest model (liblinear, multi_class="ovr") trains and predicts one logistic column per class
    loss = "log_loss" if len(sk.classes_) > 2 and _is_ovr(sk) else "auto"
    return (LogisticRegression(loss=loss, random_state=sk.random_state), _linear_layers(sk.coef_, sk.intercept_),
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


reexport("streamfit", globals(), ["from_sklearn"])  # streamfit.from_sklearn
