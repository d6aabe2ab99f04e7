"""The ``Parameters`` text OnnxRegressor and OnnxClassifier share, written once and filled into both docstrings.

A class's docstring holds the line ``{PLACEHOLDER}`` where the shared entries go; :func:`shared_parameters`
replaces it at import with :data:`PARAMETERS`, formatted with what differs (the output's default, the loss,
the scikit-learn estimator the penalty follows).  ``help()``, doctest and the model options of the CLI read
the filled ``__doc__``; the API reference too (``docs/_griffe_roles.py`` renders the runtime docstring of an
object whose source docstring differs from it).
"""

from __future__ import annotations

import textwrap
from typing import Callable, TypeVar

__all__ = ["PARAMETERS", "PLACEHOLDER", "shared_parameters"]

PLACEHOLDER = "{onnx estimator parameters}"

PARAMETERS = """\
model
    The ONNX model: a path, bytes or an ``onnx.ModelProto`` (as for :class:`~streamfit.Trainer`).
weights
    Names of the initializers to train; default: every float parameter.
freeze
    Names of initializers kept out of the trained set (frozen at their initial values).
inputs
    Model input names mapped to Arrow columns (a column name, a list of them, or an encoder of
    :mod:`streamfit.features`); ``X`` may then be an Arrow Table/RecordBatch or a dict of columns.
input_name
    The model input an ndarray ``X`` feeds (default: the first).
output_name
    The output to train through (default: {output_default}).
loss
    {loss}
optimizer
    An optimizer name (``"sgd"``, ``"adam"``, ``"momentum"``, ``"nesterov"``, ``"adagrad"``, ``"adamw"``,
    ``"ftrl"``, ...) or a :class:`~streamfit.optim.Optimizer` instance.
learning_rate
    A schedule name (``"constant"``, ``"invscaling"``, ``"optimal"``, ``"adaptive"``), a float (a
    constant rate) or a :class:`~streamfit.schedules.Schedule`.
eta0
    The starting rate of ``"constant"``, ``"invscaling"`` and ``"adaptive"``; ``"auto"``: the optimizer's
    own starting rate (:meth:`~streamfit.optim.Optimizer.auto_eta0`).
power_t
    The exponent of ``"invscaling"`` (``eta0 / t ** power_t``).
alpha, l1_ratio, penalty
    The penalty's strength, its L1 share for ``"elasticnet"`` and its kind (``"l2"``, ``"l1"``,
    ``"elasticnet"``, None or a :class:`~streamfit.penalties.Penalty`), as in ``{sklearn}``; ``alpha`` also
    sets ``"optimal"``'s rate.
momentum
    The momentum of ``optimizer="momentum"`` and ``"nesterov"`` (ignored by the others).
batch_size
    Rows per training step (``partial_fit`` and ``fit`` go through ``X`` in minibatches of this size).
max_iter
    Epochs of :meth:`fit`.
shuffle, random_state
    Shuffle the rows between the epochs of :meth:`fit`, seeded by ``random_state`` (an int also seeds
    the Dropout masks).
warm_start
    Whether :meth:`fit` continues from the current weights instead of the model's initial ones.
device, step, on_nonfinite, threads, freeze_batchnorm
    As for :class:`~streamfit.Trainer`.
"""

T = TypeVar("T", bound=type)


def shared_parameters(*, output_default: str, loss: str, sklearn: str) -> Callable[[T], T]:
    """A class decorator: put :data:`PARAMETERS` (formatted with these) where the docstring has
    :data:`PLACEHOLDER`, indented as the placeholder line is; a docstring without it raises (a typo would
    otherwise drop the section silently)."""

    def fill(cls: T) -> T:
        doc = cls.__doc__ or ""
        line = next((line for line in doc.splitlines() if line.strip() == PLACEHOLDER), None)
        if line is None:
            raise ValueError(f"{cls.__name__}'s docstring has no line {PLACEHOLDER!r}")
        indent = line[: len(line) - len(line.lstrip())]
        text = PARAMETERS.format(output_default=output_default, loss=loss.replace("\n", "\n    "),
                                 sklearn=sklearn)
        cls.__doc__ = doc.replace(line + "\n", textwrap.indent(text, indent), 1)
        return cls

    return fill
