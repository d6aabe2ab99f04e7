"""The estimator a run trains, written once: :class:`ModelOptions`, derived from the estimator classes.

``streamfit train|serve`` train an ONNX file (``OnnxRegressor``/``OnnxClassifier``) or one of the ready-made
models (``LinearRegressor``, ``LogisticRegression`` -- hashed with ``categorical=`` --, ``FMRegressor``,
``FMClassifier``, ``MLPRegressor``, ``MLPClassifier``).  Their options are not a list kept here: every
constructor parameter of those classes is an option (its name a TOML key and ``--flag``, its type from the
annotation, its help from the class's numpydoc ``Parameters``), and every constructor parameter of the
optimizers of :mod:`streamfit.optim` is an option named ``<optimizer>_<parameter>`` (``ftrl_l1``,
``adam_beta1``).  A parameter the run owns elsewhere (``batch_size``, ``inputs``: the stream's options;
``on_nonfinite``: the divergence guard; ``max_iter``, ``shuffle``, ``warm_start``: ``fit``'s epochs, which a
stream never runs) is not one.  An unknown or misspelt name, a value of the wrong type, a parameter the
chosen estimator or optimizer does not take fails when the options are built, naming the option.
"""

from __future__ import annotations

import argparse
import collections.abc
import inspect
import re
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping

from streamfit.exceptions import OptionError

__all__ = ["ModelOptions", "ESTIMATORS", "model_option_names", "add_model_flags", "model_options_from_flags"]

#: the estimators a run can train, by class name (``estimator = "LogisticRegression"``)
ESTIMATORS = ("OnnxRegressor", "OnnxClassifier", "LinearRegressor", "LogisticRegression", "FMRegressor",
              "FMClassifier", "MLPRegressor", "MLPClassifier")
_CLASSIFIERS = frozenset({"OnnxClassifier", "LogisticRegression", "FMClassifier", "MLPClassifier"})

#: constructor parameters a run sets from elsewhere, and why they are not options of the estimator
OWNED = {"model": "the ONNX file: --model PATH", "batch_size": "the stream's option batch_size",
         "inputs": "the stream's option inputs (--input)", "on_nonfinite": "the divergence guard (guard)",
         "max_iter": "fit's epochs (a stream calls partial_fit)", "shuffle": "fit's epochs",
         "warm_start": "fit's epochs", "weights": "the ONNX file's trainable initializers (all of them)"}


# ---------------------------------------------------------------------------------------------- kinds
@dataclass(frozen=True)
class _Kind:
    """How an option's value is read from text (a flag's string, a TOML value) and checked."""

    expected: str
    #: a TOML value or a flag's string -> the value (raises ValueError/TypeError when it does not fit)
    read: Callable[[Any], Any]
    choices: tuple[str, ...] | None = None
    boolean: bool = False
    metavar: str | None = None


def _number(kind: type, optional: bool) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, str):
            return kind(value)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise TypeError(value)
        return kind(value)
    return read


def _text(optional: bool) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise TypeError(value)
        return value
    return read


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TypeError(value)


def _list_of(item: Callable[[str], Any], kinds: tuple[type, ...]) -> Callable[[Any], Any]:
    """A comma-separated flag or a TOML list (an empty list is allowed: ``dense = []``)."""
    def read(value: Any) -> Any:
        if isinstance(value, str):
            return [item(v.strip()) for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, kinds) and not isinstance(v, bool)
                                                           for v in value):
            raise TypeError(value)
        out = list(value)
        if kinds == (str,) and (not all(out) or len(set(out)) != len(out)):
            raise ValueError(value)
        return out
    return read


def _choice(choices: tuple[str, ...], none: str | None = None) -> Callable[[Any], Any]:
    def read(value: Any) -> Any:
        if none is not None and (value == none or value is None):
            return None
        if value not in choices:
            raise ValueError(value)
        return value
    return read


def _schedule(value: Any) -> Any:
    from streamfit.schedules.base import _by_name

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        if value in _by_name():
            return value
    raise ValueError(value)


def _eta0(value: Any) -> Any:
    """A positive number, or "auto" (the optimizer's own starting rate)."""
    if value == "auto":
        return value
    rate = _number(float, optional=False)(value)
    if not rate > 0:
        raise ValueError(value)
    return rate


def _loss(value: Any) -> Any:
    from streamfit.losses import get_loss

    if value == "auto":
        return value
    if not isinstance(value, str):
        raise TypeError(value)
    get_loss(value)  # ValueError for a name it does not know
    return value


def _any_kinds() -> dict[str, _Kind]:
    """Text forms of the parameters annotated ``Any`` (they take objects too; text names the library's registries)."""
    from streamfit.optim import _BY_NAME as OPTIMIZERS
    from streamfit.schedules.base import _by_name

    penalties = ("l2", "l1", "elasticnet")
    return {
        "optimizer": _Kind(f"one of {', '.join(sorted(OPTIMIZERS))}", _choice(tuple(sorted(OPTIMIZERS))),
                           choices=tuple(sorted(OPTIMIZERS))),
        "penalty": _Kind("'l2', 'l1', 'elasticnet' or 'none'", _choice(penalties, none="none"),
                         choices=(*penalties, "none")),
        "loss": _Kind("a loss name of streamfit.losses (or 'auto' for a classifier)", _loss, metavar="NAME"),
        "learning_rate": _Kind(f"a schedule ({', '.join(sorted(_by_name()))}) or a constant rate", _schedule,
                               metavar="SCHEDULE|RATE"),
        "random_state": _Kind("an int seed", _number(int, optional=True), metavar="SEED"),
        "eta0": _Kind("a positive number or 'auto' (the optimizer's own starting rate)", _eta0, metavar="RATE|auto"),
        "hidden_layer_sizes": _Kind("a list of layer widths", _list_of(int, (int,)), metavar="N[,N...]"),
        "freeze": _Kind("a list of initializer names", _list_of(str, (str,)), metavar="NAME[,NAME...]"),
    }


def _kind(name: str, annotation: Any) -> _Kind:
    """An option's text form from its constructor annotation (``int``, ``float | None``, ``Sequence[str]``, ...)."""
    optional = type(None) in typing.get_args(annotation)
    base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation) if optional else annotation
    if base is bool:
        return _Kind("true or false", _bool, boolean=True)
    if base is int:
        return _Kind(f"{'None or ' if optional else ''}an int", _number(int, optional), metavar="N")
    if base is float:
        return _Kind(f"{'None or ' if optional else ''}a number", _number(float, optional), metavar="X")
    if base is str:
        return _Kind(f"{'None or ' if optional else ''}a string", _text(optional))
    if typing.get_origin(base) in (collections.abc.Sequence, list, tuple) and typing.get_args(base) == (str,):
        return _Kind("a list of column names", _list_of(str, (str,)), metavar="COL[,COL...]")
    kinds = _any_kinds()
    if name in kinds:
        return kinds[name]
    raise TypeError(f"{name}: no text form for a parameter annotated {annotation!r}")  # a new parameter: add its form


# ---------------------------------------------------------------------------------------------- derived
@dataclass(frozen=True)
class Param:
    """One option: a constructor parameter of some estimators, or of one optimizer (``optimizer`` set)."""

    name: str
    kind: _Kind
    help: str
    #: class name -> that class's default, for every estimator (or the optimizer) that takes it
    defaults: Mapping[str, Any]
    #: the optimizer (``"ftrl"``) whose constructor takes it, and its name there (``"l1"``)
    optimizer: str | None = None
    argument: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def read(self, value: Any, where: str = "") -> Any:
        try:
            return self.kind.read(value)
        except (TypeError, ValueError):
            raise OptionError(f"{where}Invalid {self.name}: {value!r}, expected {self.kind.expected}",
                              option=self.name) from None


def _classes() -> dict[str, Any]:
    import streamfit

    return {name: getattr(streamfit, name) for name in ESTIMATORS}


def _doc_params(doc: str) -> dict[str, str]:
    """numpydoc ``Parameters``: name -> the first sentence of its description (names given together share it)."""
    out: dict[str, str] = {}
    text = inspect.cleandoc(doc or "")
    m = re.search(r"^Parameters\n-+\n(.*?)(?=^\S[^\n]*\n-{3,}\n|\Z)", text, re.S | re.M)
    if not m:
        return out
    names: list[str] = []
    lines: list[str] = []

    def flush() -> None:
        if not (names and lines):
            return
        text = " ".join(lines).replace("``", "")
        parts = [part.strip().rstrip(".") for part in _clauses(text.split(". ")[0])]
        if len(names) > 1 and len(parts) == len(names):  # "a, b: what a is; what b is"
            for n, part in zip(names, parts):
                out.setdefault(n, part[:1].upper() + part[1:])
            return
        for n in names:  # a shared description: for the names its first clause speaks of
            if len(names) == 1 or re.search(rf"\b{n}\b", parts[0]):
                out.setdefault(n, parts[0])

    for line in m.group(1).splitlines():
        if line and not line[0].isspace():
            flush()
            names, lines = [n.strip() for n in line.split(":")[0].split(",") if n.strip() not in ("", "...")], []
        elif line.strip():
            lines.append(line.strip())
    flush()
    return out


def _clauses(sentence: str) -> list[str]:
    """``sentence`` split at the semicolons outside parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(sentence):
        depth += (ch == "(") - (ch == ")")
        if ch == ";" and depth == 0:
            out.append(sentence[start:i])
            start = i + 1
    return out + [sentence[start:]]


def _shown(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value) if value else "none"
    return "none" if value is None else str(value)


@lru_cache(maxsize=1)
def _params() -> dict[str, Param]:
    from streamfit.estimators._base import _OPTIMIZER_PARAMS
    from streamfit.optim import _BY_NAME as OPTIMIZERS

    found: dict[str, dict[str, Any]] = {}
    kinds: dict[str, _Kind] = {}
    annotations: dict[str, Any] = {}
    docs: dict[str, str] = {}
    for cname, cls in _classes().items():
        hints = typing.get_type_hints(cls.__init__)
        for pname, p in inspect.signature(cls.__init__).parameters.items():
            if pname == "self" or pname in OWNED or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if pname in annotations and annotations[pname] != hints.get(pname, Any):
                raise TypeError(f"{pname} is annotated {annotations[pname]} and {hints.get(pname)}: one option, one type")
            annotations[pname] = hints.get(pname, Any)
            kinds.setdefault(pname, _kind(pname, annotations[pname]))
            found.setdefault(pname, {})[cname] = p.default
    for cname in ("FMClassifier", *ESTIMATORS):  # the factorization machines document the hashing parameters best
        for n, text in _doc_params(_classes()[cname].__doc__ or "").items():
            docs.setdefault(n, text)
    out: dict[str, Param] = {}
    for pname, defaults in found.items():
        shown = sorted({_shown(v) for v in defaults.values()})
        default = f"default {shown[0]}" if len(shown) == 1 else "default: " + "; ".join(
            f"{_shown(v)} ({', '.join(c for c, d in defaults.items() if _shown(d) == _shown(v))})"
            for v in dict.fromkeys(defaults.values()))
        takes = "" if len(defaults) == len(ESTIMATORS) else f" [{', '.join(defaults)}]"
        what = docs.get(pname, pname.replace("_", " "))
        if pname in _any_kinds():
            what += f": {kinds[pname].expected}"
        help = f"{what} ({default}){takes}"
        out[pname] = Param(pname, kinds[pname], help, dict(defaults))
    for oname, ocls in sorted(OPTIMIZERS.items()):
        hints = typing.get_type_hints(ocls.__init__)
        for pname, p in inspect.signature(ocls.__init__).parameters.items():
            if pname == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or pname in _OPTIMIZER_PARAMS.get(oname, ()):
                continue  # momentum's momentum is the estimators' own parameter
            name = f"{oname}_{pname}"
            assert name not in out, name
            out[name] = Param(name, _kind(name, hints.get(pname, Any)),
                              f"{ocls.__name__}({pname}=...) with optimizer {oname} (default {_shown(p.default)})",
                              {ocls.__name__: p.default}, optimizer=oname, argument=pname)
    return out


def model_option_names() -> tuple[str, ...]:
    """Every option of the estimator: ``estimator``, the estimators' parameters and the optimizers' ones."""
    return ("estimator", *_params())


def _estimator_param() -> _Kind:
    return _Kind(f"one of {', '.join(ESTIMATORS)}", _choice(ESTIMATORS), choices=ESTIMATORS)


# ---------------------------------------------------------------------------------------------- the object
@dataclass(frozen=True)
class ModelOptions:
    """The estimator of a run: its class (``estimator``; ``None``: an ONNX file, ``OnnxRegressor`` or
    ``OnnxClassifier`` by the stream's task) and the parameters given (every other one keeps the class's
    default).  Built from TOML keys or flags by :meth:`from_text`; checked when built.

    Parameters
    ----------
    estimator
        The class name (``"LogisticRegression"``, ...), or None for an ONNX file's ``OnnxRegressor`` or
        ``OnnxClassifier``.
    params
        The parameters given, by name (the others keep the class's defaults).

    Examples
    --------
    >>> opts = ModelOptions.from_text({"estimator": "LogisticRegression", "categorical": ["site", "app"],
    ...                                "optimizer": "ftrl", "ftrl_l1": 0.5})
    >>> opts.value("buckets"), opts.optimizer()
    (262144, FTRL(beta=1.0, l1=0.5, l2=0.0, summed=True))
    >>> ModelOptions.from_text({"estimator": "LogisticRegression", "n_factor": 4})
    Traceback (most recent call last):
    ...
    streamfit.exceptions.OptionError: unknown option 'n_factor' (did you mean 'n_factors'?)...
    """

    estimator: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", dict(self.params))
        if self.estimator is not None and self.estimator not in ESTIMATORS:
            raise _unknown_estimator(self.estimator)
        known = _params()
        for name in self.params:
            if name not in known:
                raise _unknown(name)
        object.__setattr__(self, "params", {k: known[k].read(v) for k, v in self.params.items()})
        cls = self.class_name()
        candidates = (cls,) if cls is not None else ("OnnxRegressor", "OnnxClassifier")
        optimizer = self.value("optimizer")
        for name in self.params:
            p = known[name]
            if p.optimizer is not None:
                if p.optimizer != optimizer:
                    raise OptionError(f"{name} is a parameter of optimizer {p.optimizer!r}, but the optimizer is "
                                      f"{optimizer!r} (give optimizer = {p.optimizer!r})", option=name)
            elif not set(candidates) & set(p.defaults):
                chosen = f"estimator = {self.estimator!r}" if self.estimator else "no estimator given: an ONNX --model"
                raise OptionError(f"{name} is a parameter of {', '.join(p.defaults)}, not of {' or '.join(candidates)}"
                                  f" ({chosen})", option=name)
        self.optimizer()  # its parameters' ranges, now

    # ------------------------------------------------------------------------------------ building
    @classmethod
    def from_text(cls, values: Mapping[str, Any], where: str = "") -> "ModelOptions":
        """From TOML values or collected flags (names checked, text forms read: ``penalty = "none"``, ...).

        Parameters
        ----------
        values
            ``{name: value}``: the TOML file's estimator keys, or the flags given.
        where
            Where they come from, for the messages (``"config.toml"``, ``"flags"``).
        """
        known = _params()
        estimator = values.get("estimator")
        if estimator is not None:
            try:
                estimator = _estimator_param().read(estimator)
            except (TypeError, ValueError):
                raise _unknown_estimator(estimator, where) from None
        params = {}
        for name, value in values.items():
            if name == "estimator":
                continue
            if name not in known:
                raise _unknown(name, where)
            params[name] = known[name].read(value, where)
        try:
            return cls(estimator, params)
        except OptionError as exc:
            raise OptionError(f"{where}{exc}", option=exc.option) from None

    def class_name(self, task: str | None = None) -> str | None:
        """The estimator's class name (an ONNX file's by ``task``; ``None`` while it is unknown).

        Parameters
        ----------
        task
            ``"regression"`` or ``"classification"``: picks an ONNX file's estimator; None while it is unknown.
        """
        if self.estimator is not None:
            return self.estimator
        if task is None:
            return None
        return "OnnxClassifier" if task == "classification" else "OnnxRegressor"

    @property
    def task(self) -> str | None:
        """The task the estimator is for (``None``: an ONNX file, by the stream's options)."""
        if self.estimator is None:
            return None
        return "classification" if self.estimator in _CLASSIFIERS else "regression"

    def value(self, name: str, task: str | None = None) -> Any:
        """A parameter as given, else the estimator's default (the regressor's while the task is open; ``None``
        when the estimator does not take it).

        Parameters
        ----------
        name
            A parameter name.
        task
            ``"regression"`` or ``"classification"``: picks an ONNX file's estimator; None while it is unknown.
        """
        if name in self.params:
            return self.params[name]
        p = _params()[name]
        if p.optimizer is not None:
            return next(iter(p.defaults.values()))
        return p.defaults.get(self.class_name(task) or "OnnxRegressor")

    def optimizer(self, task: str | None = None) -> Any:
        """The optimizer: its name, or an instance when any of its parameters is given (``FTRL(l1=0.5)``).

        Parameters
        ----------
        task
            ``"regression"`` or ``"classification"``: picks an ONNX file's estimator; None while it is unknown.
        """
        name = self.value("optimizer", task)
        given = {p.argument: self.params[n] for n, p in _params().items() if p.optimizer == name and n in self.params}
        if not given:
            return name
        from streamfit.optim import get_optimizer

        try:
            return get_optimizer(name, **given)
        except (TypeError, ValueError) as exc:
            first = next(n for n, p in _params().items() if p.optimizer == name and n in self.params)
            raise OptionError(f"Invalid {name} optimizer parameters: {exc}", option=first) from None

    def build(self, *, model: str | None, task: str, batch_size: int, guard: bool, inputs: Any = None) -> Any:
        """The estimator: its class with the parameters given, the run's batch size and its ``on_nonfinite``
        (``"skip"`` under the divergence guard: a refused step is rolled back, never applied).

        Parameters
        ----------
        model
            The ONNX file for ``OnnxRegressor``/``OnnxClassifier``; None for a ready-made model.
        task
            ``"regression"`` or ``"classification"``.
        batch_size
            The run's rows per step.
        guard
            Whether the divergence guard is on (then ``on_nonfinite="skip"``).
        inputs
            The run's ``inputs=`` mapping, or None.
        """
        cname = self.class_name(task)
        assert cname is not None
        cls = _classes()[cname]
        kwargs = {k: v for k, v in self.params.items() if _params()[k].optimizer is None}
        kwargs["optimizer"] = self.optimizer(task)
        kwargs.update(batch_size=batch_size, on_nonfinite="skip" if guard else "raise")
        if inputs is not None:
            kwargs["inputs"] = inputs
        estimator = cls(model, **kwargs) if cname.startswith("Onnx") else cls(**kwargs)
        validate = getattr(estimator, "_precheck_params", None)  # what its first fit would refuse, now
        if validate is not None:
            validate()
        return estimator

    def to_toml(self) -> str:
        """The options given, as config-file lines."""
        from streamfit._stream.options import _toml_value

        lines = [f"estimator = {_toml_value('estimator', self.estimator)}"] if self.estimator else []
        for name, value in self.params.items():
            text = "none" if name == "penalty" and value is None else value
            if text is not None:
                lines.append(f"{name} = {_toml_value(name, text)}")
        return "".join(line + "\n" for line in lines)


def _unknown(name: str, where: str = "") -> OptionError:
    from streamfit._stream.options import nearest

    near = nearest(name, model_option_names())
    return OptionError(f"{where}unknown option {name!r}" + (f" (did you mean {near!r}?)" if near else "")
                       + f"; the estimator's options are: {', '.join(model_option_names())}", option=name)


def _unknown_estimator(value: Any, where: str = "") -> OptionError:
    from streamfit._stream.options import nearest

    near = nearest(str(value), ESTIMATORS)
    return OptionError(f"{where}Invalid estimator: {value!r}, expected one of {', '.join(ESTIMATORS)}"
                       + (f" (did you mean {near!r}?)" if near else ""), option="estimator")


# ---------------------------------------------------------------------------------------------- CLI
def add_model_flags(parser: Any, optimizers: Any = None) -> None:
    """One flag per option (``--estimator``, ``--categorical``, ``--buckets``, ``--ftrl-l1``, ...), each with
    ``default=None`` so that a flag not given leaves the config file's value (or the class's default); the
    values stay text, read by :meth:`ModelOptions.from_text` as a TOML file's are; ``optimizers`` (a group) takes the
    optimizers' parameters."""
    parser.add_argument("--estimator", default=None, choices=list(ESTIMATORS),
                        help="the estimator to train (default: the --model ONNX file, OnnxRegressor or OnnxClassifier "
                             "by the task); the ready-made ones build their own graph")
    optimizers = optimizers if optimizers is not None else parser  # (an argument group for --help)
    for p in _params().values():
        target = optimizers if p.optimizer is not None else parser
        kw: dict[str, Any] = {"dest": p.name, "default": None, "help": p.help}
        if p.kind.boolean:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if p.kind.choices:
                kw["choices"] = list(p.kind.choices)
            elif p.kind.metavar:
                kw["metavar"] = p.kind.metavar
        target.add_argument(p.flag, **kw)


def model_options_from_flags(values: Mapping[str, Any]) -> dict[str, Any]:
    """The estimator's options among parsed flags (``vars(namespace)``) that were given (not ``None``)."""
    names = set(model_option_names())
    return {k: v for k, v in values.items() if k in names and v is not None}
