"""Factorization machines and hashed linear models over categorical columns (click, ranking, fraud models).

Categorical columns are hashed into one table of ``buckets`` ids (:class:`~streamfit.features.Hashed`,
VW's hashing trick, each column with its own seed); dense columns enter as values.  The ONNX graph
(:mod:`streamfit.models._fm_graph`) reads its tables through ``Gather``, so a step trains only the rows of
the ids in its batch, whatever ``buckets`` is.  ``to_onnx()`` exports a model that takes the raw columns
(strings, integers, dictionaries) and hashes them in its graph.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from streamfit.estimators.classifier import OnnxClassifier
from streamfit.estimators.regressor import OnnxRegressor
from streamfit.models._hashed import HashedModel

__all__ = ["FMClassifier", "FMRegressor"]


class _Factorization(HashedModel):
    """What the factorization machines add to the hashed models: factors, and the mapping and graph as their
    ``inputs`` and ``model``."""

    n_factors: int
    init_scale: float
    _sparse_tables = True  # lazy rules (Adam, penalties) on touched rows: a step never costs O(buckets)

    def _auto_eta0(self) -> float:
        """``eta0="auto"``: AdaGrad (the default) at 0.05 (factors take smaller steps than a linear weight's
        0.1), other optimizers at their own rate (FTRL 0.1)."""
        from streamfit.optim import AdaGrad

        opt = self._optimizer()  # type: ignore[attr-defined]
        return 0.05 if isinstance(opt, AdaGrad) else float(opt.auto_eta0())

    def _factors(self) -> tuple[int, float]:
        return self.n_factors, self.init_scale

    def _check_hashed_params(self) -> None:
        super()._check_hashed_params()
        if not list(self.categorical) and not list(self.dense):
            raise ValueError("give at least one categorical or dense column")
        if isinstance(self.n_factors, bool) or not isinstance(self.n_factors, (int, np.integer)) or self.n_factors < 0:
            raise ValueError(f"n_factors must be an int >= 0, got {self.n_factors!r}")

    def _precheck_params(self) -> None:
        """Refuse now what the first fit would refuse (columns, factors, buckets, seed), without building the tables."""
        self._check_hashed_params()
        self.inputs

    @property
    def inputs(self) -> dict[str, Any]:  # type: ignore[override]
        """The model inputs from the columns: hashed ids of the categorical ones, the dense ones as values."""
        return self._hashed_inputs()

    @property
    def model(self) -> Any:  # type: ignore[override]
        """The ONNX graph (built once per fit from the parameters, with initial factors from ``random_state``)."""
        return self._hashed_graph(self._n_outputs())

    def _n_outputs(self) -> int:
        return 1

    def _check_X(self, X: Any, reset: bool, learn: bool = True) -> Any:
        return super()._check_X(self._columns_X(X, type(self).__name__), reset, learn)  # type: ignore[misc]


_DOC_PARAMS = """
    Parameters
    ----------
    categorical
        Names of the categorical columns (string, integer, dictionary or bool), hashed into one table.
    dense
        Names of numeric columns, used as values (a linear weight and factors each).
    buckets
        Rows of the hashed tables (ids; id 0 is for nulls).
    n_factors
        Rank of the pairwise interactions; 0 makes a hashed linear model.
    init_scale, hash_seed
        Standard deviation of the initial factors; seed of the hashing (every column hashes with its own).
    loss, optimizer, learning_rate, eta0, power_t, alpha, l1_ratio, penalty, momentum
        As for the other estimators (``eta0="auto"``: 0.05 for AdaGrad, the default, 0.1 for FTRL); tables use
        lazy variants (a penalty and Adam's moments move a row only when its ids are in a batch).
        ``optimizer="ftrl"`` is McMahan's FTRL-Proximal.
    batch_size, max_iter, shuffle, random_state, warm_start
        Rows per training step; epochs of ``fit``; shuffling between epochs (seeded by ``random_state``);
        whether ``fit`` continues from the current weights.
    device, step, on_nonfinite, threads
        As for :class:`~streamfit.Trainer`.
"""


class FMClassifier(_Factorization, OnnxClassifier):
    """Binary order-2 factorization machine (log loss) over hashed categorical columns and dense columns.

    Examples
    --------
    >>> from streamfit.testing import ClickStream
    >>> stream = ClickStream(seed=0, n_categorical=4, n_dense=2, cardinalities=(10, 50, 100, 1000))
    >>> clf = FMClassifier(categorical=stream.categorical, dense=stream.dense, buckets=2**12, n_factors=4,
    ...                    random_state=0)
    >>> for k in range(20):
    ...     batch = stream.batch(k, 512)
    ...     _ = clf.partial_fit(batch, batch.column("label").to_numpy(), classes=[0, 1])
    >>> test = stream.batch(100, 2000)
    >>> clf.score(test, test.column("label").to_numpy()) > 0.7
    True
    """

    def __init__(self, categorical: Sequence[str] = (), *, dense: Sequence[str] = (), buckets: int = 2 ** 18,
                 n_factors: int = 8, init_scale: float = 0.01, hash_seed: int = 0, loss: Any = "auto",
                 optimizer: Any = "adagrad", learning_rate: Any = "constant", eta0: float | str = "auto",
                 power_t: float = 0.25, alpha: float = 1e-6, l1_ratio: float = 0.15, penalty: Any = "l2",
                 momentum: float = 0.9, batch_size: int = 1024, max_iter: int = 5, shuffle: bool = False,
                 random_state: Any = None, warm_start: bool = False, device: str = "cpu", step: str = "fused",
                 on_nonfinite: str = "raise", threads: int | None = None) -> None:
        self.categorical = categorical
        self.dense = dense
        self.buckets = buckets
        self.n_factors = n_factors
        self.init_scale = init_scale
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
        self.device = device
        self.step = step
        self.on_nonfinite = on_nonfinite
        self.threads = threads

    def _model_and_width(self, X: Any) -> tuple[Any, int]:
        if len(self.classes_) != 2:
            raise ValueError(f"{type(self).__name__} is binary; got {len(self.classes_)} classes")
        return self.model, 1


class FMRegressor(_Factorization, OnnxRegressor):
    """Order-2 factorization machine regression (squared error by default) over hashed categorical columns
    and dense columns."""

    def __init__(self, categorical: Sequence[str] = (), *, dense: Sequence[str] = (), buckets: int = 2 ** 18,
                 n_factors: int = 8, init_scale: float = 0.01, hash_seed: int = 0, loss: Any = "squared_error",
                 optimizer: Any = "adagrad", learning_rate: Any = "constant", eta0: float | str = "auto",
                 power_t: float = 0.25, alpha: float = 1e-6, l1_ratio: float = 0.15, penalty: Any = "l2",
                 momentum: float = 0.9, batch_size: int = 1024, max_iter: int = 5, shuffle: bool = False,
                 random_state: Any = None, warm_start: bool = False, device: str = "cpu", step: str = "fused",
                 on_nonfinite: str = "raise", threads: int | None = None) -> None:
        self.categorical = categorical
        self.dense = dense
        self.buckets = buckets
        self.n_factors = n_factors
        self.init_scale = init_scale
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
        self.device = device
        self.step = step
        self.on_nonfinite = on_nonfinite
        self.threads = threads


FMClassifier.__doc__ = (FMClassifier.__doc__ or "") + _DOC_PARAMS
FMRegressor.__doc__ = (FMRegressor.__doc__ or "") + _DOC_PARAMS
