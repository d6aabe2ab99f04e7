"""What the estimators share: parameters -> Trainer, minibatch epochs, state for checkpoints.

``X`` follows the inputs contract of :mod:`streamfit._engine.prepare.model`: an ndarray for a one-input model, a
dict {model input name: array} for any model, or an Arrow Table/RecordBatch (all its columns stacked into
the one input, or, with ``inputs=``, turned into such a dict by :meth:`OnnxEstimator._arrow_inputs`).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from streamfit._arrow import as_features, as_labels
from streamfit._engine.prepare.input_signature import NamedRows, check_mapping
from streamfit._engine.trainer import Trainer
from streamfit.estimators._cache import ATTRIBUTE as CACHE
from streamfit.exceptions import BadInputError
from streamfit.losses import Loss
from streamfit.optim import get_optimizer
from streamfit.penalties import get_penalty
from streamfit.schedules import Schedule, as_schedule

try:  # scikit-learn is optional: with it, clone/check_estimator/pipelines work as usual
    from sklearn.base import BaseEstimator as _SkBase
except ImportError:  # pragma: no cover - exercised only without the [sklearn] extra
    from streamfit._params import param_names

    class _SkBase:  # type: ignore[no-redef]
        """Minimal get_params/set_params when scikit-learn is not installed."""

        @classmethod
        def _get_param_names(cls) -> list[str]:
            return sorted(param_names(cls))

        def get_params(self, deep: bool = True) -> dict[str, Any]:
            return {name: getattr(self, name) for name in self._get_param_names()}

        def set_params(self, **params: Any) -> "_SkBase":
            for key, value in params.items():
                if key not in self._get_param_names():
                    raise ValueError(f"invalid parameter {key!r} for {type(self).__name__}")
                setattr(self, key, value)
            return self

__all__ = ["OnnxEstimator"]

_OPTIMIZER_PARAMS = {"momentum": ("momentum",), "nesterov": ("momentum",)}


class OnnxEstimator(_SkBase):
    """Base of the estimators: ``__init__`` stores parameters only; validation happens in fit."""

    _default_loss: str = "squared_error"
    #: set by fit/partial_fit: the last training loss, and the optimizer's step count
    loss_: float
    t_: int
    #: the Trainer's ``sparse``: how embedding tables are trained (the hashed models ask for row-sparse)
    _sparse_tables: Any = "auto"

    # -- building ----------------------------------------------------------------------------------
    def _schedule(self, loss: Loss) -> Schedule:
        if isinstance(self.learning_rate, Schedule):  # a copy: fit never mutates a parameter (refits agree)
            return copy.deepcopy(self.learning_rate)
        if isinstance(self.learning_rate, (int, float)):
            return as_schedule(float(self.learning_rate))
        if self.learning_rate == "optimal":
            return as_schedule("optimal", alpha=self.alpha, loss_dloss=loss.dloss)
        kwargs: dict[str, Any] = {"invscaling": {"power_t": self.power_t}}.get(self.learning_rate, {})
        if self.learning_rate in ("constant", "invscaling", "adaptive"):
            kwargs["eta0"] = self._eta0()
        return as_schedule(self.learning_rate, **kwargs)

    def _eta0(self) -> float:
        """``eta0``, or for ``eta0="auto"`` the rate the optimizer starts from (:meth:`_auto_eta0`)."""
        if isinstance(self.eta0, str):
            if self.eta0 != "auto":
                raise ValueError(f"eta0 must be a positive number or 'auto', got {self.eta0!r}")
            return self._auto_eta0()
        return self.eta0  # type: ignore[no-any-return]

    def _auto_eta0(self) -> float:
        """``eta0="auto"``: the optimizer's own starting rate (:meth:`~streamfit.optim.Optimizer.auto_eta0`)."""
        return self._optimizer().auto_eta0()

    def _optimizer(self) -> Any:
        """The optimizer the parameters name (``momentum`` passed to the rules that take it)."""
        opt_kwargs = {p: getattr(self, p) for p in _OPTIMIZER_PARAMS.get(self.optimizer, ())} \
            if isinstance(self.optimizer, str) else {}
        return get_optimizer(self.optimizer, **opt_kwargs)

    def _make_trainer(self, loss: "str | Loss", model: Any = None, weights: Any = None,
                      host: "tuple[str, ...]" = ()) -> Trainer:
        """A Trainer from the parameters, for ``model`` (default: the ``model``/``weights`` parameters);
        ``host`` names initializers the estimator sets between steps (see :class:`Trainer`)."""
        from streamfit.losses import get_loss

        if model is None:
            model, weights = self.model, self.weights
        loss_obj = get_loss(loss)
        if not isinstance(self.batch_size, (int, np.integer)) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {self.max_iter!r}")
        trainer = Trainer(model, weights=weights, input_name=getattr(self, "input_name", None),
                          output_name=self._trained_output(model), loss=loss_obj,
                          optimizer=self._optimizer(),
                          learning_rate=self._schedule(loss_obj),
                          penalty=get_penalty(self.penalty, self.alpha, self.l1_ratio), device=self.device,
                          step=self.step, on_nonfinite=self.on_nonfinite, threads=self.threads,
                          freeze_batchnorm=bool(getattr(self, "freeze_batchnorm", False)),
                          seed=self._dropout_seed(), sparse=self._sparse_tables, host=host,
                          freeze=tuple(getattr(self, "freeze", None) or ()))
        inputs = getattr(self, "inputs", None)
        check_mapping(inputs, trainer.model_inputs)
        if inputs is not None:  # widths, lengths, encoders against the declared inputs, before any data
            from streamfit._columns.mapping import check_inputs

            check_inputs(trainer.model_inputs, inputs)
        return trainer

    def _dropout_seed(self) -> int:
        """The seed of the model's Dropout masks: ``random_state`` when it is an int, else 0 (reproducible)."""
        rs = getattr(self, "random_state", None)
        return int(rs) if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool) else 0

    def _trained_output(self, model: Any) -> str | None:
        """The output to train through (``output_name``; None: the model's first)."""
        return getattr(self, "output_name", None)

    # -- data --------------------------------------------------------------------------------------
    def _check_X(self, X: Any, reset: bool, learn: bool = True) -> "np.ndarray | NamedRows":
        """``X`` as the trainer takes it: an ndarray, or :class:`NamedRows` for a dict or an Arrow table
        mapped by ``inputs`` (``learn=False``, predictions: encoders learn nothing from it).  Element types
        and shapes are checked against the model by the trainer, once
        per batch signature; here only the number of features of an array input."""
        if isinstance(X, (pa.Table, pa.RecordBatch)):
            if getattr(self, "inputs", None) is not None:
                X = self._arrow_inputs(X, learn=learn)
            else:
                trainer = self.__dict__.get("trainer_")
                # the declared float type; float64 before the trainer exists (first call) or for a non-float
                # input (the trainer then says what the input expects: the column plan maps such columns)
                declared = trainer.model_inputs[0].dtype if trainer is not None else np.dtype(np.float64)
                dtype = declared if declared.kind == "f" else np.dtype(np.float64)
                X = as_features(X, dtype)
        if isinstance(X, dict):
            X = NamedRows(X)
        if type(X) is NamedRows:
            if reset or not hasattr(self, "n_features_in_"):
                self.n_features_in_ = sum(math.prod(a.shape[1:]) for a in X.arrays.values() if a.ndim)
            return X
        if type(X) is not np.ndarray:
            X = np.asarray(X)
            if X.dtype.kind not in "fiub":
                raise BadInputError(f"features are {X.dtype}, expected numbers", reason="wrong_type")
        if X.ndim < 2:
            raise BadInputError(f"features must be at least 2-D (rows, features...), got shape {X.shape}; "
                                "reshape a single feature with X.reshape(-1, 1)", reason="shape_mismatch")
        self._check_width(X.shape[1] if X.ndim == 2 else math.prod(X.shape[1:]), reset)
        return X

    def _check_width(self, width: int, reset: bool) -> None:
        """Remember the number of features (``reset``), or check it against the first call's."""
        if reset:
            self.n_features_in_ = width
        elif width != self.__dict__.get("n_features_in_", width):
            raise BadInputError(f"X has {width} features, but {type(self).__name__} "
                                f"is expecting {self.n_features_in_} features as input", reason="shape_mismatch")
        elif "n_features_in_" not in self.__dict__:
            self.n_features_in_ = width

    def _arrow_inputs(self, table: "pa.Table | pa.RecordBatch", learn: bool = True) -> dict[str, np.ndarray]:
        """The model inputs ``{input name: array}`` from an Arrow table, as the ``inputs`` mapping says.

        The hook of the column plan (``inputs`` maps a model input to a column name, a list of column
        names or an encoder); it fills the model's declared dtype and shape.
        """
        from streamfit.features._estimator import arrow_inputs

        return arrow_inputs(self, table, learn=learn)

    def _stream_inputs(self) -> Any:
        """What a stream with ``inputs=`` reads for this estimator and how trained rows come back to it (the
        encoders' committed states): :class:`~streamfit.features._estimator.StreamInputs`."""
        from streamfit.features._estimator import stream_inputs

        return stream_inputs(self)

    def _fit_inputs(self, X: np.ndarray, sample_weight: np.ndarray | None, reset: bool) -> np.ndarray:
        """Features as the trainer sees them when training, after updating any statistics of the inputs.

        A hook: the identity here; the ready-made estimators standardize (``reset`` starts afresh).
        """
        return X

    def _inputs(self, X: Any) -> np.ndarray:
        """Features as the trainer sees them when predicting (a hook, see :meth:`_fit_inputs`)."""
        return X

    def _batches(self, n: int) -> list[slice]:
        """The steps' row slices of a call of ``n`` rows: ``batch_size`` rows each, the last one shorter."""
        size = self.batch_size
        full = n // size * size
        out = [slice(i, i + size) for i in range(0, full, size)]
        if full < n:
            out.append(slice(full, n))
        return out

    def _one_pass(self, X: np.ndarray, T: np.ndarray, sw: np.ndarray | None,
                  outputs: np.ndarray | None = None) -> float:
        """One pass in minibatches; ``outputs`` (if given) receives each row's model output before its step."""
        if len(X) <= self.batch_size and outputs is None:  # one step: no slicing, no bookkeeping
            loss = self.trainer_.step(X, T, sw)
            self.t_ = self.trainer_.n_steps
            self.loss_ = loss if math.isfinite(loss) else float("nan")
            return self.loss_
        from streamfit._engine.steps.scan import train_chunk

        # the steps in order, in one session run (a Scan over them): what one step per call gives
        result = train_chunk(self.trainer_, X, T, sw, self.batch_size)
        if outputs is not None:
            outputs[...] = result.outputs.reshape(outputs.shape)
        total, rows = 0.0, 0
        for loss, sl in zip(result.losses, self._batches(len(X))):
            if np.isfinite(loss):
                total += float(loss) * (sl.stop - sl.start)
                rows += sl.stop - sl.start
        self.t_ = self.trainer_.n_steps
        self.loss_ = total / rows if rows else float("nan")
        return self.loss_

    def _partial_pass(self, X: Any, T: np.ndarray, sw: np.ndarray | None, first: bool,
                      outputs: np.ndarray | None = None) -> float:
        """``partial_fit``'s pass: the statistics of the inputs (and targets) updated by the call, then its steps
        (a hook: the ready-made models update their statistics per step, see :mod:`streamfit.models._chunks`)."""
        return self._one_pass(self._fit_inputs(X, sw, first), self._fit_targets(T, sw, first), sw, outputs)

    def _fit_targets(self, T: np.ndarray, sample_weight: np.ndarray | None, reset: bool) -> np.ndarray:
        """Targets as the trainer sees them when training (a hook: the identity here)."""
        return T

    def _sample_weight(self, sample_weight: Any, n: int, all_zero_ok: bool = True) -> np.ndarray | None:
        """Sample weights of ``n`` rows, checked once at the public method (a hook: the ready-made
        estimators apply scikit-learn's rules; ``all_zero_ok`` is False in ``fit``)."""
        if sample_weight is None:
            return None
        sw = np.asarray(as_labels(sample_weight), dtype=np.float64).reshape(-1)
        if sw.shape[0] != n:
            raise BadInputError(f"got {sw.shape[0]} sample weights for {n} rows", reason="shape_mismatch")
        return sw

    # -- public ------------------------------------------------------------------------------------
    def to_onnx(self) -> Any:
        """The inference ONNX model with the trained weights (runs in plain onnxruntime)."""
        self._require_fitted()
        from streamfit.features._estimator import export_model

        return export_model(self, self._inference_graph())  # with encoders: raw columns in, encoded in the graph

    def _inference_graph(self) -> Any:
        """The trained model on the model's own inputs (a hook: the ready-made models prepend their scaling)."""
        return self.trainer_.to_onnx()

    def _require_fitted(self) -> None:
        if not hasattr(self, "trainer_"):
            try:
                from sklearn.exceptions import NotFittedError
            except ImportError:  # pragma: no cover
                NotFittedError = AttributeError  # type: ignore[misc,assignment]
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet. Call 'fit' or "
                                 "'partial_fit' with appropriate arguments before using this estimator.")

    def state_dict(self) -> dict[str, Any]:
        """Learned state as plain arrays and numbers (checkpoints store it; no pickle)."""
        self._require_fitted()
        state = {"trainer": self.trainer_.state_dict(), "n_features_in_": self.n_features_in_}
        if "encoder_states_" in self.__dict__ or "input_columns_" in self.__dict__:  # the column plan's
            from streamfit.features._estimator import encoder_state_dict

            state["features"] = encoder_state_dict(self)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore learned state (an unfitted estimator builds its trainer first, from its parameters)."""
        if not hasattr(self, "trainer_"):
            self._restore_trainer(state)
        self.trainer_.load_state_dict(state["trainer"])
        self.n_features_in_ = int(state["n_features_in_"])
        self.t_ = self.trainer_.n_steps
        if "features" in state:
            from streamfit.features._estimator import load_encoder_state

            load_encoder_state(self, state["features"])

    def _restore_trainer(self, state: Mapping[str, Any]) -> None:
        self.trainer_ = self._make_trainer(self.loss)

    # -- pickling: the trainer holds onnxruntime sessions, so it travels as its model and state ----------
    def __getstate__(self) -> dict[str, Any]:
        parent = getattr(super(), "__getstate__", None)
        state = dict(parent() if parent is not None else self.__dict__)  # a copy: the live dict stays intact
        trainer = state.pop("trainer_", None)
        cache = state.get(CACHE)
        if cache is not None:  # without the one-row path: it holds the trainer, and is made again
            state[CACHE] = cache.for_pickle()
        if trainer is not None:
            state["_pickled_trainer"] = {"model": trainer.prepared.standalone_model().SerializeToString(),
                                         "weights": trainer.weight_names, "loss": trainer.loss,
                                         "state": trainer.state_dict()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        saved = state.pop("_pickled_trainer", None)
        parent = getattr(super(), "__setstate__", None)
        if parent is not None:
            parent(state)
        else:  # pragma: no cover - Python 3.10 without scikit-learn
            self.__dict__.update(state)
        if saved is not None:
            self.trainer_ = self._make_trainer(saved["loss"], saved["model"], saved["weights"])
            self.trainer_.load_state_dict(saved["state"])

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags
