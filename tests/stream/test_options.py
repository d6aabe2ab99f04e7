"""One options vocabulary: StreamOptions built and checked once, the same defaults at every entry point,
the daemon's TOML keys and the CLI's flags derived from it."""

from __future__ import annotations

import inspect
from dataclasses import fields

import numpy as np
import pyarrow as pa
import pytest
from sklearn.linear_model import SGDRegressor

import streamfit
from streamfit import OptionError, StreamLoop, StreamOptions, train_stream, train_stream_sync
from streamfit.cli import _parser, main
from streamfit.daemon import Runner
from streamfit.daemon.config import RunConfig, load_config
from streamfit.sources.memory import MemorySource


def _table(n: int = 64) -> pa.Table:
    x = np.linspace(-1, 1, n, dtype=np.float32)
    return pa.table({"x": x, "y": 2 * x})


# ------------------------------------------------------------------------------------------ Python
@pytest.mark.parametrize("entry", ["StreamOptions", "StreamLoop", "train_stream_sync", "Runner"])
def test_a_misspelt_option_fails_when_built_naming_the_nearest(entry):
    est = SGDRegressor()
    build = {
        "StreamOptions": lambda: StreamOptions(bach_size=8),
        "StreamLoop": lambda: StreamLoop(est, MemorySource(_table()), bach_size=8),
        "train_stream_sync": lambda: train_stream_sync(est, MemorySource(_table()), bach_size=8),
        "Runner": lambda: Runner(est, lambda: MemorySource(_table()), bach_size=8),
    }[entry]
    with pytest.raises(OptionError, match=r"unknown stream option 'bach_size' \(did you mean 'batch_size'\?\)") as e:
        build()
    assert e.value.option == "bach_size"
    assert isinstance(e.value, TypeError) and isinstance(e.value, streamfit.ConfigError)
    assert not hasattr(est, "coef_")  # nothing trained


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, r"Invalid batch_size: 0, expected an int >= 1"),
    ({"batch_size": "64"}, r"Invalid batch_size: '64', expected an int >= 1"),
    ({"batch_size": True}, r"Invalid batch_size: True"),
    ({"max_rows": -1}, r"Invalid max_rows: -1, expected None or an int >= 0"),
    ({"on_bad": "skp"}, r"Invalid on_bad: 'skp', expected 'raise' or 'skip' \(did you mean 'skip'\?\)"),
    ({"task": "regresion"}, r"did you mean 'regression'\?"),
    ({"dtype": "int64"}, r"Invalid dtype: 'int64', expected 'float32' or 'float64'"),
    ({"features": []}, r"Invalid features"),
    ({"features": ["a", "a"]}, r"distinct column names"),
    ({"label": ""}, r"Invalid label"),
    ({"classes": []}, r"Invalid classes"),
    ({"classes": [0, 1], "task": "regression"}, r"classes are for classification"),
    ({"cast": "yes"}, r"Invalid cast: 'yes', expected True or False"),
    ({"queue_size": 0}, r"Invalid queue_size: 0, expected an int >= 1"),
    ({"dead_letter": 3}, r"Invalid dead_letter"),
])
def test_values_are_checked_when_built(kwargs, message):
    with pytest.raises(OptionError, match=message):
        StreamOptions(**kwargs)


def test_values_are_normalized_and_keywords_build_the_object():
    opts = StreamOptions(features="x", classes=np.array([0, 1]), dtype=np.float64)
    assert (opts.features, opts.classes, opts.dtype, opts.resolved_task) == (("x",), (0, 1), "float64",
                                                                             "classification")
    loop = StreamLoop(SGDRegressor(), MemorySource(_table()), label="y", batch_size=16)
    assert loop.options == StreamOptions(label="y", batch_size=16)
    # an object and keywords on top of it
    loop = StreamLoop(SGDRegressor(), MemorySource(_table()), StreamOptions(batch_size=16), window=50)
    assert (loop.options.batch_size, loop.options.window) == (16, 50)
    summary = train_stream_sync(SGDRegressor(random_state=0), MemorySource(_table()),
                                options=StreamOptions(batch_size=16))
    assert summary.batches == 4


def test_positional_fields_are_refused():
    with pytest.raises(OptionError, match="keyword arguments only"):
        StreamOptions(256)


# ------------------------------------------------------------------------------------------ defaults
def _signature_defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_defaults_agree_across_the_entry_points_and_the_cli():
    defaults = StreamOptions().as_dict()
    assert defaults["on_bad"] == "skip"
    names = set(defaults)
    # no entry point declares an option of its own (with a default that could disagree)
    for fn in (StreamLoop.__init__, train_stream, train_stream_sync, Runner.__init__):
        assert not names & set(_signature_defaults(fn)), fn.__qualname__
    est = SGDRegressor()
    loop = StreamLoop(est, MemorySource(_table()))
    runner = Runner(est, lambda: MemorySource(_table()))
    assert loop.options == runner.options == StreamOptions()
    assert (loop.rebatcher.on_bad, loop.rebatcher.batch_size, loop.queue_size) == ("skip", 256, 4)
    # the daemon's config: the same object, the same defaults
    cfg = load_config(None, {})
    assert cfg.stream == StreamOptions() and cfg.on_bad == "skip" and cfg.task == "regression"
    assert not names & {f.name for f in fields(RunConfig)}  # written once: not repeated as config fields
    # the CLI: no flag given leaves every option at its default
    ns = _parser().parse_args(["train", "--source", "parquet:/x", "--model", "m.onnx"])
    assert load_config(None, vars(ns)).stream == StreamOptions()


def test_every_option_is_a_cli_flag_and_a_config_key():
    ns = _parser().parse_args(["serve", "--features", "a,b", "--input", "ids=hashed:city:100", "--label", "t",
                               "--weight", "w", "--task", "classification", "--classes", "0,1,two",
                               "--batch-size", "8", "--max-rows", "100", "--on-bad", "skip", "--cast", "--dtype",
                               "float64", "--drop-last", "--queue-size", "2", "--window", "50", "--no-evaluate",
                               "--progress", "--dead-letter", "dead.jsonl"])
    opts = load_config(None, vars(ns)).stream
    assert opts.inputs["ids"] == streamfit.features.Hashed(["city"], 100)
    assert opts.as_dict() | {"inputs": None} == StreamOptions(
        features=["a", "b"], label="t", weight="w", task="classification", classes=[0, 1, "two"], batch_size=8,
        max_rows=100, on_bad="skip", cast=True, dtype="float64", drop_last=True, queue_size=2, window=50,
        evaluate=False, progress=True, dead_letter="dead.jsonl").as_dict()


def test_every_field_has_a_flag_and_a_toml_key_that_agree_and_the_same_default(tmp_path):
    """Generic over the fields: a field added without a flag, a config key, an example value or with a
    default that its consumer (the loop, the divergence guard, the Ray trainer) does not share fails here."""
    import tomllib

    from streamfit._stream.options import SCOPES, _flag

    parser = _parser()
    serve = next(a for a in parser._actions if hasattr(a, "choices") and a.choices).choices["serve"]
    dests = {a.dest: a for a in serve._actions}
    for f in fields(StreamOptions):
        meta = f.metadata
        assert meta["scope"] in SCOPES, f.name
        assert meta["example"] is not None, f"{f.name}: no example value (the form a flag takes)"
        action = dests.get(f.name)
        assert action is not None and _flag(f) in action.option_strings, f"{f.name}: no --flag"
        assert action.default is None, f"{f.name}: a flag not given must leave the config file's value"
        # the flag and the config key give the same value, and it is not the default
        example = meta["example"]
        if isinstance(example, bool):
            argv = [_flag(f) if example else "--no-" + _flag(f)[2:]]
            key = f"{f.name} = {'true' if example else 'false'}"
        else:
            argv = [_flag(f), example]
            value = example if meta["parse"] in (int, float) else repr(example)
            if meta["append"]:
                name, spec = example.split("=", 1)
                value = f'{{ {name} = "{spec}" }}'
            elif meta["parse"] is not None and meta["parse"] not in (int, float) and "," in example:
                value = "[" + ", ".join(repr(v) if not v.isdigit() else v for v in example.split(",")) + "]"
            key = f"{f.name} = {value}"
        extra = ["--sync-every-batches", "3"] if f.name == "workers" else []  # workers needs a sync period
        if f.name == "sync_every_seconds":
            extra = []
        ns = parser.parse_args(["serve", *argv, *extra])
        from_flag = load_config(None, vars(ns)).stream
        path = tmp_path / f"{f.name}.toml"
        path.write_text(key + "\n" + ("sync_every_batches = 3\n" if extra else ""))
        tomllib.loads(path.read_text())
        from_toml = load_config(str(path), {}).stream
        assert getattr(from_flag, f.name) == getattr(from_toml, f.name) != f.default, f.name
    # the consumers' own defaults are the options' defaults
    from streamfit.daemon.guard import DivergenceGuard, guard_of

    opts = StreamOptions()
    assert guard_of(opts) == DivergenceGuard() and guard_of(StreamOptions(guard=False)) is None
    for param, name in (("factor", "guard_factor"), ("lr_factor", "guard_lr_factor"),
                        ("max_rollbacks", "poison_after"), ("min_lr_scale", "min_lr_scale"),
                        ("recover_after", "lr_recover_after")):
        assert getattr(DivergenceGuard(), param) == getattr(opts, name), name
    from streamfit.distributed._coordinator import DistributedTrainer

    ray = _signature_defaults(DistributedTrainer.__init__)
    for name in ("sync_every_batches", "sync_every_seconds", "sync_optimizer", "checkpoint_every_rounds",
                 "ray_address"):
        assert ray[name] == getattr(opts, name), name


def test_options_outside_an_entry_points_scope_are_refused_not_ignored():
    est = SGDRegressor()
    with pytest.raises(OptionError, match="poison_after=2 is an option of the daemon"):
        StreamLoop(est, MemorySource(_table()), poison_after=2)
    with pytest.raises(OptionError, match="workers=2 is an option of scale-out on Ray"):
        Runner(est, lambda: MemorySource(_table()), workers=2, sync_every_batches=4)
    with pytest.raises(OptionError, match="give one of sync_every_batches and sync_every_seconds"):
        StreamOptions(sync_every_batches=2, sync_every_seconds=1.0)
    with pytest.raises(OptionError, match="Invalid guard_lr_factor: 1.5, expected a number in \\(0, 1\\)"):
        StreamOptions(guard_lr_factor=1.5)
    # the Runner's guard follows the options (on by default, as in streamfit serve)
    from streamfit.daemon.guard import DivergenceGuard, guard_of

    assert Runner(est, lambda: MemorySource(_table())).guard == DivergenceGuard()
    assert Runner(est, lambda: MemorySource(_table()), guard=False).guard is None
    assert Runner(est, lambda: MemorySource(_table()), poison_after=7).guard.max_rollbacks == 7
    given = DivergenceGuard(factor=5)
    assert Runner(est, lambda: MemorySource(_table()), guard=given).guard is given


def test_a_config_file_with_the_former_guard_keys_still_loads(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text("guard_max_rollbacks = 5\nguard_min_lr_scale = 0.001\nguard_recover_after = 7\n")
    with pytest.warns(DeprecationWarning, match="'guard_max_rollbacks' is now 'poison_after'"):
        cfg = load_config(str(path), {})
    assert (cfg.poison_after, cfg.min_lr_scale, cfg.lr_recover_after) == (5, 0.001, 7)


# ------------------------------------------------------------------------------------------ TOML
def test_round_trip_options_toml_options(tmp_path):
    opts = StreamOptions(features=["a", "b"], inputs={"x": ["a", "b"], "z": "c"}, label=["y0", "y1"], weight="w",
                         task="classification", classes=[1, 2, 3], batch_size=32, max_rows=1000, on_bad="skip",
                         cast=True, dtype="float64", drop_last=True, queue_size=1, window=10, evaluate=False,
                         progress=True, dead_letter="dead.jsonl")
    text = opts.to_toml()
    assert StreamOptions.from_toml(text) == opts
    assert StreamOptions.from_toml(StreamOptions().to_toml()) == StreamOptions()
    # ... and through the daemon's config file, beside the run's own keys
    path = tmp_path / "run.toml"
    path.write_text('source = "parquet:/data"\n' + text)
    cfg = load_config(str(path), {})
    assert cfg.stream == opts and cfg.source == "parquet:/data"
    path.write_text(cfg.to_toml())
    assert load_config(str(path), {}) == cfg


def test_an_encoder_has_no_toml_form_and_says_how_to_write_it():
    opts = StreamOptions(inputs={"ids": streamfit.features.Hashed(["city"], 100)})
    with pytest.raises(OptionError, match=r"encoder of model input 'ids'.*spec string"):
        opts.to_toml()


def test_a_misspelt_or_invalid_key_in_the_config_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('source = "parquet:/data"\nbatch_sise = 64\n')
    with pytest.raises(streamfit.ConfigError, match=r"run.toml: unknown key 'batch_sise' \(did you mean "
                                                    r"'batch_size'\?\)"):
        load_config(str(path), {})
    path.write_text('on_bad = "drop"\n')
    with pytest.raises(OptionError, match=r"run.toml: Invalid on_bad: 'drop', expected 'raise' or 'skip'"):
        load_config(str(path), {})
    path.write_text('inputs = { x = "hashed:city" }\n')
    with pytest.raises(OptionError, match=r"run.toml: Invalid inputs: --input 'x=hashed:city'"):
        load_config(str(path), {})


# ------------------------------------------------------------------------------------------ CLI
def test_a_misspelt_flag_names_the_nearest(capsys):
    assert main(["train", "--source", "parquet:/x", "--model", "m.onnx", "--bach-size", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown option --bach-size (did you mean --batch-size?)" in err[0], err
    assert main(["train", "--source", "parquet:/x", "--model", "m.onnx", "--on-bad", "skp"]) == 2
    err = capsys.readouterr().err
    assert "argument --on-bad: invalid choice: 'skp'" in err
