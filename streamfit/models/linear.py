"""LinearRegressor: an online linear regression whose ONNX graph is built from the data."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from streamfit.models._base import ReadyRegressor
from streamfit.models._hashed_linear import HashedLinear
from streamfit.models._hashed_rows import HashedRow
from streamfit.models.scaler import RunningScaler

__all__ = ["LinearRegressor"]


class LinearRegressor(HashedLinear, ReadyRegressor):
    """``y = X @ coef_.T + intercept_`` trained online (``partial_fit``) or in epochs (``fit``).

    The ONNX graph (``MatMul`` + ``Add``, zero initial weights) is built on the first call from
    ``n_features_in_`` and the width of ``y`` (one output, or several for a 2-D ``y``).  Any engine loss
    (``"squared_error"``, ``"huber"``, ``"absolute_error"``, ``"elastic"``), optimizer (``"adam"``,
    ``"sgd"``, ``"momentum"``, ``"nesterov"``, ``"adagrad"``, ``"adamw"`` or an instance) and schedule
    (``"constant"``, ``"invscaling"``, ``"optimal"``, ``"adaptive"``, a float or a
    :class:`~streamfit.schedules.Schedule`) applies; ``eta0``, ``power_t``, ``alpha``, ``l1_ratio``,
    ``penalty`` and ``momentum`` mean what they mean in scikit-learn's ``SGDRegressor``.  The defaults
    (Adam at a constant 0.005 to 0.01, by batch size, on standardized features and targets) work out of the
    box on streams in any units: River's TrumpApproval, Phishing and Bananas reach River's own progressive
    metric (``bench/river_defaults.py``).

    ``eta0="auto"`` (the default) starts each optimizer from a rate that works for it, so naming the optimizer
    is enough: ``"sgd"`` 0.01 (River's SGD, on standardized features), ``"adam"``/``"adamw"`` ``0.005 *
    sqrt(batch_size)`` and at most 0.01 (0.005 one row a step, 0.01 from 4 rows: ``bench/eta0_study.py``), ``"momentum"``
    and ``"nesterov"`` ``0.01 * (1 - momentum)`` (the same steady step), ``"adagrad"``, ``"rowwise_adagrad"``
    and ``"ftrl"`` 0.1 (per-coordinate rates: Vowpal Wabbit's progressive log loss on hashed string columns at
    batch 1 and 1024, ``bench/perrow.py``); an optimizer instance says its own
    (:meth:`~streamfit.optim.Optimizer.auto_eta0`).  ``get_params``/``clone`` keep ``"auto"``; the rate in
    force is ``trainer_.schedule``'s.  For ``learning_rate="pa1"``/``"pa2"`` ``"auto"`` is ``C = 1``.

    Parameters
    ----------
    categorical, dense, buckets, hash_seed
        With ``categorical=[columns]``: a hashed (VW-style) linear model, each categorical column (strings,
        integers, dictionaries, bool) one-hot encoded through its hashed values (``buckets`` ids in one table,
        each column with its own seed from ``hash_seed``, id 0 for nulls; the table trained row-sparsely), the
        ``dense`` columns beside with a weight each.  ``X`` is then an Arrow table or a dict of columns, and
        :meth:`to_onnx` exports a model taking the raw columns.  Dense columns are used as given (``standardize``
        applies to the dense models only; ``standardize_target`` applies to both).
    loss, optimizer, learning_rate, eta0, power_t, alpha, l1_ratio, penalty, momentum
        As for :class:`~streamfit.OnnxRegressor` (the choices above); ``eta0="auto"`` as above.
    standardize
        Keep a running mean and variance of every feature, updated from each batch before training on
        it, and train on standardized features; :meth:`to_onnx` exports a model that scales its inputs.
    standardize_target
        The same for the targets: train on standardized targets and map predictions back; without it a
        model starts at 0 and must climb to the level of ``y`` at the optimizer's pace (Adam at 0.01 moves
        a weight about 0.01 per step).  Losses with a scale of their own (Huber's ``delta``, the
        epsilon-insensitive tube) then measure it in standard deviations of ``y``; pass
        ``standardize_target=False`` to keep them in the units of ``y``.
    batch_size, max_iter, shuffle, random_state, warm_start
        Rows per training step; epochs of ``fit``; shuffling between epochs (seeded by ``random_state``);
        whether ``fit`` continues from the current weights.
    device, step, on_nonfinite, threads
        As for :class:`~streamfit.Trainer`.
    inputs
        The feature input ``"X"`` from Arrow columns, as :class:`~streamfit.OnnxRegressor`'s ``inputs=``:
        ``{"X": [column, ...]}`` (scalar and vector columns, concatenated) or ``{"X": encoder}``; the model has
        that one input, so the columns or the encoder alone say the same (``inputs=["a", "b"]``,
        ``inputs=Padded("v", length=8)``).  ``X`` may then be an Arrow Table/RecordBatch or a dict of columns
        (the same holds for the other ready-made models).

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit import LinearRegressor
    >>> rng = np.random.default_rng(0)
    >>> reg = LinearRegressor(eta0=0.05, random_state=0)
    >>> for _ in range(100):
    ...     X = rng.standard_normal((32, 3))
    ...     _ = reg.partial_fit(X, X @ [1.0, -2.0, 0.5] + 3.0)
    >>> reg.coef_.round(1).tolist(), reg.intercept_.round(1).tolist()
    ([1.0, -2.0, 0.5], [3.0])

    From columns (an Arrow table or a dict of them), in the order ``inputs=`` names them:

    >>> cols = LinearRegressor(inputs=["a", "b", "c"], eta0=0.05, random_state=0)
    >>> for _ in range(100):
    ...     X = rng.standard_normal((32, 3))
    ...     _ = cols.partial_fit({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2]}, X @ [1.0, -2.0, 0.5] + 3.0)
    >>> cols.coef_.round(1).tolist()
    [1.0, -2.0, 0.5]
    """

    def __init__(self, *, categorical: Sequence[str] = (), dense: Sequence[str] = (), buckets: int = 2 ** 18,
                 hash_seed: int = 0, loss: Any = "squared_error", optimizer: Any = "adam", learning_rate: Any = "constant",
                 eta0: float | str = "auto", power_t: float = 0.25, alpha: float = 1e-4, l1_ratio: float = 0.15,
                 penalty: Any = "l2", momentum: float = 0.9, batch_size: int = 32, max_iter: int = 20,
                 shuffle: bool = True, random_state: Any = None, warm_start: bool = False,
                 standardize: bool = True, standardize_target: bool = True, device: str = "cpu",
                 step: str = "fused", on_nonfinite: str = "raise", threads: int | None = None, inputs: Any = None) -> None:
        self.categorical = categorical
        self.dense = dense
        self.buckets = buckets
        self.hash_seed = hash_seed
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
        self.standardize = standardize
        self.standardize_target = standardize_target
        self.device = device
        self.step = step
        self.on_nonfinite = on_nonfinite
        self.threads = threads
        self.inputs = inputs

    # -- categorical=: the hashed graph, one output per target column ----------------------------------------
    def _hashed_width(self) -> int:
        return int(self.__dict__.get("n_outputs_", 1))

    def _start_hashed(self, n_outputs: int) -> None:
        self.n_outputs_ = n_outputs
        self.trainer_ = self._make_trainer(self.loss, self.model)
        self.target_scaler_ = RunningScaler(n_outputs) if self.standardize_target else None
        self.scaler_ = None
        self.t_ = 0

    def _start(self, X: Any, y: np.ndarray) -> None:
        if not self._hashed:
            return super()._start(X, y)
        self._start_hashed(1 if y.ndim == 1 else y.shape[1])

    def _restore_trainer(self, state: Mapping[str, Any]) -> None:
        if not self._hashed:
            return super()._restore_trainer(state)
        self._start_hashed(int(np.shape(state["trainer"]["weights"]["bias"])[-1]))

    # -- categorical=: one event per call: the one-row path with the hashed reader (models/_hashed_rows.py) ----
    def _row_reader(self) -> Any:
        return HashedRow if self._hashed else super()._row_reader()

    @property
    def coef_(self) -> np.ndarray:
        """Weights on the raw features in target units (the scalers folded in: ``predict(X) == X @ coef_.T +
        intercept_``), shape (features,) for one output, (outputs, features) for several."""
        if self._hashed:
            raise self._hashed_coef_error()
        coef = self._linear_in_raw_units()[0].T
        return coef[0] if coef.shape[0] == 1 else coef

    @property
    def intercept_(self) -> np.ndarray:
        """Intercepts in target units, shape (outputs,)."""
        if self._hashed:
            raise self._hashed_coef_error()
        return self._linear_in_raw_units()[1]
