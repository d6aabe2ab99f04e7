"""A batch's model inputs: ``X`` (an ndarray or a mapping by input name) checked against what the model declares.

The engine checks a batch once per *signature* (the shapes and dtypes of its arrays): names, element
kinds, ranks, fixed dims and row counts.  A signature seen before is trusted, so the step of a batch
shape seen before does no checking at all.  Every mismatch is an
:class:`~streamfit.exceptions.InputMismatchError` naming the input and what the model expects.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from streamfit._engine.prepare.model import ModelInput
from streamfit.exceptions import BadInputError, InputMismatchError, ModelError

__all__ = ["InputSignature", "NamedRows", "accepts", "check_mapping"]

#: numpy dtype kinds an input of each declared kind accepts (copying into the declared type is exact or
#: a change of float precision; floats never go into integer inputs, numbers never into bool ones)
_ACCEPTS = {"f": "fiub", "i": "iub", "u": "iub", "b": "b"}


def accepts(declared: np.dtype, given: np.dtype) -> bool:
    """Whether data of dtype ``given`` may be fed to an input declared ``declared``."""
    return given.kind in _ACCEPTS.get(declared.kind, "")


class NamedRows:
    """Rows of several named arrays, sliced together: ``len()`` is the number of rows, ``rows[sl]`` (a slice
    or an index array) the same rows of every array.  The estimators carry a dict ``X`` in this form so
    that minibatching and shuffling treat it as they treat an ndarray.

    >>> rows = NamedRows({"x": np.zeros((4, 2)), "ids": np.arange(4)})
    >>> len(rows), rows[1:3].arrays["ids"].tolist()
    (4, [1, 2])
    """

    __slots__ = ("arrays", "_n")

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = {k: v if type(v) is np.ndarray else np.asarray(v) for k, v in arrays.items()}
        self._n = next((len(a) for a in self.arrays.values() if a.ndim), 0)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, rows: Any) -> "NamedRows":
        return NamedRows({k: a[rows] if a.ndim else a for k, a in self.arrays.items()})

    def __repr__(self) -> str:
        return f"NamedRows({', '.join(f'{k}: {a.dtype}{list(a.shape)}' for k, a in self.arrays.items())})"


class InputSignature:
    """What the model's non-weight inputs take: their names in order, the one an ndarray ``X`` feeds
    (``default``), and the check of a batch's arrays against their declared dtypes and shapes."""

    def __init__(self, inputs: tuple[ModelInput, ...], default: str) -> None:
        self.inputs = inputs
        self.names = tuple(i.name for i in inputs)
        self.default = default
        self.single = len(inputs) == 1
        self._index = {n: k for k, n in enumerate(self.names)}
        #: inputs whose declared batch dim is a fixed number (an export with a static batch)
        self.fixed_batch = any(i.rank and isinstance(i.shape[0], int) and i.shape[0] > 0 for i in inputs)

    def arrays(self, X: Any) -> tuple[np.ndarray, ...]:
        """``X`` as one array per model input, in model order (not yet checked: see :meth:`check`)."""
        if type(X) is NamedRows:
            X = X.arrays
        if type(X) is dict or isinstance(X, Mapping):  # a dict first: the ABC check costs a step of one row
            unknown = [k for k in X if k not in self._index]
            if unknown:
                raise InputMismatchError(f"X names {unknown}, which are not inputs of the model; its inputs are "
                                         f"{self._described()}", input=str(unknown[0]))
            missing = [n for n in self.names if n not in X]
            if missing:
                raise InputMismatchError(f"X has no array for the model input(s) {missing}; the model's inputs are "
                                         f"{self._described()}", input=missing[0])
            return tuple(X[n] if type(X[n]) is np.ndarray else np.asarray(X[n]) for n in self.names)
        if not self.single:
            raise InputMismatchError(f"the model has {len(self.inputs)} inputs {self._described()}: pass X as a "
                                     "dict {input name: array}", input=self.names[0])
        return (X if type(X) is np.ndarray else np.asarray(X),)

    def _described(self) -> str:
        return ", ".join(i.describe() for i in self.inputs)

    def signature(self, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        """What :meth:`check` depends on: the shape and dtype kind of every array."""
        if len(arrays) == 1:
            return (arrays[0].shape, arrays[0].dtype.kind)
        return tuple((a.shape, a.dtype.kind) for a in arrays)

    def check(self, arrays: tuple[np.ndarray, ...]) -> int:
        """Raise a clear error unless ``arrays`` fit the declared inputs; return the number of rows."""
        rows: int | None = None
        first = ""
        for spec, a in zip(self.inputs, arrays):
            if not accepts(spec.dtype, a.dtype):
                raise InputMismatchError(f"input {spec.describe()} got {a.dtype} data; expected {_kinds(spec.dtype)}",
                                         input=spec.name)
            if spec.shape:  # () : no declared shape (or a scalar input), any rank is taken
                if a.ndim != spec.rank:
                    raise InputMismatchError(f"input {spec.describe()} got an array of rank {a.ndim} (shape "
                                             f"{list(a.shape)}); expected rank {spec.rank}", input=spec.name)
                for axis, (dim, size) in enumerate(zip(spec.shape, a.shape)):
                    if isinstance(dim, int) and dim > 0 and size != dim:
                        where = "the batch dim (the model was exported for that batch size)" if axis == 0 \
                            else f"dim {axis}"
                        raise InputMismatchError(f"input {spec.describe()} got shape {list(a.shape)}; {where} must "
                                                 f"be {dim}", input=spec.name)
            if a.ndim == 0:
                continue
            if a.shape[0] == 0:
                raise BadInputError(f"input {spec.name!r}: expected a non-empty batch of rows, got shape "
                                    f"{a.shape}", reason="empty_batch", column=spec.name)
            if rows is None:
                rows, first = a.shape[0], spec.name
            elif a.shape[0] != rows:
                raise InputMismatchError(f"input {spec.name!r} has {a.shape[0]} rows but input {first!r} has {rows}",
                                         input=spec.name)
        if rows is None:
            raise BadInputError("expected a non-empty batch of rows, got scalar inputs only", reason="empty_batch")
        return rows


def _kinds(dtype: np.dtype) -> str:
    return {"f": f"{dtype} (real numbers are cast to it)", "i": f"{dtype} (integers or bool)",
            "u": f"{dtype} (integers or bool)", "b": "bool"}.get(dtype.kind, str(dtype))


def check_mapping(inputs: Any, model_inputs: tuple[ModelInput, ...]) -> None:
    """Check an ``inputs=`` mapping against the model when an estimator is built: every key a model input,
    every value a column name, a non-empty list of column names, or an encoder object.

    What the columns hold (types, widths) is checked by the column plan against each schema.

    >>> check_mapping({"idz": "user"}, (ModelInput("ids", np.dtype(np.int64), ("N",)),))
    Traceback (most recent call last):
    ...
    streamfit.exceptions.ModelError: inputs= maps 'idz', which is not an input of the model; its inputs are 'ids' (int64, shape [N])
    """
    if inputs is None:
        return
    if not isinstance(inputs, Mapping):
        raise ModelError(f"inputs= must map model input names to columns, got {type(inputs).__name__}")
    names = {i.name for i in model_inputs}
    for key, value in inputs.items():
        if key not in names:
            raise ModelError(f"inputs= maps {key!r}, which is not an input of the model; its inputs are "
                             + ", ".join(i.describe() for i in model_inputs))
        if isinstance(value, (list, tuple)):
            if not value or not all(isinstance(v, str) for v in value):
                raise ModelError(f"inputs={{{key!r}: {value!r}}}: a list must hold one or more column names")
        elif value is None or isinstance(value, (bytes, int, float, np.ndarray)):
            raise ModelError(f"inputs={{{key!r}: {value!r}}}: expected a column name, a list of column names "
                             "or an encoder")
