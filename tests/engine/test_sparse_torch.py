"""Tables as PyTorch exports them (``nn.EmbeddingBag`` loops, ``nn.Embedding``), both exporters of torch 2.13:
trained row-sparsely, == the dense step, untouched rows bit-identical, predictions == the exported graph.
The files come from ``tests/engine/torch_embeddings/make_exports.py``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from streamfit._engine.trainer import Trainer
from streamfit.exceptions import ModelError

HERE = Path(__file__).resolve().parent / "torch_embeddings"
ROWS = 60  # table rows in every export
TRAINABLE = [(name, exporter) for name in ("bag_sum_2d", "bag_mean_2d", "embedding") for exporter in ("legacy", "dynamo")]
TABLE = {"bag_sum_2d": "bag.weight", "bag_mean_2d": "bag.weight", "embedding": "emb.weight"}


def _path(name: str, exporter: str) -> str:
    return str(HERE / f"{name}.{exporter}.onnx")


def _batches(width: int, steps: int, n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = rng.integers(0, ROWS // 2, (n, width))  # rows >= 30 never touched
        ids[0, -1] = ids[0, 0]  # a duplicate within a bag, and across bags
        ids[1, 0] = ids[0, 0]
        out.append(({"ids": ids}, rng.standard_normal(n).astype(np.float32)))
    return out


def _width(name: str) -> int:
    return 3 if name == "embedding" else 4


def _reference_session(path: str) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name,exporter", TRAINABLE)
def test_exported_tables_train_row_sparsely_as_the_dense_step(name, exporter):
    path = _path(name, exporter)
    steps = _batches(_width(name), 30)
    sparse = Trainer(path, optimizer="adagrad", learning_rate=0.1)  # sparse="auto": exact for AdaGrad
    dense = Trainer(path, optimizer="adagrad", learning_rate=0.1, sparse=False)
    table = TABLE[name]
    assert sparse._sparse is not None and list(sparse._sparse.arrays) == [table]
    assert dense._sparse is None
    initial = sparse.get_weights()[table].copy()
    X0 = steps[0][0]
    expected = _reference_session(path).run(None, X0)[0]
    np.testing.assert_allclose(sparse.predict(X0), expected, rtol=1e-6, atol=1e-6)  # the rewrite is exact
    for X, y in steps:
        ls, ld = sparse.step(X, y), dense.step(X, y)
        assert ls == pytest.approx(ld, rel=1e-5, abs=1e-6)
    ws, wd = sparse.get_weights(), dense.get_weights()
    for w in wd:
        np.testing.assert_allclose(ws[w], wd[w], rtol=1e-5, atol=1e-6, err_msg=w)
    np.testing.assert_array_equal(ws[table][ROWS // 2:], initial[ROWS // 2:])  # untouched rows: bit-identical
    assert not np.array_equal(ws[table][: ROWS // 2], initial[: ROWS // 2])
    # the export runs in plain onnxruntime and predicts what the trainer predicts
    exported = _reference_session(sparse.to_onnx().SerializeToString()).run(None, X0)[0]
    np.testing.assert_allclose(exported, sparse.predict(X0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_embedding_bag_sum_equals_a_numpy_bag_over_sgd_steps(exporter):
    """sum mode, plain SGD: y = bag(ids) @ w + b, so the table rows' gradient is known in closed form."""
    path = _path("bag_sum_2d", exporter)
    trainer = Trainer(path, optimizer="sgd", learning_rate=0.05)
    weights = {k: v.astype(np.float64) for k, v in trainer.get_weights().items()}
    E, W, b = weights["bag.weight"], weights["head.weight"], weights["head.bias"]
    for X, y in _batches(4, 20, seed=3):
        ids = X["ids"]
        out = E[ids].sum(axis=1) @ W.T + b
        g = (out[:, 0] - y) / len(y)  # dL/dout of the mean of 0.5 * (out - y)^2
        gE = np.zeros_like(E)
        np.add.at(gE, ids.reshape(-1), np.repeat(g[:, None] * W, ids.shape[1], axis=0))
        gW, gb = g @ E[ids].sum(axis=1), g.sum(keepdims=True)
        trainer.step(X, y)
        E, W, b = E - 0.05 * gE, W - 0.05 * gW[None, :], b - 0.05 * gb
    got = trainer.get_weights()
    np.testing.assert_allclose(got["bag.weight"], E, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["head.weight"], W, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,exporter,match", [
    ("bag_sum_offsets", "legacy", "offsets form"), ("bag_sum_offsets", "dynamo", "offsets form"),
    ("bag_mean_offsets", "legacy", "offsets form"), ("bag_mean_offsets", "dynamo", "offsets form"),
    ("bag_mean_2d_padding", "dynamo", "padding_idx")])
def test_embedding_bag_forms_that_cannot_be_rewritten_are_refused_clearly(name, exporter, match):
    with pytest.raises(ModelError, match=match):
        Trainer(_path(name, exporter))
