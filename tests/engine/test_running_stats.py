"""BatchNormalization in PyTorch's semantics and Dropout in training only (streamfit._engine.prepare.running_stats),
on the zoo's exports: frozen statistics, checkpointed state, seeded dropout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamfit._engine.trainer import Trainer
from streamfit.exceptions import BadInputError

ZOO = Path(__file__).resolve().parents[1] / "zoo"
BN = ZOO / "batchnorm1d_dropout.legacy.onnx"
BN_TRAIN = ZOO / "batchnorm1d_dropout.legacy_train.onnx"  # exported in training mode: Dropout nodes kept


def _data(rows=32, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, 8)).astype(np.float32)
    return X, (X[:, 0] - X[:, 1]).astype(np.float32)


def test_steps_update_the_running_statistics_and_predict_uses_them():
    trainer = Trainer(BN, learning_rate=0.01)
    before = trainer.running_statistics()
    X, y = _data()
    p0 = trainer.predict(X)
    trainer.step(X, y)
    after = trainer.running_statistics()
    assert not np.allclose(after["bn1.running_mean"], before["bn1.running_mean"])
    assert not np.allclose(trainer.predict(X), p0)
    # predict normalizes with the running statistics, never with the batch's own
    np.testing.assert_allclose(trainer.predict(X[:3]), trainer.predict(X)[:3], rtol=1e-5, atol=1e-6)


def test_frozen_statistics_stay_and_training_uses_them():
    trainer = Trainer(BN, learning_rate=0.01, freeze_batchnorm=True)
    before = trainer.running_statistics()
    assert before == {} and not trainer.prepared.running_stats
    X, y = _data()
    trainer.step(X[:1], y[:1])  # one row is fine: nothing is estimated from the batch
    exported = {i.name for i in trainer.to_onnx().graph.initializer}
    assert {"bn1.running_mean", "bn1.running_var"} <= exported


def test_one_row_batches_are_refused_clearly_for_batchnorm1d():
    trainer = Trainer(BN)
    X, y = _data()
    with pytest.raises(BadInputError, match="more than one value per channel.*freeze_batchnorm=True"):
        trainer.step(X[:1], y[:1])


def test_running_statistics_are_part_of_the_state():
    a = Trainer(BN, optimizer="adam", learning_rate=0.01)
    for seed in range(3):
        a.step(*_data(seed=seed))
    state = a.state_dict()
    assert set(state["buffers"]) == {"bn1.running_mean", "bn1.running_var"}
    b = Trainer(BN, optimizer="adam", learning_rate=0.01)
    b.load_state_dict(state)
    X, _ = _data(seed=9)
    np.testing.assert_array_equal(b.predict(X), a.predict(X))
    older = {k: v for k, v in state.items() if k != "buffers"}  # a checkpoint from before: still loads
    Trainer(BN, optimizer="adam", learning_rate=0.01).load_state_dict(older)


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_dropout_is_seeded_and_off_in_predict(step):
    X, y = _data(64)
    runs = {}
    for seed in (0, 0, 1):
        trainer = Trainer(BN_TRAIN, step=step, learning_rate=0.05, seed=seed)
        for _ in range(3):
            trainer.step(X, y)
        runs.setdefault(seed, []).append(trainer.get_weights()["fc2.weight"])
        np.testing.assert_array_equal(trainer.predict(X), trainer.predict(X))  # no dropout when predicting
    np.testing.assert_array_equal(runs[0][0], runs[0][1])
    assert not np.allclose(runs[0][0], runs[1][0])
    # the inference model: Dropout off, BatchNormalization in inference mode
    nodes = {n.op_type: n for n in trainer.to_onnx().graph.node}
    assert [a.i for a in nodes["BatchNormalization"].attribute if a.name == "training_mode"] == [0]


def test_estimators_expose_frozen_statistics_and_seed_dropout_from_random_state():
    from streamfit import OnnxRegressor

    X, y = _data(64)
    frozen = OnnxRegressor(BN, freeze_batchnorm=True, batch_size=1, max_iter=1).fit(X[:4], y[:4])
    assert frozen.trainer_.prepared.running_stats == () or not frozen.trainer_.prepared.running_stats
    weights = {}
    for rs in (3, 3, 4):
        reg = OnnxRegressor(BN_TRAIN, random_state=rs, batch_size=64, max_iter=3, eta0=0.05,
                            learning_rate="constant").fit(X, y)
        weights.setdefault(rs, []).append(reg.trainer_.get_weights()["fc2.weight"])
    np.testing.assert_array_equal(weights[3][0], weights[3][1])  # the same random_state: the same masks
    assert not np.allclose(weights[3][0], weights[4][0])
