"""Trainer(host=...): initializers the caller sets between steps, read by every step and prediction."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from streamfit import Trainer
from streamfit.exceptions import ModelError
from streamfit.models._graphs import dense_model, standardized


def _data(n: int = 64, d: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((n, d)) * [1.0, 5.0, 0.2] + [3.0, -1.0, 10.0]).astype(np.float32)
    return X, (X @ np.array([1.0, -0.5, 2.0], np.float32) + 0.25).astype(np.float32)


_ORT = pytest.mark.needs_ort_training  # the onnxruntime gradient builder


@pytest.mark.parametrize("step,gradient", [pytest.param("fused", "onnxruntime", marks=_ORT), ("fused", "streamfit"),
                                           pytest.param("forward_backward", "onnxruntime", marks=_ORT)])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_host_tensors_equal_scaling_on_the_host(step, gradient, optimizer):
    """A graph that scales X with host tensors the caller changes every step trains exactly as the plain
    graph fed host-scaled rows; predictions and the exported model use the current values."""
    X, y = _data()
    layers = [(np.zeros((3, 1), np.float32), np.zeros(1, np.float32))]
    d = 3
    inside = Trainer(standardized(dense_model(layers), np.zeros(d), np.ones(d)), weights=["coef_0", "intercept_0"],
                     host=("sf_mean", "sf_scale"), optimizer=optimizer, learning_rate=0.05, step=step, gradient=gradient)
    outside = Trainer(dense_model(layers), optimizer=optimizer, learning_rate=0.05, step=step, gradient=gradient)
    host = inside.host_arrays
    assert sorted(host) == ["sf_mean", "sf_scale"] and inside.weight_names == ["coef_0", "intercept_0"]
    for i in range(0, len(X), 4):  # batches of 4 and of 1, statistics changing before each step
        for sl in (slice(i, i + 3), slice(i + 3, i + 4)):
            seen = X[:sl.stop]
            mean, scale = seen.mean(axis=0).astype(np.float32), (seen.std(axis=0) + 1.0).astype(np.float32)
            host["sf_mean"][...] = mean
            host["sf_scale"][...] = scale
            a = inside.step(X[sl], y[sl])
            b = outside.step((X[sl] - mean) / scale, y[sl])
            assert a == b
    for name, value in outside.get_weights().items():
        np.testing.assert_array_equal(inside.get_weights()[name], value)
    np.testing.assert_array_equal(inside.predict(X), outside.predict((X - mean) / scale))
    exported = ort.InferenceSession(inside.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(exported.run(None, {"X": X})[0], inside.predict(X), rtol=1e-6, atol=1e-6)
    host["sf_scale"][...] = 2 * scale  # a later write is seen by the next prediction, not by the export above
    np.testing.assert_array_equal(inside.predict(X), outside.predict((X - mean) / (2 * scale)))


def test_host_tensors_must_be_untrained_float_initializers():
    model = standardized(dense_model([(np.zeros((2, 1)), np.zeros(1))]), np.zeros(2), np.ones(2))
    with pytest.raises(ModelError, match="host tensor 'nope'"):
        Trainer(model, weights=["coef_0", "intercept_0"], host=("nope",))
    with pytest.raises(ModelError, match="both trained and a host tensor"):
        Trainer(model, host=("sf_mean",))  # weights=None trains every float initializer, sf_mean included
