"""The check plan (what a fused graph leaves to its step) and the run bindings are typed handoffs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamfit._engine.common.names import Names
from streamfit._engine.steps.check_plan import CheckPlan
from streamfit._engine.steps.fused import FusedRun
from streamfit._engine.testing import mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError


def test_canonical_json_round_trips_and_is_versioned():
    plan = CheckPlan(bounded=("W1", "W0"), alpha=0.1 + 0.2, host=("b",))
    text = plan.to_json()
    assert text == ('{"alpha":0.30000000000000004,"bounded":["W1","W0"],"host":["b"],"version":1}')
    assert CheckPlan.from_json(text) == plan
    assert CheckPlan.from_json(json.dumps(json.loads(text), indent=2)) == plan  # whitespace does not matter
    assert CheckPlan.from_json(CheckPlan().to_json()) == CheckPlan() and not CheckPlan()


@pytest.mark.parametrize("data, match", [
    ({"version": 2, "bounded": [], "alpha": 1.0, "host": []}, "version 2.*newer streamfit"),
    ({"bounded": ["W"], "alpha": 1.0, "host": []}, "version None"),
    ({"version": 1, "weights": ["W"], "alpha": 1.0, "host": []}, "keys"),  # the untyped blob's old key
    ({"version": 1, "bounded": "W", "alpha": 1.0, "host": []}, "'bounded' must be a list"),
    ({"version": 1, "bounded": ["W"], "alpha": float("inf"), "host": []}, "alpha"),
    ({"version": 1, "bounded": ["W"], "alpha": 1.0, "host": ["W"]}, "both bounded and host"),
    ([1, 2], "JSON object"),
])
def test_a_plan_it_does_not_understand_is_refused(data, match):
    with pytest.raises(ModelError, match=match):
        CheckPlan.from_json(json.dumps(data))
    with pytest.raises(ModelError, match="not JSON"):
        CheckPlan.from_json("{bounded")


def test_the_fused_graph_carries_its_plan_and_the_step_binds_typed_runs():
    trainer = Trainer(mlp_model([10, 80, 64, 1], "Relu", seed=1), learning_rate=0.01)
    X = np.random.default_rng(0).standard_normal((8, 10)).astype(np.float32)
    trainer.step(X, X[:, 0])
    model = trainer._strategy.model
    entries = [p.value for p in model.metadata_props if p.key == Names.check_plan_key]
    plan = CheckPlan.of(model)
    assert entries == [plan.to_json()]  # one entry, canonical
    assert plan.bounded == ("W1",) and plan.host == ("B2",)  # 80x64 bounded; the 1-element bias read by the host
    run = next(iter(trainer._strategy.cache._cache.values())).extra["run"]
    assert isinstance(run, FusedRun) and len(run.io) == 2 and run.bound_sums is not None and not run.forget_bound
    assert all(len(c) == len(run.checks[0]) for c in run.checks)
    plan.attach(model)  # attaching replaces the entry
    CheckPlan().attach(model)  # the empty plan removes it
    assert CheckPlan.of(model) == CheckPlan() and not any(p.key == Names.check_plan_key for p in model.metadata_props)
