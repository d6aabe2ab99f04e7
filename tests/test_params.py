"""get_params of losses, optimizers and penalties: read from the constructor's signature, none written by hand."""

from __future__ import annotations

import inspect

import pytest

from streamfit import Penalty
from streamfit.losses import _BY_NAME as LOSSES, Huber
from streamfit.optim import _BY_NAME as OPTIMIZERS, Adam


@pytest.mark.parametrize("cls", [*LOSSES.values(), *OPTIMIZERS.values(), Penalty], ids=lambda c: c.__name__)
def test_params_are_the_constructor_arguments(cls: type) -> None:
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [p.name for p in inspect.signature(cls).parameters.values() if p.kind in named]
    obj = cls()
    assert list(obj.get_params()) == names
    assert cls(**obj.get_params()).get_params() == obj.get_params()
    assert "get_params" not in vars(cls)  # derived, not written again


def test_a_subclass_argument_is_a_parameter_without_get_params() -> None:
    class Warm(Adam):
        def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, warmup: int = 4) -> None:
            super().__init__(beta1, beta2, eps)
            self.warmup = warmup

    assert Warm(warmup=8).get_params() == {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "warmup": 8}
    assert repr(Warm(warmup=8)) == "Warm(beta1=0.9, beta2=0.999, eps=1e-08, warmup=8)"

    class Wide(Huber):
        def __init__(self, delta: float = 1.0, *, width: float = 2.0) -> None:
            super().__init__(delta)
            self.width = width

    assert Wide(width=3.0) != Wide(width=2.0) and Wide(width=3.0) == Wide(width=3.0)
    assert Wide(width=3.0).get_params() == {"delta": 1.0, "width": 3.0}
