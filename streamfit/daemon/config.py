"""Run configuration: command-line flags over a TOML file over defaults, and the estimator they describe."""

from __future__ import annotations

import sys
import warnings
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from streamfit._stream.options import (StreamOptions, _inputs_from_text, from_text_values, nearest, option_names,
                                       options_from_flags)
from streamfit.daemon.model_options import ModelOptions, model_option_names, model_options_from_flags
from streamfit.exceptions import ConfigError, OptionError

__all__ = ["RunConfig", "load_config", "build_estimator", "config_keys"]


_STREAM_NAMES = frozenset(option_names())
_MODEL_NAMES = frozenset(model_option_names())
assert not _STREAM_NAMES & _MODEL_NAMES, _STREAM_NAMES & _MODEL_NAMES
#: config-file keys of earlier versions -> the option's name now (read with a warning)
RENAMED = {"guard_max_rollbacks": "poison_after", "guard_min_lr_scale": "min_lr_scale",
           "guard_recover_after": "lr_recover_after"}


@dataclass
class RunConfig:
    """Everything ``streamfit train`` / ``serve`` needs; field names are the TOML keys and flag names.

    The stream's options (features, label, batch_size, on_bad, ..., the divergence guard's and Ray's) are one
    :class:`~streamfit.StreamOptions` in ``stream``, their TOML keys and flags derived from it; they read as
    attributes too (``cfg.batch_size``), and ``cfg.task`` is the resolved task (classification iff classes are
    given, unless set).
    """

    source: str | None = None
    model: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_batches: int | None = None
    checkpoint_every_seconds: float | None = None
    keep: int = 3
    resume: bool = False
    publish: str | None = None
    publish_every: float | None = None  # seconds between publications at most (background thread)
    full_every: int = 10  # with row-sparse tables: a full checkpoint every K, deltas of touched rows between
    output: str | None = None
    follow: bool = False
    log_json: bool = False
    metrics_port: int | None = None
    health_file: str | None = None
    health_interval: float = 1.0
    check: bool = True  # the preflight (streamfit._preflight) before training on a model not checked before
    mlflow: str | None = None  # the run's parameters, history (as it is written) and model to this MLflow tracking URI
    tensorboard: str | None = None  # the run's history as TensorBoard scalars in this directory, as it is written
    source_options: dict[str, Any] = field(default_factory=dict)
    stream: StreamOptions = field(default_factory=StreamOptions)
    #: the estimator and its parameters (estimator, loss, optimizer, eta0, categorical, buckets, ftrl_l1, ...)
    estimator_options: ModelOptions = field(default_factory=ModelOptions)

    def __getattr__(self, name: str) -> Any:
        if name in _STREAM_NAMES and "stream" in self.__dict__:
            return getattr(self.stream, name)
        if name in _MODEL_NAMES and "estimator_options" in self.__dict__:
            if name == "estimator":
                return self.estimator_options.class_name(self.task)
            return self.estimator_options.value(name, self.task)  # as given, else the estimator's default
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def task(self) -> str:
        """The task: the estimator's (a classifier's is classification), else the stream's resolved one
        (``"classification"`` iff classes are given, unless set)."""
        return self.estimator_options.task or self.stream.resolved_task

    def to_toml(self) -> str:
        """The run's TOML file: every key that differs from the default (``None`` values left out)."""
        from streamfit._stream.options import _toml_value

        lines = []
        for f in fields(self):
            if f.name in ("stream", "estimator_options"):
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
            if value is not None and value != default:
                lines.append(f"{f.name} = {_toml_value(f.name, value)}")
        return "".join(line + "\n" for line in lines) + self.estimator_options.to_toml() + self.stream.to_toml()


_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                       "list": (list,), "dict": (dict,), "None": (type(None),)}


def _check_type(name: str, value: Any, annotation: str, where: str) -> None:
    """Refuse a TOML value of the wrong type (``threads = "4"``) before it fails deep in a run."""
    allowed: tuple[type, ...] = ()
    for part in annotation.split("|"):
        allowed += _TYPES.get(part.strip().split("[")[0], (object,))
    if isinstance(value, bool) and bool not in allowed:
        ok = False
    else:
        ok = isinstance(value, allowed)
    if not ok:
        raise ConfigError(f"{where}: {name} = {value!r} is a {type(value).__name__}, expected {annotation}")


def config_keys() -> tuple[str, ...]:
    """Every key a config file may hold: the run's own and the stream's options."""
    return tuple(sorted({f.name for f in fields(RunConfig) if f.name not in ("stream", "estimator_options")} | _STREAM_NAMES
                        | _MODEL_NAMES))


def load_config(path: str | None, flags: dict[str, Any]) -> RunConfig:
    """Defaults, then the TOML file's keys, then every flag that was given (flags win).

    Raises :class:`~streamfit.exceptions.ConfigError` for an unreadable file, invalid TOML, an unknown key
    (naming the nearest valid one) or a value of the wrong type or out of range
    (:class:`~streamfit.OptionError` for the stream's options).
    """
    values: dict[str, Any] = {}
    known = {f.name: str(f.type) for f in fields(RunConfig) if f.name not in ("stream", "estimator_options")}
    stream = StreamOptions()
    model_values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        keys = config_keys()
        for old, new in RENAMED.items():
            if old in data:
                if new in data:
                    raise ConfigError(f"{path}: {old!r} is the former name of {new!r}; give only {new!r}")
                warnings.warn(f"{path}: the config key {old!r} is now {new!r} (the CLI flag's name)",
                              DeprecationWarning, stacklevel=2)
                data[new] = data.pop(old)
        for key in sorted(data):
            if key not in known and key not in _STREAM_NAMES and key not in _MODEL_NAMES:
                near = nearest(key, keys)
                raise ConfigError(f"{path}: unknown key {key!r}" + (f" (did you mean {near!r}?)" if near else "")
                                  + f"; known keys: {', '.join(keys)}")
        for key, value in data.items():
            if key in known:
                _check_type(key, value, known[key], path)
                values[key] = value
        try:
            stream = from_text_values({k: v for k, v in data.items() if k in _STREAM_NAMES})
        except OptionError as exc:
            raise OptionError(f"{path}: {exc}", option=exc.option) from None
        model_values = {k: v for k, v in data.items() if k in _MODEL_NAMES}
    values.update({k: v for k, v in flags.items() if k in known and v is not None})
    given = model_options_from_flags(flags)
    where = f"{path}: " if path is not None and set(model_values) - set(given) else ""
    estimator = ModelOptions.from_text({**model_values, **given}, where=where)
    cfg = RunConfig(**values, stream=StreamOptions.build(stream, **options_from_flags(flags)),
                    estimator_options=estimator)
    _check_estimator(cfg)
    return cfg


def _check_estimator(cfg: RunConfig) -> None:
    """The estimator against the rest of the run: a model file only for an ONNX estimator, one task."""
    kind = cfg.estimator_options.estimator
    if kind is not None and not kind.startswith("Onnx") and cfg.model is not None:
        raise ConfigError(f"model = {cfg.model!r} is an ONNX file to train with OnnxRegressor/OnnxClassifier; "
                          f"estimator {kind!r} builds its own graph (give one of the two)")
    hashed = kind in ("FMClassifier", "FMRegressor") or bool(cfg.estimator_options.params.get("categorical"))
    for name in ("features", "inputs"):
        if hashed and getattr(cfg.stream, name) is not None:
            raise ConfigError(f"{name} = ... does not apply to {kind} over categorical columns: its columns are "
                              "given as categorical = [...] and dense = [...]")
    task = cfg.estimator_options.task
    if task is not None and cfg.stream.task is not None and cfg.stream.task != task:
        raise ConfigError(f"task = {cfg.stream.task!r}, but estimator {kind!r} is for {task}")
    if task == "regression" and cfg.stream.classes is not None:
        raise ConfigError(f"classes = {list(cfg.stream.classes)!r}, but estimator {kind!r} is a regressor")


def parse_inputs(value: Any) -> dict[str, Any] | None:
    """``--input`` flags (a list of ``NAME=SPEC``) or a TOML table ``{name = "SPEC"}`` -> an ``inputs=`` mapping."""
    return _inputs_from_text(value)


def build_estimator(cfg: RunConfig) -> Any:
    """The estimator a configuration describes: an ONNX file (OnnxRegressor/OnnxClassifier by ``task``) or a
    ready-made model (``estimator = "LogisticRegression"``, ...) with the parameters given."""
    kind = cfg.estimator_options.class_name(cfg.task)
    if kind is not None and kind.startswith("Onnx"):
        if cfg.model is None:
            raise ConfigError("no model given: --model PATH.onnx (or 'model = ...' in the config file), or a "
                              "ready-made --estimator (LinearRegressor, LogisticRegression, FMClassifier, ...)")
        if not Path(cfg.model).is_file():
            raise ConfigError(f"model file {cfg.model!r} not found")
    return cfg.estimator_options.build(model=cfg.model, task=cfg.task, batch_size=cfg.batch_size, guard=cfg.guard,
                               inputs=cfg.stream.inputs)
