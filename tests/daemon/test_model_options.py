"""One vocabulary for the estimator of `streamfit train|serve`: every option is a constructor parameter of an
estimator class or of an optimizer, its flag and its config key give the same value, and the estimator built
from them holds it."""

from __future__ import annotations

import argparse
import inspect

import pytest

import streamfit
from streamfit.exceptions import OptionError
from streamfit.daemon.config import build_estimator, config_keys, load_config
from streamfit.daemon.model_options import ESTIMATORS, OWNED, ModelOptions, _params, add_model_flags, model_option_names
from streamfit.optim import _BY_NAME as OPTIMIZERS
from tests.daemon.helpers import write_model


def _constructor_params(cls: type) -> list[str]:
    return [n for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def test_the_options_are_the_constructors_parameters():
    expected = {"estimator"}
    for name in ESTIMATORS:
        expected |= set(_constructor_params(getattr(streamfit, name))) - set(OWNED)
    for oname, ocls in OPTIMIZERS.items():
        expected |= {f"{oname}_{p}" for p in _constructor_params(ocls) if not (oname in ("momentum", "nesterov")
                                                                               and p == "momentum")}
    assert set(model_option_names()) == expected
    assert {"categorical", "dense", "buckets", "hash_seed", "n_factors", "ftrl_beta", "ftrl_l1", "ftrl_l2"} \
        <= set(config_keys())
    for owned in OWNED:  # set by the run from elsewhere: not an estimator option
        assert owned not in model_option_names()


def _example(name: str, p) -> tuple[object, str | list[str]]:
    """A non-default value of option ``p`` and how a flag spells it."""
    default = next(iter(p.defaults.values()))
    special = {"loss": ("huber", "huber"), "learning_rate": ("optimal", "optimal"), "device": ("cpu", "cpu"),
               "step": ("forward_backward", "forward_backward"), "activation": ("tanh", "tanh"),
               "hidden_layer_sizes": ([8, 4], "8,4"), "random_state": (3, "3"), "input_name": ("X", "X"),
               "output_name": ("Y", "Y"), "optimizer": ("nesterov", "nesterov"), "penalty": (None, "none"),
               "eta0": (0.25, "0.25"), "freeze": (["head.bias", "head.weight"], "head.bias,head.weight")}
    if name in special:
        return special[name]
    if p.kind.boolean:
        return (not default, [f"--{'no-' if default else ''}{name.replace('_', '-')}"])
    if p.kind.metavar == "COL[,COL...]":
        return (["a", "b"], "a,b")
    if p.kind.metavar == "N":
        return (7, "7")
    if p.kind.metavar == "X":
        return (0.25, "0.25")
    raise AssertionError(f"no example for {name}")


def _classes_taking(p) -> list[str]:
    return [c for c in p.defaults if c in ESTIMATORS] or ["LinearRegressor"]


@pytest.mark.parametrize("name", [n for n in model_option_names() if n != "estimator"])
def test_flag_and_config_key_agree_and_reach_the_estimator(tmp_path, name):
    p = _params()[name]
    value, flag = _example(name, p)
    estimator = "FMClassifier" if p.optimizer is not None else _classes_taking(p)[0]
    base: dict = {"estimator": estimator}
    if p.optimizer is not None:
        base["optimizer"] = p.optimizer
    if estimator.startswith("Onnx"):
        base = {"estimator": estimator, "model": str(write_model(tmp_path))}
    if estimator.startswith("FM") or (name in ("dense", "buckets", "hash_seed")
                                      and estimator in ("LinearRegressor", "LogisticRegression")):
        base["categorical"] = ["c"]  # a hashed model needs columns
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    add_model_flags(parser)
    argv = [f"--{k}={v}" for k, v in base.items()] + ([*flag] if isinstance(flag, list)
                                                      else [f"--{name.replace('_', '-')}", flag])
    argv = [a.replace("--categorical=['c']", "--categorical=c") for a in argv]
    from_flags = load_config(None, vars(parser.parse_args(argv)))
    toml = tmp_path / "run.toml"
    from streamfit._stream.options import _toml_value
    lines = [f"{k} = {_toml_value(k, v)}" for k, v in base.items()]
    lines.append(f'{name} = {_toml_value(name, "none" if value is None else value)}')
    toml.write_text("\n".join(lines) + "\n")
    from_toml = load_config(str(toml), {})
    assert from_flags == from_toml
    assert from_toml.estimator_options.params[name] == value
    assert getattr(from_toml, name) == value  # read through the run's config
    if name in ("momentum",):
        return  # the estimator's own parameter, fed to Momentum/Nesterov
    est = build_estimator(from_toml)
    if p.optimizer is not None:
        assert est.get_params()["optimizer"].get_params()[p.argument] == value
    else:
        assert est.get_params()[name] == value


def test_defaults_are_the_estimators_own():
    opts = ModelOptions("FMClassifier", {"categorical": ["a"]})
    assert (opts.value("optimizer"), opts.value("eta0"), opts.value("buckets")) == ("adagrad", "auto", 2 ** 18)
    assert ModelOptions().value("optimizer", "regression") == "sgd"  # an ONNX file's OnnxRegressor
    est = opts.build(model=None, task="classification", batch_size=128, guard=True)
    assert isinstance(est, streamfit.FMClassifier) and est.batch_size == 128 and est.on_nonfinite == "skip"
    assert est.get_params()["n_factors"] == 8
    assert est._eta0() == 0.05  # "auto": AdaGrad's rate for the factorization machines


def test_eta0_auto_or_a_rate(tmp_path):
    """--eta0 takes "auto" (the default of the ready-made models) or a positive number, nothing else."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    add_model_flags(parser)
    for text, value in (("auto", "auto"), ("0.3", 0.3)):
        cfg = load_config(None, vars(parser.parse_args(["--estimator=LogisticRegression", f"--eta0={text}"])))
        assert cfg.estimator_options.params["eta0"] == value
        assert build_estimator(cfg).get_params()["eta0"] == value
    for bad in ("fast", "-1"):
        with pytest.raises(OptionError, match="eta0"):
            load_config(None, vars(parser.parse_args(["--estimator=LogisticRegression", f"--eta0={bad}"])))


def test_the_documented_config_of_a_categorical_model_loads_and_builds(tmp_path):
    """The TOML file of docs/tutorials/daemon.md (a categorical model in the daemon), as written."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "daemon.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", page, re.S) if "categorical" in b]
    assert len(blocks) == 1
    (tmp_path / "ctr.toml").write_text(blocks[0])
    cfg = load_config(str(tmp_path / "ctr.toml"), {})
    assert cfg.task == "classification" and cfg.estimator == "LogisticRegression"
    est = build_estimator(cfg)
    assert isinstance(est, streamfit.LogisticRegression) and est.buckets == 2 ** 20
    assert est.optimizer.get_params() == {"beta": 1.0, "l1": 1.0, "l2": 0.0, "summed": True}
