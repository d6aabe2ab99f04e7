"""LogisticRegression: an online (binary or multinomial) logistic regression built from the data."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from streamfit.models._base import ReadyClassifier
from streamfit.models._hashed_linear import HashedLinear
from streamfit.models._hashed_rows import HashedRow

__all__ = ["LogisticRegression"]


class LogisticRegression(HashedLinear, ReadyClassifier):
    """Logistic regression trained online: one logit and log loss for 2 classes, softmax for more.

    The ONNX graph (``MatMul`` + ``Add``, zero initial weights) is built on the first call from
    ``n_features_in_`` and ``classes_`` (``partial_fit`` needs ``classes`` on its first call, as in
    scikit-learn).  ``loss="auto"`` picks ``"log_loss"`` or ``"softmax_cross_entropy"``; optimizers,
    schedules and penalties are the engine's, with the parameters of
    :class:`~streamfit.models.linear.LinearRegressor` (``eta0="auto"``: 0.01 for SGD, 0.005 to 0.01 for Adam
    by batch size, 0.1 for FTRL and AdaGrad, the rule stated there).

    With ``categorical=[columns]`` it is a hashed (VW-style) logistic regression: each categorical column
    one-hot encoded through its hashed values (``buckets`` ids in one table, trained row-sparsely), the
    ``dense=`` columns beside with a weight each; ``X`` is an Arrow table or a dict of columns, ``to_onnx()``
    takes the raw columns, and ``optimizer="ftrl"`` (FTRL-Proximal) or ``"adagrad"`` suit it.  Dense
    columns are used as given (no standardization in this mode).

    Parameters
    ----------
    categorical, dense, buckets, hash_seed
        With ``categorical=[columns]``: the hashed model above (``buckets`` ids in one table, each column
        hashed with its own seed from ``hash_seed``, id 0 for nulls; the ``dense`` columns beside with a
        weight each).
    loss
        ``"auto"``: ``"log_loss"`` for 2 classes, ``"softmax_cross_entropy"`` for more; or an engine loss
        name or :class:`~streamfit.losses.Loss` (margin losses on several classes train one-vs-rest).
    optimizer, learning_rate, eta0, power_t, alpha, l1_ratio, penalty, momentum
        As for :class:`~streamfit.models.linear.LinearRegressor` (``eta0="auto"``: the optimizer's own
        starting rate).
    batch_size, max_iter, shuffle, random_state, warm_start
        Rows per training step; epochs of ``fit``; shuffling between epochs (seeded by ``random_state``);
        whether ``fit`` continues from the current weights.
    standardize
        Train on features standardized by a running mean and variance (updated from each batch before
        training on it); :meth:`to_onnx` exports a model that scales its inputs.  Dense models only.
    device, step, on_nonfinite, threads
        As for :class:`~streamfit.Trainer`.
    inputs
        The feature input ``"X"`` from Arrow columns, as for :class:`~streamfit.models.linear.LinearRegressor`.

    Attributes
    ----------
    classes_
        The class labels, sorted.
    coef_, intercept_
        Weights and intercepts on the raw features (dense models only).
    n_features_in_, t_, loss_
        Features per row; training steps applied; the mean training loss of the last call.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit import LogisticRegression
    >>> rng = np.random.default_rng(0)
    >>> clf = LogisticRegression(random_state=0)
    >>> for _ in range(50):
    ...     X = rng.standard_normal((32, 2))
    ...     _ = clf.partial_fit(X, np.where(X[:, 0] > X[:, 1], "a", "b"), classes=["a", "b"])
    >>> X = rng.standard_normal((500, 2))
    >>> clf.score(X, np.where(X[:, 0] > X[:, 1], "a", "b")) > 0.95
    True

    Hashed categorical columns beside dense ones:

    >>> from streamfit.testing import ClickStream
    >>> stream = ClickStream(seed=0, n_categorical=4, n_dense=2, cardinalities=(10, 50, 100, 1000))
    >>> ctr = LogisticRegression(categorical=stream.categorical, dense=stream.dense, buckets=2**12,
    ...                          optimizer="ftrl", batch_size=256)
    >>> for k in range(20):
    ...     batch = stream.batch(k, 512)
    ...     _ = ctr.partial_fit(batch, batch.column("label").to_numpy(), classes=[0, 1])
    >>> test = stream.batch(100, 2000)
    >>> ctr.score(test, test.column("label").to_numpy()) > 0.7
    True
    """

    def __init__(self, *, categorical: Sequence[str] = (), dense: Sequence[str] = (), buckets: int = 2 ** 18,
                 hash_seed: int = 0, loss: Any = "auto", optimizer: Any = "adam", learning_rate: Any = "constant",
                 eta0: float | str = "auto", power_t: float = 0.25, alpha: float = 1e-4, l1_ratio: float = 0.15,
                 penalty: Any = "l2", momentum: float = 0.9, batch_size: int = 32, max_iter: int = 20,
                 shuffle: bool = True, random_state: Any = None, warm_start: bool = False,
                 standardize: bool = True, device: str = "cpu", step: str = "fused", on_nonfinite: str = "raise",
                 threads: int | None = None, inputs: Any = None) -> None:
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
        self.device = device
        self.step = step
        self.on_nonfinite = on_nonfinite
        self.threads = threads
        self.inputs = inputs

    # -- categorical=: the hashed graph, one logit for 2 classes, else one per class -----------------------
    def _hashed_width(self) -> int:
        classes = self.__dict__.get("classes_")
        return 1 if classes is None or len(classes) == 2 else len(classes)

    def _model_and_width(self, X: Any) -> tuple[Any, int]:
        if not self._hashed:
            return super()._model_and_width(X)
        return self.model, self._hashed_width()

    def _restore_trainer(self, state: Mapping[str, Any]) -> None:
        if not self._hashed:
            return super()._restore_trainer(state)
        self._set_classes(np.asarray(state["classes_"]))
        self.binary_ = bool(state["binary_"])
        self.loss_name_ = str(state["loss_name_"])
        self.output_kind_ = "scores"
        self.trainer_ = self._make_trainer(self.loss_name_, self.model)

    # -- categorical=: one event per call: the one-row path with the hashed reader (models/_hashed_rows.py) ----
    def _row_reader(self) -> Any:
        return HashedRow if self._hashed else super()._row_reader()

    @property
    def coef_(self) -> np.ndarray:
        """Weights on the raw features (the scaler folded in), shape (1, features) for 2 classes, (classes,
        features) for more (scikit-learn's)."""
        if self._hashed:
            raise self._hashed_coef_error()
        return self._linear_in_raw_units()[0].T

    @property
    def intercept_(self) -> np.ndarray:
        """Intercepts, shape (1,) for 2 classes, (classes,) for more."""
        if self._hashed:
            raise self._hashed_coef_error()
        return self._linear_in_raw_units()[1]
