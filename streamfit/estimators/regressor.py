"""OnnxRegressor: scikit-learn's regressor contract over any ONNX model."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfit._arrow import as_labels
from streamfit.estimators._base import OnnxEstimator
from streamfit.estimators._docstrings import shared_parameters

try:
    from sklearn.base import RegressorMixin as _Mixin
except ImportError:  # pragma: no cover
    class _Mixin:  # type: ignore[no-redef]
        predict: Any
        def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
            y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
            pred = np.asarray(self.predict(X), dtype=np.float64).reshape(y.shape)
            w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight)
            ss_res = (w[:, None] * (y - pred) ** 2).sum()
            ss_tot = (w[:, None] * (y - np.average(y, axis=0, weights=w)) ** 2).sum()
            return float(1 - ss_res / ss_tot)

__all__ = ["OnnxRegressor"]


@shared_parameters(output_default="the model's first", sklearn="SGDRegressor",
                   loss='A loss name (``"squared_error"``, ``"huber"``, ``"absolute_error"``, ...) or a\n'
                        ':class:`~streamfit.losses.Loss`.')
class OnnxRegressor(_Mixin, OnnxEstimator):
    """Trains the weights of an ONNX regression model online, with scikit-learn's estimator API.

    ``learning_rate`` is a schedule name (``"constant"``, ``"invscaling"``, ``"optimal"``,
    ``"adaptive"``), a float or a :class:`~streamfit.schedules.Schedule`; ``eta0``, ``power_t``,
    ``alpha``, ``l1_ratio`` and ``penalty`` mean what they mean in ``SGDRegressor``.  ``output_name``
    picks the output to train through (default: the model's first).  BatchNormalization trains in
    PyTorch's semantics (batch statistics, running ones updated and used to predict) unless
    ``freeze_batchnorm=True``; Dropout masks are seeded by ``random_state`` (an int, else 0).

    ``weights`` names the initializers to train (default: every float parameter, not the exporter's scalar
    constants: see ``streamfit._engine.prepare.constants.RULE``); ``freeze`` names more to keep out.

    Parameters
    ----------
    {onnx estimator parameters}

    Attributes
    ----------
    trainer_
        The :class:`~streamfit.Trainer` (made on the first fitting call).
    n_features_in_
        Features per row seen on the first fitting call.
    t_
        Training steps applied so far (the optimizer's step count).
    loss_
        The mean training loss of the last call.
    n_iter_, loss_curve_
        Epochs of the last :meth:`fit` and the mean loss of each.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit.testing import linear_model
    >>> X = np.random.default_rng(0).standard_normal((200, 3)).astype(np.float32)
    >>> y = X @ np.array([1.0, -2.0, 0.5], np.float32) + 1.0
    >>> reg = OnnxRegressor(linear_model(3), learning_rate="constant", eta0=0.05, batch_size=10, max_iter=20)
    >>> round(reg.fit(X, y).score(X, y), 3)
    1.0
    """

    def __init__(self, model: Any = None, *, weights: Any = None, freeze: Any = None, inputs: Any = None,
                 input_name: str | None = None,
                 output_name: str | None = None, loss: Any = "squared_error",
                 optimizer: Any = "sgd", learning_rate: Any = "invscaling", eta0: float | str = 0.01,
                 power_t: float = 0.25, alpha: float = 1e-4, l1_ratio: float = 0.15, penalty: Any = "l2",
                 momentum: float = 0.9, batch_size: int = 32, max_iter: int = 5, shuffle: bool = False,
                 random_state: Any = None, warm_start: bool = False, device: str = "cpu", step: str = "fused",
                 on_nonfinite: str = "raise", threads: int | None = None,
                 freeze_batchnorm: bool = False) -> None:
        self.model = model
        self.weights = weights
        self.freeze = freeze
        self.inputs = inputs
        self.input_name = input_name
        self.output_name = output_name
        self.loss = loss
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.penalty = penalty
        self.momentum = momentum
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.warm_start = warm_start
        self.device = device
        self.step = step
        self.on_nonfinite = on_nonfinite
        self.threads = threads
        self.freeze_batchnorm = freeze_batchnorm

    def _targets(self, y: Any, n: int) -> np.ndarray:
        """Targets of ``n`` rows in the trainer's dtype (a hook: the ready-made regressors apply
        scikit-learn's rules)."""
        T = as_labels(y)
        if T.dtype.kind not in "fiub":
            raise ValueError(f"regression targets must be numbers, got {T.dtype}")
        if T.shape[0] != n:
            raise ValueError(f"got {n} rows of features but {T.shape[0]} targets")
        return T

    def _fit_targets(self, T: np.ndarray, sample_weight: np.ndarray | None, reset: bool) -> np.ndarray:
        """Targets as the trainer sees them when training (a hook like ``_fit_inputs``: the identity here;
        the ready-made regressors standardize them)."""
        return T

    def _start(self, X: Any, y: Any) -> None:
        """Build the trainer (a hook: the ready-made regressors build their graph from ``X`` and ``y``)."""
        self.trainer_ = self._make_trainer(self.loss)

    def _checked(self, X: Any, y: Any, sample_weight: Any, first: bool, all_zero_ok: bool = True,
                 reset: bool | None = None) -> tuple[Any, np.ndarray, np.ndarray | None]:
        """The one validation of a fitting call's ``X``, ``y`` and sample weights (the layers below trust
        them); the first call builds the trainer."""
        X = self._check_X(X, reset=first if reset is None else reset)
        T = self._targets(y, len(X))
        sw = self._sample_weight(sample_weight, len(X), all_zero_ok)
        if first:
            self._start(X, T)
        dtype = self.trainer_.dtype
        return X, (T if T.dtype == dtype else T.astype(dtype)), sw

    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None) -> "OnnxRegressor":
        """Train on ``X``: ``ceil(n / batch_size)`` steps of ``batch_size`` rows, in order, in one session run.

        Parameters
        ----------
        X
            The rows: an ndarray ``(n, features)`` (a one-input model), a mapping {input name: array}, or,
            with ``inputs=``, an Arrow Table/RecordBatch or a dict of columns.
        y
            The targets: ``n`` values, or ``(n, outputs)`` for a model with several output columns.
        sample_weight
            Row weights (``n`` values), or None for 1 each.
        """
        first = not hasattr(self, "trainer_")
        X, T, sw = self._checked(X, y, sample_weight, first)
        self._partial_pass(X, T, sw, first)
        return self

    def partial_fit_predict(self, X: Any, y: Any, sample_weight: Any = None) -> np.ndarray:
        """:meth:`partial_fit`, returning each row's prediction made just before training on it.

        Progressive validation for free: the training step computes these outputs anyway.

        Parameters
        ----------
        X
            The rows: an ndarray ``(n, features)`` (a one-input model), a mapping {input name: array}, or,
            with ``inputs=``, an Arrow Table/RecordBatch or a dict of columns.
        y, sample_weight
            As for :meth:`partial_fit`.
        """
        first = not hasattr(self, "trainer_")
        X, T, sw = self._checked(X, y, sample_weight, first)
        out = np.empty((len(X),) + T.shape[1:], self.trainer_.dtype)
        self._partial_pass(X, T, sw, first, out)
        return out

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> "OnnxRegressor":
        """``max_iter`` epochs over ``X`` (from the model's initial weights unless ``warm_start``).

        Parameters
        ----------
        X
            The rows: an ndarray ``(n, features)`` (a one-input model), a mapping {input name: array}, or,
            with ``inputs=``, an Arrow Table/RecordBatch or a dict of columns.
        y, sample_weight
            As for :meth:`partial_fit`.
        """
        first = not (self.warm_start and hasattr(self, "trainer_"))
        X, T, sw = self._checked(X, y, sample_weight, first, all_zero_ok=False, reset=True)
        X = self._fit_inputs(X, sw, first)
        T = self._fit_targets(T, sw, first)
        rng = np.random.default_rng(self.random_state)
        self.loss_curve_ = []
        for _ in range(self.max_iter):
            order = rng.permutation(len(X)) if self.shuffle else None
            if order is None:
                self.loss_curve_.append(self._one_pass(X, T, sw))
            else:
                self.loss_curve_.append(self._one_pass(X[order], T[order], None if sw is None else sw[order]))
        self.n_iter_ = self.max_iter
        return self

    def predict(self, X: Any) -> np.ndarray:
        """The model's output for ``X`` with the current weights (shape ``(n,)`` for one output column).

        Parameters
        ----------
        X
            As for :meth:`partial_fit`.
        """
        return self._predict(X, self.trainer_.dtype if hasattr(self, "trainer_") else None)

    def _predict(self, X: Any, dtype: Any) -> np.ndarray:
        """Predictions as a new array of ``dtype``; one output column is returned as shape (rows,)."""
        self._require_fitted()
        out = self.trainer_._predict(self._inputs(self._check_X(X, reset=False, learn=False)), False)
        if out.size == 1 and out.ndim == 2:  # one row, one output (a per-event stream): one numpy call
            return np.array((out.item(0),), dtype=dtype)
        out = out.reshape(len(out)) if out.ndim == 2 and out.shape[1] == 1 else out
        return np.array(out, dtype=dtype)
