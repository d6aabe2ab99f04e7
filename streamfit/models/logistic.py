"""LogisticRegression: an online (binary or multinomial) logistic regression built from the data."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfit.models._base import ReadyClassifier

__all__ = ["LogisticRegression"]


class LogisticRegression(ReadyClassifier):
    """Logistic regression trained online: one logit and log loss for 2 classes, softmax for more.

    The ONNX graph (``MatMul`` + ``Add``, zero initial weights) is built on the first call from
    ``n_features_in_`` and ``classes_`` (``partial_fit`` needs ``classes`` on its first call, as in
    scikit-learn).  ``loss="auto"`` picks ``"log_loss"`` or ``"softmax_cross_entropy"``; optimizers,
    schedules and penalties are the engine's, with the parameters of
    :class:`~streamfit.models.linear.LinearRegressor`.

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
    """

    def __init__(self, *, loss: Any = "auto", optimizer: Any = "adam", learning_rate: Any = "constant",
                 eta0: float = 0.01, power_t: float = 0.25, alpha: float = 1e-4, l1_ratio: float = 0.15,
                 penalty: Any = "l2", momentum: float = 0.9, batch_size: int = 32, max_iter: int = 20,
                 shuffle: bool = True, random_state: Any = None, warm_start: bool = False,
                 standardize: bool = True, device: str = "cpu", step: str = "fused", on_nonfinite: str = "raise",
                 threads: int | None = None, inputs: Any = None) -> None:
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

    @property
    def coef_(self) -> np.ndarray:
        """Weights on the raw features (the scaler folded in), shape (1, features) for 2 classes, (classes,
        features) for more (scikit-learn's)."""
        return self._linear_in_raw_units()[0].T

    @property
    def intercept_(self) -> np.ndarray:
        """Intercepts, shape (1,) for 2 classes, (classes,) for more."""
        return self._linear_in_raw_units()[1]
