"""MLPRegressor / MLPClassifier: online multilayer perceptrons whose ONNX graph is built from the data."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfit.models._base import ReadyClassifier, ReadyRegressor, random_generator
from streamfit.models._graphs import ACTIVATIONS

__all__ = ["MLPRegressor", "MLPClassifier", "glorot_layers"]


def glorot_layers(sizes: list[int], activation: str, random_state: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's MLP initialization: uniform in +-sqrt(6 / (fan_in + fan_out)) (2 for logistic).

    Drawn in scikit-learn's order (coef then intercept, layer by layer), so an int ``random_state``
    gives the initial weights scikit-learn's ``MLPRegressor`` starts from.
    """
    rng = random_generator(random_state)
    factor = 2.0 if activation == "logistic" else 6.0
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = np.sqrt(factor / (fan_in + fan_out))
        coef = rng.uniform(-bound, bound, (fan_in, fan_out))
        layers.append((coef.astype(np.float32), rng.uniform(-bound, bound, fan_out).astype(np.float32)))
    return layers


class _MLP:
    """The hidden layers of both perceptrons."""

    hidden_layer_sizes: Any
    activation: str
    random_state: Any

    def _hidden_sizes(self) -> tuple[int, ...]:
        sizes = self.hidden_layer_sizes
        sizes = tuple(sizes) if hasattr(sizes, "__iter__") else (sizes,)
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"hidden_layer_sizes must be positive integers, got {self.hidden_layer_sizes!r}")
        return tuple(int(s) for s in sizes)

    def _activation(self) -> str:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; expected one of {sorted(ACTIVATIONS)}")
        return self.activation

    def _auto_eta0(self) -> float:
        """``eta0="auto"``: Adam (and AdamW) at 0.001 (scikit-learn's ``learning_rate_init``: hidden layers take
        smaller steps than a linear model's 0.01); other optimizers at their own rate."""
        from streamfit.optim import Adam

        opt = self._optimizer()  # type: ignore[attr-defined]
        return 0.001 if isinstance(opt, Adam) else float(opt.auto_eta0())

    def _initial_layers(self, n_in: int, n_out: int) -> list[tuple[np.ndarray, np.ndarray]]:
        return glorot_layers([n_in, *self._hidden_sizes(), n_out], self._activation(), self.random_state)

    @property
    def coefs_(self) -> list[np.ndarray]:
        """Weight matrices, layer by layer, shape (fan_in, fan_out) (scikit-learn's layout)."""
        return [c for c, _ in self._layers()]  # type: ignore[attr-defined]

    @property
    def intercepts_(self) -> list[np.ndarray]:
        """Bias vectors, layer by layer."""
        return [b for _, b in self._layers()]  # type: ignore[attr-defined]


_PARAMS_DOC = """
    ``hidden_layer_sizes`` and ``activation`` mean what they mean in scikit-learn; initial weights are
    Glorot-uniform from ``random_state``.  ``coefs_``/``intercepts_`` are the trained weights, which act on
    standardized features (and give standardized targets), as in a scikit-learn pipeline.

    Parameters
    ----------
    hidden_layer_sizes
        Units of each hidden layer (an int for one layer).
    activation
        The hidden layers' activation: ``"relu"``, ``"tanh"``, ``"logistic"`` or ``"identity"``.
    loss
        An engine loss name or :class:`~streamfit.losses.Loss` (the classifier's ``"auto"``: ``"log_loss"``
        for 2 classes, ``"softmax_cross_entropy"`` for more).
    optimizer, learning_rate, power_t, alpha, l1_ratio, penalty, momentum
        As for :class:`~streamfit.models.linear.LinearRegressor` (engine optimizers, schedules, penalties).
    eta0
        The rate (scikit-learn's ``learning_rate_init``); ``"auto"``: 0.001 for Adam and AdamW (the default
        optimizer), the optimizer's own starting rate for the others.
    batch_size, max_iter, shuffle, random_state, warm_start
        Rows per training step; epochs of ``fit``; shuffling between epochs (seeded by ``random_state``,
        which also draws the initial weights); whether ``fit`` continues from the current weights.
    standardize
        Train on features standardized by a running mean and variance; :meth:`to_onnx` exports a model
        that scales its inputs.
    device, step, on_nonfinite, threads
        As for :class:`~streamfit.Trainer`.
    inputs
        The feature input ``"X"`` from Arrow columns, as for :class:`~streamfit.models.linear.LinearRegressor`.
"""


class MLPRegressor(_MLP, ReadyRegressor):
    __doc__ = """A multilayer perceptron regressor trained online; its graph is built on the first call.
""" + _PARAMS_DOC + """    standardize_target
        Train on standardized targets and map predictions back (as for
        :class:`~streamfit.models.linear.LinearRegressor`).

    Attributes
    ----------
    coefs_, intercepts_
        Weight matrices (fan_in, fan_out) and bias vectors, layer by layer.
    n_features_in_, t_, loss_
        Features per row; training steps applied; the mean training loss of the last call.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit import MLPRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-2, 2, (1000, 1))
    >>> reg = MLPRegressor(hidden_layer_sizes=(32,), activation="tanh", eta0=0.01, max_iter=100,
    ...                    random_state=0).fit(X, np.sin(2 * X[:, 0]))
    >>> reg.score(X, np.sin(2 * X[:, 0])) > 0.95
    True
    """

    def __init__(self, hidden_layer_sizes: Any = (100,), activation: str = "relu", *, loss: Any = "squared_error",
                 optimizer: Any = "adam", learning_rate: Any = "constant", eta0: float | str = "auto",
                 power_t: float = 0.5, alpha: float = 1e-4, l1_ratio: float = 0.15, penalty: Any = "l2",
                 momentum: float = 0.9, batch_size: int = 32, max_iter: int = 50, shuffle: bool = True,
                 random_state: Any = None, warm_start: bool = False, standardize: bool = True,
                 standardize_target: bool = True, device: str = "cpu", step: str = "fused",
                 on_nonfinite: str = "raise", threads: int | None = None, inputs: Any = None) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
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


class MLPClassifier(_MLP, ReadyClassifier):
    __doc__ = """A multilayer perceptron classifier trained online: one logistic output for 2 classes, softmax for more.
""" + _PARAMS_DOC + """
    Attributes
    ----------
    classes_
        The class labels, sorted.
    coefs_, intercepts_
        Weight matrices (fan_in, fan_out) and bias vectors, layer by layer.
    n_features_in_, t_, loss_
        Features per row; training steps applied; the mean training loss of the last call.

    Examples
    --------
    >>> import numpy as np
    >>> from streamfit import MLPClassifier
    >>> rng = np.random.default_rng(0)
    >>> clf = MLPClassifier(hidden_layer_sizes=(16,), eta0=0.01, random_state=0)
    >>> for _ in range(100):                   # XOR of the signs: not linearly separable
    ...     X = rng.standard_normal((32, 2))
    ...     _ = clf.partial_fit(X, (X[:, 0] * X[:, 1] > 0).astype(int), classes=[0, 1])
    >>> X = rng.standard_normal((500, 2))
    >>> clf.score(X, (X[:, 0] * X[:, 1] > 0).astype(int)) > 0.9
    True
    """

    def __init__(self, hidden_layer_sizes: Any = (100,), activation: str = "relu", *, loss: Any = "auto",
                 optimizer: Any = "adam", learning_rate: Any = "constant", eta0: float | str = "auto",
                 power_t: float = 0.5, alpha: float = 1e-4, l1_ratio: float = 0.15, penalty: Any = "l2",
                 momentum: float = 0.9, batch_size: int = 32, max_iter: int = 50, shuffle: bool = True,
                 random_state: Any = None, warm_start: bool = False, standardize: bool = True,
                 device: str = "cpu", step: str = "fused", on_nonfinite: str = "raise",
                 threads: int | None = None, inputs: Any = None) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
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
