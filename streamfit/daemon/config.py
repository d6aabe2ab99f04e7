"""Run configuration: command-line flags over a TOML file over defaults, and the estimator they describe."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from streamfit.exceptions import ConfigError

__all__ = ["RunConfig", "load_config", "build_estimator"]


@dataclass
class RunConfig:
    """Everything ``streamfit train`` / ``serve`` needs; field names are the TOML keys and flag names."""

    source: str | None = None
    model: str | None = None
    task: str = "regression"
    classes: list[Any] | None = None
    features: list[str] | None = None
    #: model input name -> columns or encoder, as ``--input`` strings (``NAME=...``) or a TOML table
    inputs: Any = None
    label: str = "y"
    weight: str | None = None
    batch_size: int = 256
    loss: str | None = None
    optimizer: str = "sgd"
    learning_rate: str = "invscaling"
    eta0: float = 0.01
    power_t: float = 0.25
    alpha: float = 1e-4
    l1_ratio: float = 0.15
    penalty: str | None = "l2"
    momentum: float = 0.9
    threads: int | None = None
    on_bad: str = "skip"
    checkpoint_dir: str | None = None
    checkpoint_every_batches: int | None = None
    checkpoint_every_seconds: float | None = None
    keep: int = 3
    resume: bool = False
    publish: str | None = None
    output: str | None = None
    follow: bool = False
    progress: bool = True
    log_json: bool = False
    metrics_port: int | None = None
    health_file: str | None = None
    health_interval: float = 1.0
    guard: bool = True
    guard_factor: float = 100.0
    guard_lr_factor: float = 0.1
    guard_max_rollbacks: int = 3
    guard_min_lr_scale: float = 1e-4
    guard_recover_after: int = 100
    dead_letter: str | None = None
    max_rows: int | None = None
    check: bool = True  # the preflight (streamfit._preflight) before training on a model not checked before
    workers: int | None = None               # learners on a Ray cluster (streamfit.distributed)
    ray_address: str | None = None
    sync_every_batches: int | None = None
    sync_every_seconds: float | None = None
    sync_optimizer: bool = True
    checkpoint_every_rounds: int | None = None
    source_options: dict[str, Any] = field(default_factory=dict)


_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                       "list": (list,), "dict": (dict,), "None": (type(None),)}


def _check_type(name: str, value: Any, annotation: str, where: str) -> None:
    """Refuse a TOML value of the wrong type (``batch_size = "64"``) before it fails deep in a run."""
    allowed: tuple[type, ...] = ()
    for part in annotation.split("|"):
        allowed += _TYPES.get(part.strip().split("[")[0], (object,))
    if isinstance(value, bool) and bool not in allowed:
        ok = False
    else:
        ok = isinstance(value, allowed)
    if not ok:
        raise ConfigError(f"{where}: {name} = {value!r} is a {type(value).__name__}, expected {annotation}")


def load_config(path: str | None, flags: dict[str, Any]) -> RunConfig:
    """Defaults, then the TOML file's keys, then every flag that was given (flags win).

    Raises :class:`~streamfit.exceptions.ConfigError` for an unreadable file, invalid TOML, an unknown key
    or a value of the wrong type.
    """
    values: dict[str, Any] = {}
    known = {f.name: str(f.type) for f in fields(RunConfig)}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"{path}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        for key, value in data.items():
            _check_type(key, value, known[key], path)
        values.update(data)
    values.update({k: v for k, v in flags.items() if k in known and v is not None})
    return RunConfig(**values)


def parse_inputs(value: Any) -> dict[str, Any] | None:
    """``--input`` flags (a list of ``NAME=SPEC``) or a TOML table ``{name = "SPEC"}`` -> an ``inputs=`` mapping."""
    from streamfit.features import parse_input

    if value is None:
        return None
    items = [f"{k}={v}" if isinstance(v, str) else (k, v) for k, v in value.items()] \
        if isinstance(value, dict) else list(value)
    out: dict[str, Any] = {}
    for item in items:
        name, spec = parse_input(item) if isinstance(item, str) else item
        if name in out:
            raise ValueError(f"--input {name}=...: model input {name!r} is mapped twice")
        out[name] = spec
    return out


def build_estimator(cfg: RunConfig) -> Any:
    """The estimator a configuration describes: an ONNX file (OnnxRegressor/OnnxClassifier by ``task``)."""
    import streamfit

    if cfg.model is None:
        raise ConfigError("no model given: --model PATH.onnx (or 'model = ...' in the config file)")
    if cfg.task not in ("regression", "classification"):
        raise ConfigError(f"task must be 'regression' or 'classification', got {cfg.task!r}")
    if not Path(cfg.model).is_file():
        raise ConfigError(f"model file {cfg.model!r} not found")
    inputs = parse_inputs(cfg.inputs)
    common = dict(optimizer=cfg.optimizer, learning_rate=cfg.learning_rate, eta0=cfg.eta0, power_t=cfg.power_t,
                  alpha=cfg.alpha, l1_ratio=cfg.l1_ratio, penalty=cfg.penalty, momentum=cfg.momentum,
                  batch_size=cfg.batch_size, threads=cfg.threads,
                  on_nonfinite="skip" if cfg.guard else "raise")
    if inputs is not None:
        common["inputs"] = inputs
    if cfg.task == "classification":
        return streamfit.OnnxClassifier(cfg.model, loss=cfg.loss or "auto", **common)
    return streamfit.OnnxRegressor(cfg.model, loss=cfg.loss or "squared_error", **common)
