"""The same training on two onnxruntimes (see tests/cross_runtime.py): with ``STREAMFIT_CROSS_DIR`` set (the CI's
Python 3.13 leg), the artifacts compiled and the ready-made models trained on the first leg are trained again here
and must give the first leg's weights up to float noise; without it, the round trip runs in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from tests.cross_runtime import load, make, train_artifact, train_estimator

CROSS_DIR = os.environ.get("STREAMFIT_CROSS_DIR")
_MANIFEST = json.loads((Path(CROSS_DIR) / "manifest.json").read_text()) if CROSS_DIR else {}
#: float noise: other kernels (and another BLAS) over a few steps
RTOL, ATOL = 2e-4, 2e-5


def _compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {name}")


@pytest.mark.skipif(not CROSS_DIR, reason="STREAMFIT_CROSS_DIR not set (the CI's second leg sets it)")
@pytest.mark.parametrize("name", _MANIFEST.get("artifacts", []))
def test_artifact_made_on_the_first_leg_trains_the_same_here(name) -> None:
    root = Path(CROSS_DIR or ".")
    got = train_artifact(root / f"{name}.train.onnx", load(root / f"{name}.batches.npz"))
    _compare(got, load(root / f"{name}.weights.npz"),
             f"{name}: onnxruntime {onnxruntime.__version__} vs {_MANIFEST['onnxruntime']}")


@pytest.mark.skipif(not CROSS_DIR, reason="STREAMFIT_CROSS_DIR not set (the CI's second leg sets it)")
@pytest.mark.parametrize("name", _MANIFEST.get("estimators", []))
def test_ready_made_model_trains_the_same_here(name) -> None:
    root = Path(CROSS_DIR or ".")
    got = train_estimator(name, load(root / f"{name}.batches.npz"))
    _compare(got, load(root / f"{name}.weights.npz"),
             f"{name}: onnxruntime {onnxruntime.__version__} vs {_MANIFEST['onnxruntime']}")


@pytest.mark.needs_ort_training
def test_cross_runtime_round_trip_in_process(tmp_path) -> None:
    manifest = make(tmp_path)
    assert manifest["artifacts"] and manifest["estimators"]
    for name in manifest["artifacts"]:
        got = train_artifact(tmp_path / f"{name}.train.onnx", load(tmp_path / f"{name}.batches.npz"))
        want = load(tmp_path / f"{name}.weights.npz")
        for w in want:
            np.testing.assert_array_equal(got[w], want[w], err_msg=f"{name}: {w}")
    for name in manifest["estimators"]:
        got = train_estimator(name, load(tmp_path / f"{name}.batches.npz"))
        want = load(tmp_path / f"{name}.weights.npz")
        for w in want:
            np.testing.assert_array_equal(got[w], want[w], err_msg=f"{name}: {w}")
