"""streamfit train|serve --workers N: every loop option reaches the learners' loops (no Ray needed to build)."""

from __future__ import annotations

import onnx

from streamfit._engine.testing import linear_model
from streamfit._stream.options import StreamOptions
from streamfit.daemon.config import load_config
from streamfit.distributed._cli import _trainer


def test_the_learners_get_every_loop_option_and_the_ray_options(tmp_path):
    onnx.save(linear_model(3), tmp_path / "m.onnx")
    flags = {"source": "parquet:/x", "model": str(tmp_path / "m.onnx"), "workers": 3, "sync_every_seconds": 0.5,
             "sync_optimizer": False, "checkpoint_every_rounds": 2, "features": ["a", "b", "c"], "cast": True,
             "dtype": "float64", "window": 50, "queue_size": 2, "drop_last": True, "evaluate": False,
             "batch_size": 8, "on_bad": "raise"}
    trainer = _trainer(load_config(None, flags), serve=False)
    loop = StreamOptions(**trainer.loop_options)  # what each learner's StreamLoop is built with
    given = StreamOptions(**{k: v for k, v in flags.items() if k not in ("source", "model")})
    for name in ("features", "cast", "dtype", "window", "queue_size", "drop_last", "evaluate", "batch_size", "on_bad"):
        assert getattr(loop, name) == getattr(given, name) != getattr(StreamOptions(), name), name
    assert (trainer.workers, trainer.sync_every_seconds, trainer.sync_optimizer) == (3, 0.5, False)
    # the divergence guard of one learner, for each learner; a dead-letter file each
    assert trainer.guard is not None and trainer.guard.max_rollbacks == 3
    trainer = _trainer(load_config(None, {**flags, "dead_letter": str(tmp_path / "d.jsonl"), "poison_after": 2}),
                       serve=False)
    assert trainer.dead_letter == str(tmp_path / "d.jsonl") and trainer.guard.max_rollbacks == 2
    assert _trainer(load_config(None, {**flags, "guard": False}), serve=False).guard is None


def test_workers_without_a_sync_period_get_the_default(tmp_path):
    from streamfit.distributed._coordinator import DEFAULT_SYNC_EVERY_BATCHES, IDLE_ROUND_SECONDS

    onnx.save(linear_model(3), tmp_path / "m.onnx")
    flags = {"source": "parquet:/x", "model": str(tmp_path / "m.onnx"), "workers": 2}
    train = _trainer(load_config(None, flags), serve=False)  # was: ConfigError (--workers needs --sync-every-...)
    assert (train.sync_every_batches, train.sync_every_seconds) == (DEFAULT_SYNC_EVERY_BATCHES, None)
    assert train.idle_round_seconds is None  # a finite run's learner without input has ended its share
    serve = _trainer(load_config(None, flags), serve=True)
    assert serve.sync_every_batches == DEFAULT_SYNC_EVERY_BATCHES and serve.idle_round_seconds == IDLE_ROUND_SECONDS
    timed = _trainer(load_config(None, {**flags, "sync_every_seconds": 0.5}), serve=True)
    assert (timed.sync_every_batches, timed.sync_every_seconds, timed.idle_round_seconds) == (None, 0.5, None)


def test_learner_timeout_reaches_the_coordinator_with_its_default(tmp_path):
    from streamfit.distributed._watch import DEFAULT_LEARNER_TIMEOUT

    onnx.save(linear_model(3), tmp_path / "m.onnx")
    flags = {"source": "parquet:/x", "model": str(tmp_path / "m.onnx"), "workers": 2}
    assert _trainer(load_config(None, flags), serve=False).learner_timeout == DEFAULT_LEARNER_TIMEOUT
    assert StreamOptions().learner_timeout == DEFAULT_LEARNER_TIMEOUT  # one default, written twice
    assert _trainer(load_config(None, {**flags, "learner_timeout": 5.0}), serve=True).learner_timeout == 5.0


def test_max_rows_and_follow_reach_the_coordinator(tmp_path):
    """--max-rows and --follow with --workers: refused before (ConfigError), passed on now."""
    import pytest

    from streamfit import LinearRegressor
    from streamfit.distributed import DistributedTrainer

    onnx.save(linear_model(3), tmp_path / "m.onnx")
    flags = {"source": f"parquet:{tmp_path}", "model": str(tmp_path / "m.onnx"), "workers": 2, "max_rows": 500,
             "follow": True}
    trainer = _trainer(load_config(None, flags), serve=False)
    assert trainer.max_rows == 500 and trainer.source_options["follow"] is True
    served = _trainer(load_config(None, {**flags, "follow": None, "max_rows": None}), serve=True)
    assert served.max_rows is None and served.source_options["follow"] is True  # serve follows, as one learner
    with pytest.raises(ValueError, match="max_rows"):
        DistributedTrainer(LinearRegressor(), f"parquet:{tmp_path}", max_rows=-1)


def test_options_a_workers_run_does_not_have_are_refused_by_name(tmp_path):
    """Options of one learner's run that --workers has no use for: a clear error naming each (they were ignored)."""
    import pytest

    from streamfit.exceptions import ConfigError

    onnx.save(linear_model(3), tmp_path / "m.onnx")
    flags = {"source": f"parquet:{tmp_path}", "model": str(tmp_path / "m.onnx"), "workers": 2}
    for extra, flag in [({"checkpoint_every_batches": 10}, "--checkpoint-every-batches"),
                        ({"publish": str(tmp_path / "p.onnx")}, "--publish"), ({"publish_every": 5.0}, "--publish-every"),
                        ({"full_every": 3}, "--full-every"), ({"progress": True}, "--progress")]:
        with pytest.raises(ConfigError, match=flag):
            _trainer(load_config(None, {**flags, **extra}), serve=False)


def test_the_history_options_reach_the_coordinator(tmp_path):
    onnx.save(linear_model(3), tmp_path / "m.onnx")
    flags = {"source": f"parquet:{tmp_path}", "model": str(tmp_path / "m.onnx"), "workers": 2,
             "history_every_rows": 500, "history_every_seconds": 2.5, "history_dir": str(tmp_path / "h"),
             "health_interval": 0.3, "health_file": str(tmp_path / "health.json")}
    trainer = _trainer(load_config(None, flags), serve=False)
    assert (trainer.history.options.every_rows, trainer.history.options.every_seconds) == (500, 2.5)
    assert trainer.history.log.root == tmp_path / "h"
    assert trainer.health.interval == 0.3
