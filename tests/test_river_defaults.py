"""Defaults out of the box: the ready-made models, default parameters, reach River's defaults on River's streams.

The same runs as ``bench/river_defaults.py`` (batch 1, predict then learn), on the head of each stream.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

pytest.importorskip("river")

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "river_defaults.py")
_spec = importlib.util.spec_from_file_location("river_defaults", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("river_defaults", bench)  # dataclasses look their module up there
_spec.loader.exec_module(bench)  # type: ignore[union-attr]

HEADS = {"TrumpApproval": 1001, "Phishing": 1250, "Bananas": 2000}  # rows: the whole stream, or its head


@pytest.fixture(scope="module", params=sorted(HEADS))
def stream(request):
    s = bench.load(request.param, HEADS[request.param])
    return s, bench.river_metric(s)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_default_models_reach_rivers_default_pipeline(stream, kind):
    import streamfit as sf

    s, reference = stream
    regression = s.task == "regression"
    make = {("linear", True): sf.LinearRegressor, ("linear", False): sf.LogisticRegression,
            ("mlp", True): sf.MLPRegressor, ("mlp", False): sf.MLPClassifier}[kind, regression]
    np.random.seed(0)  # random_state=None draws the MLPs' initial weights from numpy's global generator
    ours = bench.streamfit_metric(make, s)
    assert bench.met(s.task, ours, reference), (s.name, make.__name__, ours, reference)


def test_the_former_defaults_miss_on_an_uncentered_target():
    """Without feature and target standardization (the former defaults) TrumpApproval is far off: the test sees it."""
    import streamfit as sf

    s = bench.load("TrumpApproval", 400)
    ours = bench.streamfit_metric(lambda: sf.LinearRegressor(standardize=False, standardize_target=False), s)
    assert not bench.met(s.task, ours, bench.river_metric(s))
