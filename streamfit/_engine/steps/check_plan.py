"""What the fused step checks itself: the handoff from the graph builder to the step that runs the graph.

The small-batch fused SGD graph leaves part of its finiteness check to the step (see
:func:`~streamfit._engine.steps.step_graphs.emit_sgd_folded`): large weights are proven finite by a magnitude bound,
single-element weights are read by the host.  The graph carries that plan in its ONNX metadata
(``Names.check_plan_key``) as canonical, versioned JSON, so a saved training graph says what its runner
must check; :meth:`CheckPlan.from_json` refuses what it does not understand rather than check less.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import onnx

from streamfit._engine.common.names import Names
from streamfit.exceptions import ModelError

__all__ = ["CheckPlan"]


@dataclass(frozen=True)
class CheckPlan:
    """The checks a fused graph leaves to the step that runs it (empty: the graph checks everything).

    ``bounded``: weights whose new values the step proves finite by a bound on their magnitude, from the
    sums of squares of their gradient Gemms' operands (graph outputs ``sf_bound0_<i>``/``sf_bound1_<i>``),
    and checks exactly when the bound proves nothing; ``alpha``: the largest ``|alpha|`` of those Gemms.
    ``host``: single-element weights whose new value the step reads itself.

    >>> plan = CheckPlan(bounded=("W1",), alpha=0.5, host=("b",))
    >>> plan.to_json()
    '{"alpha":0.5,"bounded":["W1"],"host":["b"],"version":1}'
    >>> CheckPlan.from_json(plan.to_json()) == plan
    True
    >>> bool(CheckPlan())
    False
    """

    bounded: tuple[str, ...] = ()
    alpha: float = 1.0
    host: tuple[str, ...] = ()

    #: the format written by :meth:`to_json`; :meth:`from_json` reads this one only
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        for field_name in ("bounded", "host"):
            names = getattr(self, field_name)
            if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
                raise TypeError(f"CheckPlan.{field_name} must be a tuple of weight names, got {names!r}")
            if len(set(names)) != len(names):
                raise ValueError(f"CheckPlan.{field_name} names a weight twice: {list(names)}")
        both = set(self.bounded) & set(self.host)
        if both:
            raise ValueError(f"CheckPlan: weights {sorted(both)} are both bounded and host-read")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) \
                or not math.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(f"CheckPlan.alpha must be a finite number >= 0, got {self.alpha!r}")
        object.__setattr__(self, "alpha", float(self.alpha))

    def __bool__(self) -> bool:
        return bool(self.bounded or self.host)

    # -- canonical JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, with the format version."""
        return {"version": self.VERSION, "bounded": list(self.bounded), "alpha": self.alpha,
                "host": list(self.host)}

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces, so equal plans are equal strings."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any) -> "CheckPlan":
        """The plan :meth:`to_dict` wrote; a clear :class:`~streamfit.exceptions.ModelError` otherwise."""
        if not isinstance(data, dict):
            raise ModelError(f"check plan: expected a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if version != cls.VERSION:
            newer = isinstance(version, int) and not isinstance(version, bool) and version > cls.VERSION
            raise ModelError(f"check plan: format version {version!r}, this streamfit reads version {cls.VERSION}"
                             + (" (written by a newer streamfit)" if newer else ""))
        expected = {"version", "bounded", "alpha", "host"}
        if set(data) != expected:
            raise ModelError(f"check plan: keys {sorted(data)}, expected {sorted(expected)}")
        for key in ("bounded", "host"):
            if not isinstance(data[key], list) or not all(isinstance(n, str) for n in data[key]):
                raise ModelError(f"check plan: {key!r} must be a list of weight names, got {data[key]!r}")
        try:
            return cls(bounded=tuple(data["bounded"]), alpha=data["alpha"], host=tuple(data["host"]))
        except (TypeError, ValueError) as exc:
            raise ModelError(f"check plan: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> "CheckPlan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelError(f"check plan: not JSON ({exc})") from exc
        return cls.from_dict(data)

    # -- in a graph's metadata -----------------------------------------------------------------------
    def attach(self, model: onnx.ModelProto) -> None:
        """Write the plan into ``model``'s metadata (replacing any); an empty plan removes the entry."""
        kept = [p for p in model.metadata_props if p.key != Names.check_plan_key]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        if self:
            model.metadata_props.append(onnx.StringStringEntryProto(key=Names.check_plan_key, value=self.to_json()))

    @classmethod
    def of(cls, model: onnx.ModelProto) -> "CheckPlan":
        """The plan in ``model``'s metadata; the empty plan when there is none."""
        for prop in model.metadata_props:
            if prop.key == Names.check_plan_key:
                return cls.from_json(prop.value)
        return cls()
