"""The run's column plan as state: :class:`ColumnLayout`, fixed by the first valid record batch (or given),
saved in checkpoints and enforced on resume, so a message with extra or reordered columns never changes what
the model is fed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from streamfit._columns.schema import canonical_json

__all__ = ["ColumnLayout"]


@dataclass(frozen=True)
class ColumnLayout:
    """The run's column plan as state: which columns feed ``X`` in which order, and the label/weight/dtype.

    Fixed by the first valid record batch (or given), saved in checkpoints (:meth:`to_json`) and
    enforced on resume (:meth:`check_matches`), so later messages are read by name into the same layout.

    >>> layout = ColumnLayout(("x0", "emb"), (1, 4), "y", None, "float32", "regression")
    >>> ColumnLayout.from_json(layout.to_json()) == layout, layout.n_features
    (True, 5)
    """

    features: tuple[str, ...]
    widths: tuple[int, ...]
    label: "str | tuple[str, ...]"
    weight: str | None
    dtype: str
    task: str
    #: with named model inputs: (input name, what feeds it as canonical JSON) in model order; checkpoints
    #: hold the JSON objects (``{"columns": [...]}``, ``{"encoder": "Hashed", "columns": [...], ...}``).
    #: Checkpoints written before held ``repr`` strings: such an entry is kept as that string (legacy).
    inputs: tuple[tuple[str, str], ...] = ()

    @property
    def n_features(self) -> int:
        return sum(self.widths)

    def __eq__(self, other: object) -> bool:  # the inputs mapping compares as a mapping (JSON may reorder it)
        if not isinstance(other, ColumnLayout):
            return NotImplemented
        return (self.features, self.widths, self.label, self.weight, self.dtype, self.task, dict(self.inputs)) == (
            other.features, other.widths, other.label, other.weight, other.dtype, other.task, dict(other.inputs))

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features), "widths": list(self.widths),
                "label": self.label if isinstance(self.label, str) else list(self.label),
                "weight": self.weight, "dtype": self.dtype, "task": self.task,
                **({"inputs": {k: v if _legacy(v) else json.loads(v) for k, v in self.inputs}} if self.inputs else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ColumnLayout":
        """Parse :meth:`to_json` output; ``ValueError`` naming the field that is malformed."""
        try:
            if not isinstance(data["features"], list) or not isinstance(data["widths"], list):
                raise TypeError("features and widths must be lists")
            features = tuple(data["features"])
            widths = tuple(data["widths"])
            label = data["label"]
            if isinstance(label, list) and label and all(isinstance(v, str) for v in label):
                label = tuple(label)
            inputs = data.get("inputs") or {}
            if not isinstance(inputs, dict) or not all(isinstance(v, (str, dict)) for v in inputs.values()):
                raise TypeError("inputs must map input names to what feeds them")
            if not all(isinstance(v, str) or isinstance(v.get("columns"), list) or isinstance(v.get("column"), str)
                       for v in inputs.values()):
                raise TypeError("an input's source names no columns")
            layout = cls(features, widths, label, data.get("weight"), data["dtype"], data["task"],
                         tuple((str(k), v if isinstance(v, str) else canonical_json(v)) for k, v in inputs.items()))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed column layout {dict(data)!r}: {exc!r}") from None
        if (len(features) != len(widths) or not all(isinstance(f, str) for f in features)
                or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths)
                or not isinstance(layout.label, (str, tuple)) or not (layout.weight is None or isinstance(layout.weight, str))
                or layout.dtype not in ("float32", "float64") or layout.task not in ("regression", "classification")):
            raise ValueError(f"malformed column layout {dict(data)!r}")
        return layout

    def check_matches(self, *, features: Sequence[str] | None, label: "str | Sequence[str]", weight: str | None,
                      dtype: str, task: str, what: str = "the saved column plan",
                      inputs: "Sequence[tuple[str, str, str]] | None" = None) -> None:
        """``ValueError`` naming every difference between this layout and a configuration.

        ``inputs``: the configured mapping as (input name, canonical JSON, legacy ``repr``) triples (a layout
        read from an older checkpoint compares its ``repr`` strings)."""
        diffs = []
        if inputs is not None and self.inputs:
            given = {name: legacy if _legacy(dict(self.inputs).get(name, "{")) else spec
                     for name, spec, legacy in inputs}
            if given != dict(self.inputs):
                diffs.append(f"inputs {dict(self.inputs)} (configured: {given})")
        label = label if isinstance(label, str) else tuple(label)
        if features is not None and tuple(features) != self.features:
            diffs.append(f"features {list(self.features)} (configured: {list(features)})")
        for name, mine, configured in (("label", self.label, label), ("weight", self.weight, weight),
                                       ("dtype", self.dtype, dtype), ("task", self.task, task)):
            if mine != configured:
                diffs.append(f"{name} {mine!r} (configured: {configured!r})")
        if diffs:
            raise ValueError(f"{what} has " + "; ".join(diffs)
                             + ": a run keeps its columns (configure the same ones, or start a new run)")



def _legacy(spec: str) -> bool:
    """A mapping entry saved as a ``repr`` string (checkpoints before the typed form) rather than JSON."""
    return not spec.startswith("{")
