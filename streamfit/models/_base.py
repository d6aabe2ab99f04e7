"""What the ready-made estimators share: a dense graph built from the data, input checks, standardization.

They are :class:`~streamfit.OnnxRegressor` / :class:`~streamfit.OnnxClassifier` whose ONNX model is not a
parameter: the first ``fit``/``partial_fit`` builds it from ``n_features_in_`` and the number of outputs
(``classes_``), with initial weights from ``random_state``.  ``standardize=True`` keeps running feature
statistics (:class:`~streamfit.models.scaler.RunningScaler`), merged from every batch before training on
it; training and prediction scale on the host, and :meth:`to_onnx` prepends the same ``Sub``/``Div`` to
the exported graph, so the exported model scales its own inputs.  The regressors' ``standardize_target=True``
does the same for the targets (running mean and variance per output, trained on standardized targets,
predictions mapped back; :meth:`to_onnx` appends the ``Mul``/``Add``): the model then starts at the level of
the target instead of climbing to it from zero, which is what makes a default learning rate work whatever
the units of ``y``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from onnx import ModelProto

from streamfit._engine.prepare.model import load_model
from streamfit.estimators.classifier import OnnxClassifier
from streamfit.estimators.regressor import OnnxRegressor
from streamfit.losses import Loss
from streamfit.models._graphs import (INPUT, SCALER_MEAN, SCALER_SCALE, dense_model, destandardized, layer_names,
                                      layers_of, scaler_tensors, standardized)
from streamfit.estimators._cache import caches
from streamfit.models._rows import DenseRow, LabelTarget, ScaledTarget, keep_row_path, row_path
from streamfit.models._validation import check_features, check_labels, check_sample_weight, check_targets
from streamfit.models.scaler import RunningScaler, scaler_from_state
from streamfit.schedules import Schedule, as_schedule

__all__ = ["ReadyMade", "ReadyRegressor", "ReadyClassifier", "random_generator"]

Layers = Sequence[tuple[np.ndarray, np.ndarray]]
#: learning_rate values that select the passive-aggressive step (eta0 is then C), as in scikit-learn >= 1.8
_PASSIVE_AGGRESSIVE = ("pa1", "pa2")


def random_generator(random_state: Any) -> "np.random.RandomState | np.random.Generator":
    """scikit-learn's ``random_state`` convention: None (global state), an int seed, or a generator."""
    if random_state is None:
        return np.random.mtrand._rand
    if isinstance(random_state, (np.random.RandomState, np.random.Generator)):
        return random_state
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return np.random.RandomState(int(random_state))
    raise ValueError(f"random_state must be None, an int, a RandomState or a Generator, got {random_state!r}")


class _Inputs:
    """``inputs`` of a ready-made model as the column plan reads it: always ``{model input: spec}`` (see
    :meth:`ReadyMade._inputs_mapping`); what was assigned is kept as given, for ``get_params``."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return obj._inputs_mapping()

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["_inputs_param"] = value


class ReadyMade:
    """Mixin (first base) of the ready-made estimators; subclasses say which layers to start from."""

    standardize: bool
    learning_rate: Any
    #: RunningScaler (trained on the stream) or FixedScaler (from scikit-learn); None without standardization
    scaler_: Any
    target_scaler_: Any
    alpha: float
    inputs = _Inputs()

    # -- inputs=: a mapping, or the shorthand for the one input "X" ----------------------------------------
    def _inputs_mapping(self) -> Mapping[str, Any] | None:
        """``inputs=`` as a mapping: the model has one input, ``"X"``, so anything but a mapping (a column, a
        list of columns, an encoder) is what feeds it; one mapping object while the parameter stays the same
        object (the column plan is cached on it)."""
        given = self.__dict__.get("_inputs_param")
        if given is None or isinstance(given, Mapping):
            return given
        # keyed by the object given (the mapping holds it, so its id is not reused while cached)
        return caches(self).keyed("shorthand", id(given), lambda: {INPUT: given})  # type: ignore[no-any-return]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = super().get_params(deep)  # type: ignore[misc]
        if "inputs" in params:  # the parameter as given, not the mapping made of it
            params["inputs"] = self.__dict__.get("_inputs_param")
        return params

    def _row_reader(self) -> Any:
        """The reader of this model's one-row path (models/_rows.py): a dense float row."""
        return DenseRow

    # -- what a model writes -------------------------------------------------------------------------
    def _hidden_sizes(self) -> tuple[int, ...]:
        """Widths of the hidden layers (none: a linear model)."""
        return ()

    def _activation(self) -> str:
        return "identity"

    def _initial_layers(self, n_in: int, n_out: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(coef, intercept)`` pairs to start from (zeros here: a linear model)."""
        return [(np.zeros((n_in, n_out), np.float32), np.zeros(n_out, np.float32))]

    # -- shared -------------------------------------------------------------------------------------
    def _schedule(self, loss: Loss) -> Schedule:
        if self.learning_rate in _PASSIVE_AGGRESSIVE:  # the step size is each row's weight, the rate 1
            return as_schedule(1.0)
        # "optimal" sizes its first rate from the slope of a one-output loss at one point; softmax has
        # none, and every built-in loss is below 1 there, as the squared loss (loss_dloss=None) is.
        if self.learning_rate == "optimal" and loss.integer_labels:
            return as_schedule("optimal", alpha=self.alpha)
        return super()._schedule(loss)  # type: ignore[misc]

    def _graph(self, layers: Layers) -> ModelProto:
        hidden = tuple(int(np.shape(c)[1]) for c, _ in layers[:-1])
        if hidden != self._hidden_sizes():
            raise ValueError(f"the weights have hidden layers {hidden}, but this {type(self).__name__} has "
                             f"hidden_layer_sizes={self._hidden_sizes()}")
        n_in = int(np.shape(layers[0][0])[0])
        self.n_features_in_ = n_in
        self.scaler_ = RunningScaler(n_in) if self.standardize else None
        model = dense_model(layers, self._activation())
        if not self.standardize:
            return model
        # the scaling is the graph's first two nodes, its mean and scale host tensors the scaler writes: every
        # step and prediction reads them, and the trainer's model is the exported one
        return standardized(model, np.zeros(n_in), np.ones(n_in))

    def _make_trainer(self, loss: Any, model: Any = None, weights: Any = None, host: tuple[str, ...] = ()) -> Any:
        proto = load_model(model) if model is not None and not host else None
        if proto is not None and scaler_tensors(proto):
            host = scaler_tensors(proto)
            weights = weights if weights is not None else layer_names(proto)
            model = proto
        trainer = super()._make_trainer(loss, model, weights, host)  # type: ignore[misc]
        self._bind_scaler(trainer)
        return trainer

    def _bind_scaler(self, trainer: Any = None) -> None:
        """Let the scaler write its float32 mean and scale into the trainer's host tensors (kept current
        by every update); without a scaler, the graph's scaling is the identity."""
        trainer = trainer if trainer is not None else self.__dict__.get("trainer_")
        arrays = trainer.host_arrays if trainer is not None else {}
        if SCALER_MEAN not in arrays:
            return
        scaler = self.__dict__.get("scaler_")
        if scaler is None:
            arrays[SCALER_MEAN][...] = 0.0
            arrays[SCALER_SCALE][...] = 1.0
        else:
            scaler.bind(arrays[SCALER_MEAN], arrays[SCALER_SCALE])

    def _scaler_in_graph(self) -> bool:
        """Whether the trainer's graph scales its inputs (a model pickled before it did scales on the host)."""
        return SCALER_MEAN in self.trainer_.prepared.host  # type: ignore[attr-defined]

    def _layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The current ``(coef, intercept)`` of every layer (host copies)."""
        self._require_fitted()  # type: ignore[attr-defined]
        return layers_of(self.trainer_.get_weights())  # type: ignore[attr-defined]

    # -- the one validation of X and sample weights (scikit-learn's rules), at the public methods ----------
    def _check_X(self, X: Any, reset: bool, learn: bool = True) -> np.ndarray:
        if type(X) is not np.ndarray and getattr(self, "inputs", None) is not None:
            X = self._feature_matrix(X, learn)
        X = check_features(X)  # a finite float32 (rows, features) array
        self._check_width(X.shape[1], reset)  # type: ignore[attr-defined]
        return X

    def _sample_weight(self, sample_weight: Any, n: int, all_zero_ok: bool = True) -> np.ndarray | None:
        return check_sample_weight(sample_weight, n, all_zero_ok=all_zero_ok)

    # -- inputs=: the one feature input from columns (the column plan of OnnxRegressor's inputs=) ----------
    def _declared_inputs(self) -> tuple[Any, ...]:
        """The model's one input ``X`` as declared (its width unknown until the first batch fixes it)."""
        from streamfit._engine.prepare.model import ModelInput

        width = self.__dict__.get("n_features_in_") if hasattr(self, "trainer_") else None
        return (ModelInput(INPUT, np.dtype(np.float32), ("N", width if width is not None else "n_features")),)

    def _feature_matrix(self, X: Any, learn: bool = True) -> Any:
        """``X`` (an Arrow table, a dict of columns, or ``{"X": matrix}`` from the stream) as the feature matrix
        ``inputs={"X": columns or an encoder}`` describes; other ``X`` as given."""
        import pyarrow as pa

        from streamfit._columns.memory import holds_inputs
        from streamfit._engine.prepare.input_signature import NamedRows

        if type(X) is NamedRows:
            X = X.arrays
        if isinstance(X, Mapping) and holds_inputs(X, (INPUT,)):  # the plan decides: the matrix, or columns
            return X[INPUT]
        if isinstance(X, (pa.Table, pa.RecordBatch, Mapping)):
            from streamfit.features._estimator import arrow_inputs

            return arrow_inputs(self, X, learn=learn)[INPUT]
        return X

    def _linear_in_raw_units(self) -> tuple[np.ndarray, np.ndarray]:
        """A linear model's ``(coef (features, outputs), intercept)`` with the scalers folded in: what it
        computes from raw features, in target units (``predict(X) == X @ coef + intercept``)."""
        (W, b), = self._layers()
        W, b = W.astype(np.float64), b.astype(np.float64)
        scaler = getattr(self, "scaler_", None)
        if scaler is not None:
            W = W / scaler.scale_[:, None]
            b = b - scaler.mean_ @ W
        target = getattr(self, "target_scaler_", None)
        if target is not None:
            W, b = W * target.scale_, b * target.scale_ + target.mean_
        return W, b

    def _one_pass(self, X: np.ndarray, T: np.ndarray, sw: np.ndarray | None,
                  outputs: np.ndarray | None = None) -> float:
        if self.learning_rate not in _PASSIVE_AGGRESSIVE:
            return super()._one_pass(X, T, sw, outputs)  # type: ignore[misc]
        return self._passive_aggressive_pass(X, T, sw, outputs)

    def _partial_pass(self, X: Any, T: np.ndarray, sw: np.ndarray | None, first: bool,
                      outputs: np.ndarray | None = None) -> float:
        """Many steps in one call: the input (and target) statistics updated per step, the steps in one session
        run (:mod:`streamfit.models._chunks`); a regressor's outputs come back in target units."""
        if len(X) <= self.batch_size or self.learning_rate in _PASSIVE_AGGRESSIVE:  # type: ignore[attr-defined]
            target = self.__dict__.get("target_scaler_")
            before = (target.mean_.copy(), target.scale_.copy()) if target is not None and outputs is not None else None
            loss = super()._partial_pass(X, T, sw, first, outputs)  # type: ignore[misc]
            if before is not None and outputs is not None:  # predicted before the batch's target statistics
                outputs[...] = self._to_target_units(outputs, *before)  # type: ignore[attr-defined]
            return float(loss)
        from streamfit.models._chunks import chunk_pass

        return chunk_pass(self, X, T, sw, outputs)

    def _passive_aggressive_pass(self, X: np.ndarray, T: np.ndarray, sw: np.ndarray | None,
                                 outputs: np.ndarray | None) -> float:
        """Crammer et al.'s passive-aggressive updates, row by row, as scikit-learn's ``learning_rate="pa1"``
        / ``"pa2"`` (``eta0`` is ``C``): the step on row ``x`` with loss ``l`` is ``min(C, l / |x|^2)`` (PA-I) or
        ``l / (|x|^2 + 1 / (2 C))`` (PA-II) times the loss gradient (the intercept not in ``|x|^2``).

        The size depends on the row's loss at the current weights, so each row is predicted, then trained
        with that step as its weight at rate 1.  With several score columns one step serves them all
        (scikit-learn's one-vs-rest takes one per class).
        """
        trainer = self.trainer_  # type: ignore[attr-defined]
        eta0 = self.eta0  # type: ignore[attr-defined]
        C = 1.0 if eta0 == "auto" else float(eta0)  # scikit-learn's default C
        if not C > 0:
            raise ValueError(f"eta0 is the passive-aggressive C and must be > 0, got {C!r}")
        total = 0.0
        scaler = getattr(self, "scaler_", None)
        scaled = scaler.transform(X) if scaler is not None and self._scaler_in_graph() else X  # what the model sees
        for i in range(len(X)):
            x, t = X[i:i + 1], T[i:i + 1]
            p = trainer.predict(x)
            if outputs is not None:
                outputs[i] = p.reshape(outputs[i].shape)
            loss = trainer.loss.numpy(p.astype(np.float64), t.astype(np.float64) if t.dtype.kind == "f" else t)[0]
            total += loss
            sqnorm = float(np.square(scaled[i], dtype=np.float64).sum())
            if self.learning_rate == "pa1":
                tau = min(C, loss / sqnorm) if sqnorm > 0 else 0.0
            else:
                tau = loss / (sqnorm + 0.5 / C)
            weight = tau * (1.0 if sw is None else float(sw[i]))
            if weight > 0:
                trainer.step(x, t, np.array([weight]))
        self.t_ = trainer.n_steps
        self.loss_ = total / len(X) if len(X) else float("nan")
        return self.loss_

    def _fit_inputs(self, X: np.ndarray, sample_weight: np.ndarray | None, reset: bool) -> np.ndarray:
        if getattr(self, "scaler_", None) is None:
            return X
        self.scaler_.update(X, sample_weight)  # statistics first, then train on the batch they include
        return X if self._scaler_in_graph() else self.scaler_.transform(X)

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        if getattr(self, "scaler_", None) is None or self._scaler_in_graph():
            return X
        return self.scaler_.transform(X)

    def _inference_graph(self) -> ModelProto:
        """The trained graph; with ``standardize=True`` it scales its own inputs (before any raw-column
        encoding that ``to_onnx()`` puts in front of it)."""
        model = self.trainer_.to_onnx()  # type: ignore[attr-defined]
        if getattr(self, "scaler_", None) is None or self._scaler_in_graph():
            return model  # the trainer's graph scales: its exported copy carries the current mean and scale
        return standardized(model, self.scaler_.mean_, self.scaler_.scale_)

    def state_dict(self) -> dict[str, Any]:
        """Learned state as plain arrays and numbers: weights, optimizer, schedule, scaler statistics."""
        state = super().state_dict()  # type: ignore[misc]
        if getattr(self, "scaler_", None) is not None:
            state["scaler"] = self.scaler_.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; an unfitted estimator first builds the graph the weights fit."""
        super().load_state_dict(state)  # type: ignore[misc]
        self.scaler_ = scaler_from_state(state["scaler"], self.n_features_in_) if "scaler" in state else None
        self._bind_scaler()

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "trainer_")

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.input_tags.allow_nan = False
        tags.input_tags.sparse = False
        return tags


class ReadyRegressor(ReadyMade, OnnxRegressor):
    """A regressor whose graph is built on the first fit from ``X`` (features) and ``y`` (outputs)."""

    standardize_target: bool

    def _initialize(self, layers: Layers) -> None:
        """Become fitted with these layers (first fit, ``from_sklearn``, ``load_state_dict``)."""
        self.n_outputs_ = int(np.shape(layers[-1][0])[1])
        self.trainer_ = self._make_trainer(self.loss, self._graph(layers))
        self.target_scaler_ = RunningScaler(self.n_outputs_) if self.standardize_target else None
        self.t_ = 0

    def _fit_targets(self, T: np.ndarray, sample_weight: np.ndarray | None, reset: bool) -> np.ndarray:
        if getattr(self, "target_scaler_", None) is None:
            return T
        T2 = T.reshape(len(T), -1)
        self.target_scaler_.update(T2, sample_weight)  # statistics first, as for the features
        return self.target_scaler_.transform(T2).reshape(T.shape)

    def _to_target_units(self, out: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return out * scale.astype(out.dtype) + mean.astype(out.dtype)

    def _start(self, X: np.ndarray, y: np.ndarray) -> None:
        self._initialize(self._initial_layers(X.shape[1], 1 if y.ndim == 1 else y.shape[1]))

    def _restore_trainer(self, state: Mapping[str, Any]) -> None:
        self._initialize(layers_of(state["trainer"]["weights"]))

    def _targets(self, y: Any, n: int) -> np.ndarray:
        return check_targets(y, n)

    #: the target of this model's one-row path (models/_rows.py)
    _row_target = ScaledTarget

    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None) -> "ReadyRegressor":
        """One pass over ``X`` in minibatches of ``batch_size`` (one row of a stream: the one-row path)."""
        rows = row_path(self) if sample_weight is None else None
        if rows is not None and rows.partial_fit(self, X, y):
            return self
        super().partial_fit(X, y, sample_weight)
        keep_row_path(self, X)
        return self

    def partial_fit_predict(self, X: Any, y: Any, sample_weight: Any = None) -> np.ndarray:
        """:meth:`partial_fit`, returning each row's prediction made just before training on it.

        With ``standardize_target`` the predictions are mapped back with the target statistics from
        before this batch: a prediction never sees its own row's target.
        """
        rows = row_path(self) if sample_weight is None else None
        if rows is not None:
            out = rows.partial_fit_predict(self, X, y)
            if out is not None:
                return out
        out = super().partial_fit_predict(X, y, sample_weight)  # in target units (see _partial_pass)
        keep_row_path(self, X)
        return out

    def predict(self, X: Any) -> np.ndarray:
        """Predicted values as float64 (scikit-learn's convention; the float32 outputs convert exactly)."""
        rows = row_path(self)
        if rows is not None:
            out = rows.predict(self, X)
            if out is not None:
                return out
        out = self._predict(X, np.float64)
        scaler = getattr(self, "target_scaler_", None)
        return out if scaler is None else self._to_target_units(out, scaler.mean_, scaler.scale_)

    def to_onnx(self) -> ModelProto:
        """The inference model; it scales its inputs and maps its outputs back to target units as trained."""
        model = super().to_onnx()
        scaler = getattr(self, "target_scaler_", None)
        return model if scaler is None else destandardized(model, scaler.mean_, scaler.scale_)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if getattr(self, "target_scaler_", None) is not None:
            state["target_scaler"] = self.target_scaler_.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if "target_scaler" in state:
            self.target_scaler_ = RunningScaler(self.n_outputs_)
            self.target_scaler_.load_state_dict(state["target_scaler"])
        else:
            self.target_scaler_ = None

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


class ReadyClassifier(ReadyMade, OnnxClassifier):
    """A classifier whose graph is built on the first fit: one logit for 2 classes, else one per class."""

    _given_layers: Layers | None = None

    def _initialize(self, layers: Layers, classes: Any) -> None:
        """Become fitted with these layers and classes (``from_sklearn``, ``load_state_dict``)."""
        self._given_layers = layers
        try:
            self._start(np.zeros((1, int(np.shape(layers[0][0])[0])), np.float32), classes)
        finally:
            del self._given_layers
        self.t_ = 0

    def _model_and_width(self, X: np.ndarray) -> tuple[Any, int]:
        n_classes = len(self.classes_)
        width = 1 if n_classes == 2 else n_classes
        layers = self._given_layers or self._initial_layers(X.shape[1], width)
        given = int(np.shape(layers[-1][0])[1])
        if given != width:
            raise ValueError(f"the weights give {given} score(s) but {n_classes} classes need {width}")
        return self._graph(layers), width

    def _restore_trainer(self, state: Mapping[str, Any]) -> None:
        self._initialize(layers_of(state["trainer"]["weights"]), state["classes_"])

    def _check_labels(self, y: Any, n: int) -> np.ndarray:
        return check_labels(y, n)

    #: the target of this model's one-row path (models/_rows.py)
    _row_target = LabelTarget

    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> "ReadyClassifier":
        """One pass over ``X``; the first call needs ``classes`` (one row of a stream: the one-row path)."""
        rows = row_path(self) if classes is None and sample_weight is None else None
        if rows is not None and rows.partial_fit(self, X, y):
            return self
        super().partial_fit(X, y, classes, sample_weight)
        keep_row_path(self, X)
        return self

    def partial_fit_predict(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> np.ndarray:
        """:meth:`partial_fit`, returning each row's class probabilities computed just before training on it
        (one step per row of a stream: predict-then-learn at the cost of the step alone)."""
        rows = row_path(self) if classes is None and sample_weight is None else None
        if rows is not None:
            proba = rows.partial_fit_predict(self, X, y)
            if proba is not None:
                return proba
        out = super().partial_fit_predict(X, y, classes, sample_weight)
        keep_row_path(self, X)
        return out

    def predict(self, X: Any) -> np.ndarray:
        rows = row_path(self)
        if rows is not None:
            out = rows.predict(self, X)
            if out is not None:
                return out
        return super().predict(X)

    def predict_proba(self, X: Any) -> np.ndarray:
        rows = row_path(self)
        if rows is not None:  # one row of a stream: no validation of a matrix, one sigmoid
            out = rows.predict_proba(self, X)
            if out is not None:
                return out
        return super().predict_proba(X)
