"""OnnxClassifier: scikit-learn's classifier contract over any ONNX model that outputs logits."""

from __future__ import annotations

from typing import Any

import numpy as np

from streamfit._arrow import as_labels
from streamfit._engine.prepare.model import load_model
from streamfit.estimators._base import OnnxEstimator
from streamfit.estimators._docstrings import shared_parameters
from streamfit.estimators._cache import ATTRIBUTE as CACHE, caches
from streamfit.exceptions import BadInputError

try:
    from sklearn.base import ClassifierMixin as _Mixin
except ImportError:  # pragma: no cover
    class _Mixin:  # type: ignore[no-redef]
        predict: Any
        def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
            return float(np.average(self.predict(X) == as_labels(y), weights=sample_weight))

__all__ = ["OnnxClassifier"]


@shared_parameters(output_default="the first float output", sklearn="SGDClassifier",
                   loss='``"auto"`` (the rule above), or a loss name (``"log_loss"``, ``"softmax_cross_entropy"``,\n'
                        '``"hinge"``, ...) or a :class:`~streamfit.losses.Loss`.')
class OnnxClassifier(_Mixin, OnnxEstimator):
    """Trains an ONNX model whose output is class scores (logits) or probabilities, with scikit-learn's API.

    One output column means a binary model (``log_loss`` on the score of the second class); ``k``
    columns mean ``k`` classes (``softmax_cross_entropy``).  An output whose rows are probabilities
    (in [0, 1], summing to 1 on probe rows: a model ending in Softmax, as skl2onnx's classifiers do) is
    trained through them (``probability_log_loss``) and returned as is by :meth:`predict_proba`.
    ``loss="auto"`` picks accordingly; margin losses (``"hinge"``...) on ``k`` columns train one-vs-rest.
    ``output_name`` picks the output to train through; by default the first float output (a
    classifier's label output, first in skl2onnx's graphs, has no gradient).

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
    classes_
        The class labels, sorted (from ``classes=`` on the first ``partial_fit``, or ``y`` of ``fit``).
    binary_
        Whether the model has one output column (a binary model).
    loss_name_
        The loss trained with (the one ``loss="auto"`` picked).
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
    >>> X = np.random.default_rng(0).standard_normal((300, 2)).astype(np.float32)
    >>> y = np.where(X[:, 0] + X[:, 1] > 0, "pos", "neg")
    >>> clf = OnnxClassifier(linear_model(2), learning_rate="constant", eta0=0.5, max_iter=10).fit(X, y)
    >>> clf.classes_.tolist(), clf.score(X, y) > 0.95
    (['neg', 'pos'], True)
    """

    def __init__(self, model: Any = None, *, weights: Any = None, freeze: Any = None, inputs: Any = None,
                 input_name: str | None = None,
                 output_name: str | None = None, loss: Any = "auto", optimizer: Any = "sgd",
                 learning_rate: Any = "invscaling", eta0: float | str = 0.01, power_t: float = 0.25, alpha: float = 1e-4,
                 l1_ratio: float = 0.15, penalty: Any = "l2", momentum: float = 0.9, batch_size: int = 32,
                 max_iter: int = 5, shuffle: bool = False, random_state: Any = None, warm_start: bool = False,
                 device: str = "cpu", step: str = "fused", on_nonfinite: str = "raise",
                 threads: int | None = None, freeze_batchnorm: bool = False) -> None:
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

    # -- setup -------------------------------------------------------------------------------------
    def _trained_output(self, model: Any) -> str | None:
        name = getattr(self, "output_name", None)
        if name is not None or (model is None and self.model is None):
            return name
        outputs = load_model(self.model if model is None else model).graph.output
        if not outputs or _is_float(outputs[0]):
            return None
        for out in outputs:  # skl2onnx: (label, probabilities); a ZipMap'd one is made a tensor again
            if _is_float(out) or out.type.HasField("sequence_type"):
                return out.name
        return None

    def _start(self, X: np.ndarray, classes: Any) -> None:
        self._set_classes(np.unique(as_labels(classes)))
        if len(self.classes_) < 2:
            raise ValueError(f"a classifier needs at least 2 classes, got {len(self.classes_)} class: "
                             f"{self.classes_.tolist()}")
        self.output_kind_ = "scores"
        model, width = self._model_and_width(X)
        if width == 1 and len(self.classes_) != 2:
            raise ValueError(f"the model has one output column (binary) but {len(self.classes_)} classes were given")
        if width > 1 and width != len(self.classes_):
            raise ValueError(f"the model outputs {width} scores but {len(self.classes_)} classes were given")
        loss = self.loss
        if loss == "auto":
            loss = ("probability_log_loss" if self.output_kind_ == "probabilities" else
                    "log_loss" if width == 1 else "softmax_cross_entropy")
        self.trainer_ = self._make_trainer(loss, model)
        self.binary_ = width == 1
        self.loss_name_ = loss if isinstance(loss, str) else loss.name

    def _model_and_width(self, X: np.ndarray) -> tuple[Any, int]:
        """The model to train (``None``: the ``model`` parameter) and its number of output scores.

        A hook: the ready-made classifiers build their graph from ``classes_`` here.
        """
        probe = self._make_trainer("squared_error")  # only to read the output width and kind
        out = probe.predict(X[:1])
        try:  # probe rows far from the data too: logits leave [0, 1] there, probabilities never do
            rng = np.random.default_rng(0)
            extra = rng.standard_normal((8,) + X.shape[1:]).astype(X.dtype)
            out = np.concatenate([out, probe.predict(extra), probe.predict(extra * 10)])
        except Exception:  # a model that only takes rows like the data's: the first row decides alone
            pass
        width = int(np.prod(out.shape[1:]) or 1)
        if width > 1 and _rows_are_probabilities(out.reshape(len(out), width)):
            self.output_kind_ = "probabilities"
        return None, width

    def _check_labels(self, y: Any, n: int) -> np.ndarray:
        """Labels as a 1-D array of ``n`` rows (a hook: the ready-made classifiers apply scikit-learn's rules)."""
        y = as_labels(y).reshape(-1)
        if y.shape[0] != n:
            raise ValueError(f"got {n} rows of features but {y.shape[0]} labels")
        return y

    def _set_classes(self, classes: np.ndarray) -> None:
        self.classes_ = classes
        caches(self).classes_set()  # one-row labels encoded by the old classes are forgotten

    def _encode(self, y: np.ndarray) -> np.ndarray:
        """Checked labels -> class indices (the trainer's dtype for a binary model, int64 for softmax)."""
        if len(y) == 1:  # a batch of one row (a per-event stream): the encoded label is looked up
            held = self.__dict__.get(CACHE)
            cache = held.labels if held is not None else None
            if cache is not None:
                try:
                    label = y.item()
                    encoded = cache.get(label)
                except TypeError:  # an unhashable label
                    label = encoded = None
                if encoded is None:
                    encoded = self._encode_many(y)
                    if label is not None and len(cache) < 256:
                        encoded.flags.writeable = False
                        cache[label] = encoded
                return encoded
        return self._encode_many(y)

    def _encode_many(self, y: np.ndarray) -> np.ndarray:
        dtype = self.trainer_.dtype if self.binary_ else np.int64
        if y.dtype == np.bool_ and self.classes_.dtype == np.bool_ and len(self.classes_) == 2:
            return y.astype(dtype)  # classes [False, True]: a label is its own index, none unknown
        classes, k = self.classes_, len(self.classes_)
        if (y.dtype.kind in "iu" and classes.dtype.kind in "iu" and len(y) and classes[0] == 0 and classes[-1] == k - 1
                and y.min() >= 0 and y.max() < k):  # classes 0..k-1 (sorted, distinct): a label is its own index
            idx = y
        else:
            idx = np.searchsorted(classes, y)
            idx = np.clip(idx, 0, k - 1)
            unknown = classes[idx] != y
            if unknown.any():
                raise BadInputError(f"labels {np.unique(y[unknown]).tolist()[:5]} are not in classes_ "
                                    f"{classes.tolist()}", reason="unknown_class")
        if self.binary_:
            return idx.astype(dtype)
        if not self.trainer_.loss.integer_labels:  # a per-column loss (hinge...): one-vs-rest 0/1 targets
            return np.eye(len(self.classes_), dtype=self.trainer_.dtype)[idx]
        return idx.astype(dtype)

    def _first_call(self, X: Any, classes: Any, first: bool) -> None:
        if first:
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            self._start(X, classes)
        elif classes is not None and not np.array_equal(np.unique(as_labels(classes)), self.classes_):
            raise ValueError(f"classes={np.unique(as_labels(classes)).tolist()} differs from the classes of the "
                             f"first partial_fit call {self.classes_.tolist()}")

    # -- fitting -----------------------------------------------------------------------------------
    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> "OnnxClassifier":
        """Train on ``X`` (``ceil(n / batch_size)`` steps in one session run); the first call needs ``classes``.

        Parameters
        ----------
        X
            The rows: an ndarray ``(n, features)`` (a one-input model), a mapping {input name: array}, or,
            with ``inputs=``, an Arrow Table/RecordBatch or a dict of columns.
        y
            The ``n`` labels (any values of ``classes``).
        classes
            Every label the stream may hold, on the first call (later calls may repeat it); a label
            outside them is an error.
        sample_weight
            Row weights (``n`` values), or None for 1 each.
        """
        first = not hasattr(self, "trainer_")
        X = self._check_X(X, reset=first)
        labels = self._check_labels(y, len(X))
        sw = self._sample_weight(sample_weight, len(X))
        self._first_call(X, classes, first)
        T = self._encode(labels)  # before the feature statistics take the batch: an unknown label leaves no trace
        self._partial_pass(X, T, sw, first)
        return self

    def partial_fit_predict(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> np.ndarray:
        """:meth:`partial_fit`, returning each row's class probabilities computed just before training on it.

        Parameters
        ----------
        X
            The rows: an ndarray ``(n, features)`` (a one-input model), a mapping {input name: array}, or,
            with ``inputs=``, an Arrow Table/RecordBatch or a dict of columns.
        y, classes, sample_weight
            As for :meth:`partial_fit`.
        """
        first = not hasattr(self, "trainer_")
        X = self._check_X(X, reset=first)
        labels = self._check_labels(y, len(X))
        sw = self._sample_weight(sample_weight, len(X))
        self._first_call(X, classes, first)
        T = self._encode(labels)
        width = 1 if self.binary_ else len(self.classes_)
        scores = np.empty((len(X), width), self.trainer_.dtype)
        self._partial_pass(X, T, sw, first, scores)
        return self._proba(scores.reshape(len(X)) if self.binary_ else scores)

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> "OnnxClassifier":
        """``max_iter`` epochs over ``X``; classes are taken from ``y``.

        Parameters
        ----------
        X
            The rows: an ndarray ``(n, features)`` (a one-input model), a mapping {input name: array}, or,
            with ``inputs=``, an Arrow Table/RecordBatch or a dict of columns.
        y
            The ``n`` labels; their sorted distinct values are ``classes_``.
        sample_weight
            Row weights (``n`` values), or None for 1 each.
        """
        X = self._check_X(X, reset=True)
        labels = self._check_labels(y, len(X))
        sw = self._sample_weight(sample_weight, len(X), all_zero_ok=False)
        first = not (self.warm_start and hasattr(self, "trainer_"))
        if first:
            self._start(X, labels)
        T = self._encode(labels)
        X = self._fit_inputs(X, sw, first)
        rng = np.random.default_rng(self.random_state)
        self.loss_curve_ = []
        for _ in range(self.max_iter):
            order = rng.permutation(len(X)) if self.shuffle else np.arange(len(X))
            self.loss_curve_.append(self._one_pass(X[order], T[order], None if sw is None else sw[order]))
        self.n_iter_ = self.max_iter
        return self

    # -- prediction --------------------------------------------------------------------------------
    def decision_function(self, X: Any) -> np.ndarray:
        """The model's scores of each row of ``X`` (shape ``(n,)`` for a binary model).

        Parameters
        ----------
        X
            As for :meth:`partial_fit`.
        """
        return self._scores(X, copy=True)

    def _scores(self, X: Any, copy: bool) -> np.ndarray:
        """Scores of ``X``; ``copy=False`` may return a reused buffer (valid until the next prediction)."""
        self._require_fitted()
        out = self.trainer_._predict(self._inputs(self._check_X(X, reset=False, learn=False)), copy)
        return out.reshape(len(out)) if self.binary_ else out.reshape(len(out), -1)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities of each row of ``X``, columns in the order of ``classes_``.

        Parameters
        ----------
        X
            As for :meth:`partial_fit`.
        """
        return self._proba(self.decision_function(X))

    def _proba(self, scores: np.ndarray) -> np.ndarray:
        scores = scores.astype(np.float64)
        if getattr(self, "output_kind_", "scores") == "probabilities":
            return scores
        if self.binary_:  # 1 / (1 + exp(-s)) in place, the two columns written once
            p = scores.reshape(-1)
            np.negative(p, out=p)
            np.exp(p, out=p)
            p += 1.0
            np.divide(1.0, p, out=p)
            out = np.empty((len(p), 2))
            np.subtract(1.0, p, out=out[:, 0])
            out[:, 1] = p
            return out
        if getattr(self, "loss_name_", None) == "log_loss":  # one-vs-rest logistic columns, as scikit-learn's
            p = 1.0 / (1.0 + np.exp(-scores))
            return p / p.sum(axis=1, keepdims=True)
        scores = scores - scores.max(axis=1, keepdims=True)
        e = np.exp(scores)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """The most likely class of each row of ``X``.

        Parameters
        ----------
        X
            As for :meth:`partial_fit`.
        """
        if hasattr(self, "trainer_") and self.binary_:
            out = self.trainer_._predict(self._inputs(self._check_X(X, reset=False, learn=False)), False)
            if out.size == 1:  # one row (a per-event stream): no array arithmetic
                return self.classes_[1:2].copy() if out.item(0) > 0 else self.classes_[:1].copy()
            return self.classes_[(out.reshape(len(out)) > 0).astype(np.int64)]
        scores = self._scores(X, copy=False)  # raises NotFittedError before fit
        return self.classes_[scores.argmax(axis=1)]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(classes_=self.classes_, binary_=self.binary_, loss_name_=self.loss_name_,
                     output_kind_=getattr(self, "output_kind_", "scores"))
        return state

    def _restore_trainer(self, state: Any) -> None:
        self._set_classes(np.asarray(state["classes_"]))
        self.binary_ = bool(state["binary_"])
        self.loss_name_ = str(state["loss_name_"])
        self.output_kind_ = str(state.get("output_kind_", "scores"))
        self.trainer_ = self._make_trainer(self.loss_name_)

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        self._set_classes(np.asarray(state["classes_"]))


def _is_float(value_info: Any) -> bool:
    return value_info.type.HasField("tensor_type") and value_info.type.tensor_type.elem_type in (1, 11)


def _rows_are_probabilities(out: np.ndarray) -> bool:
    """Every row in [0, 1] and summing to 1 (float32 rounding allowed)."""
    return bool(np.isfinite(out).all() and out.min() >= -1e-6 and out.max() <= 1 + 1e-6
                and np.abs(out.sum(axis=1) - 1.0).max() < 1e-4)
