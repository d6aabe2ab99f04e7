"""Many steps in one session run (streamfit._engine.steps.scan): a chunk trained as one Scan gives what the same
steps give one ``Trainer.step`` call each -- outputs before each update, losses, weights, optimizer state,
running statistics, schedule and counters -- under both gradient builders and from a compiled artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from streamfit._engine.common.ort_private import has_ort_training
from streamfit._engine.compile import compile_artifact
from streamfit._engine.steps.scan import ChunkSteps, train_chunk
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import NonFiniteError
from streamfit.penalties import Penalty
from streamfit.schedules import CosineDecay, InvScaling

ZOO = Path(__file__).resolve().parents[1] / "zoo"
BN = ZOO / "batchnorm1d_dropout.legacy.onnx"  # BatchNorm1d (+ Dropout, off in this inference export)

GRADIENTS = ["streamfit", pytest.param("onnxruntime", marks=pytest.mark.skipif(
    not has_ort_training(), reason="onnxruntime-training's gradient builder is not installed"))]

RTOL, ATOL = 1e-6, 1e-7
#: the lean linear step's chunks against the step graph (see test_chunk_equals_step_by_step)
_LEAN_ATOL = 1e-6
#: an MLP's lean one-row step (steps/scan_mlp.py)
_LEAN_MLP_ATOL = 5e-6


def _data(kind: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    width = 8 if kind == "batchnorm" else 4
    X = rng.standard_normal((n, width)).astype(np.float32)
    if kind == "logistic":
        return X, (X[:, 0] + 0.5 * rng.standard_normal(n) > 0).astype(np.float32)
    if kind == "multinomial":
        return X, np.argmax(X[:, :3] + 0.3 * rng.standard_normal((n, 3)), axis=1).astype(np.int64)
    return X, (X[:, 0] - 2 * X[:, 1] + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _trainer(kind: str, gradient: str, optimizer: str = "adam", **kw: Any) -> Trainer:
    lr = kw.pop("learning_rate", 0.05)
    if kind == "linear":
        return Trainer(linear_model(4, seed=1), optimizer=optimizer, learning_rate=lr, gradient=gradient, **kw)
    if kind == "logistic":
        return Trainer(linear_model(4, seed=1), loss="log_loss", optimizer=optimizer, learning_rate=lr,
                       gradient=gradient, **kw)
    if kind == "multinomial":
        return Trainer(linear_model(4, 3, seed=1), loss="softmax_cross_entropy", optimizer=optimizer,
                       learning_rate=lr, gradient=gradient, **kw)
    if kind == "mlp":
        return Trainer(mlp_model([4, 16, 8, 1], activation=["Relu", "Tanh"], seed=2), optimizer=optimizer,
                       learning_rate=lr, gradient=gradient, **kw)
    if kind == "batchnorm":
        return Trainer(BN, optimizer=optimizer, learning_rate=lr, gradient=gradient, **kw)
    raise AssertionError(kind)


def _by_steps(trainer: Trainer, X: np.ndarray, y: np.ndarray, batch_size: int,
              sw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    outputs, losses = [], []
    for start in range(0, len(X), batch_size):
        sl = slice(start, start + batch_size)
        losses.append(trainer.step(X[sl], y[sl], None if sw is None else sw[sl]))
        outputs.append(trainer.last_output.copy())
    return np.concatenate(outputs), np.array(losses)


def assert_same_state(a: Trainer, b: Trainer, atol: float = ATOL) -> None:
    for what in ("get_weights", "optimizer_state", "running_statistics"):
        sa, sb = getattr(a, what)(), getattr(b, what)()
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_allclose(sa[k], sb[k], rtol=RTOL, atol=atol, err_msg=f"{what} {k}")
    assert (a.n_steps, a.n_skipped, a.schedule.t) == (b.n_steps, b.n_skipped, b.schedule.t)
    assert a.learning_rate == b.learning_rate


def _check_chunk(make: Callable[[], Trainer], X: np.ndarray, y: np.ndarray, batch_size: int,
                 sw: np.ndarray | None = None, chunks: int = 2, atol: float = ATOL) -> None:
    a, b = make(), make()
    ref_out, ref_loss = _by_steps(b, X, y, batch_size, sw)
    bounds = np.linspace(0, len(X), chunks + 1).astype(int)  # chunk edges fall inside steps' rows too
    outs, losses = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        r = train_chunk(a, X[lo:hi], y[lo:hi], None if sw is None else sw[lo:hi], batch_size=batch_size)
        assert r.scanned or hi - lo < 2 * batch_size
        assert r.nonfinite is None and r.applied == len(r.losses)
        outs.append(r.outputs)
        losses.append(r.losses)
    # the reference steps are aligned with each chunk's steps only when the chunk edges are step edges
    if all(b_ % batch_size == 0 for b_ in bounds):
        np.testing.assert_allclose(np.concatenate(outs).reshape(ref_out.shape), ref_out, rtol=RTOL, atol=atol)
        np.testing.assert_allclose(np.concatenate(losses), ref_loss, rtol=RTOL, atol=atol)
    assert_same_state(a, b, atol)


@pytest.mark.parametrize("gradient", GRADIENTS)
@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("kind", ["linear", "logistic", "multinomial", "mlp", "batchnorm"])
def test_chunk_equals_step_by_step(kind: str, batch_size: int, gradient: str) -> None:
    if kind == "batchnorm" and batch_size == 1:
        pytest.skip("BatchNorm1d trains on batches of more than one row")
    if kind == "batchnorm" and gradient == "streamfit":
        pytest.skip("streamfit's gradient builder has no BatchNormalization (ReduceMean, Sqrt) gradient")
    n = 4 * 32 * 3 if batch_size == 32 else 96
    X, y = _data(kind, n)
    # a linear model's chunks of small steps run its lean step (steps/scan_dense.py), an MLP's its own
    # (steps/scan_mlp.py), which round otherwise than the step graph: a few float32 ulps a step (3e-7 on a
    # logit of 0.17 seen after 56 steps of Adam)
    lean = kind in ("linear", "logistic")
    mlp_lean = kind == "mlp"  # its lean step: Adam lets its rounding wander more (test_chunk_mlp.py)
    _check_chunk(lambda: _trainer(kind, gradient), X, y, batch_size,
                 atol=_LEAN_MLP_ATOL if mlp_lean else _LEAN_ATOL if lean else ATOL)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov", "adagrad", "adamw", "rowwise_adagrad", "ftrl"])
def test_chunk_equals_step_by_step_per_optimizer(optimizer: str) -> None:
    X, y = _data("linear", 60)
    _check_chunk(lambda: _trainer("linear", "streamfit", optimizer, learning_rate=0.02), X, y, 3)


def _generic(tr: Trainer) -> Trainer:
    """``tr`` with the generic bodies (an MLP's lean one, within rounding of these: test_chunk_mlp.py)."""
    tr.lean_steps = False
    return tr


def test_sample_weights_and_a_short_last_step() -> None:
    X, y = _data("mlp", 100)
    sw = np.random.default_rng(3).uniform(0, 2, 100)
    # 100 rows at batch 7: 14 full steps in the Scan, then a last step of 2 rows
    _check_chunk(lambda: _generic(_trainer("mlp", "streamfit")), X, y, 7, sw, chunks=1)


def _body(trainer: Trainer) -> Any:
    (model,) = trainer.__dict__["_chunk_steps"].models.values()
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    return model, next(a.g for a in scan.attribute if a.name == "body")


def test_the_body_keeps_no_per_step_checks_and_one_parameter_vector() -> None:
    X, y = _data("mlp", 40)
    flat, per_weight = _trainer("mlp", "streamfit"), _trainer("mlp", "streamfit")
    _generic(flat), _generic(per_weight)
    per_weight.__dict__["_chunk_steps"] = ChunkSteps(per_weight)
    per_weight.__dict__["_chunk_steps"].flat = False
    train_chunk(flat, X, y, batch_size=1)
    train_chunk(per_weight, X, y, batch_size=1)
    assert_same_state(flat, per_weight)
    step = flat.step_graphs()["fused"]
    model, body = _body(flat)
    _, per_weight_body = _body(per_weight)
    outputs = [o.name for o in body.output]
    assert "Y" in outputs and "sf_loss" not in outputs  # the loss is computed after the Scan, from the outputs
    # Adam's update once over theta (and its two slots) instead of once per weight; no per-step check
    assert len(body.node) < len(per_weight_body.node) < len(step.graph.node)
    assert [i.name for i in body.input][:3] == ["sfc_theta", "sfc_theta__exp_avg", "sfc_theta__exp_avg_sq"]
    assert sum(n.op_type == "Sqrt" for n in body.node) == 1 < sum(n.op_type == "Sqrt" for n in per_weight_body.node)
    after = [n.op_type for n in model.graph.node[[n.op_type for n in model.graph.node].index("Scan") + 1:]]
    assert after.count("ReduceSum") == 4  # the loss, then the final check of theta and its two slots


@pytest.mark.parametrize("penalty, flat", [(Penalty(0.01, 0.5), False), (Penalty(0.01, 0.0), True), (None, True)])
# biases are not penalized: an L2 penalty adds its term to the penalized gradients before the concatenation, an L1
# part (a proximal step on some weights) keeps one update per weight
def test_one_parameter_vector_with_a_penalty(penalty: Any, flat: bool) -> None:
    X, y = _data("mlp", 60)
    _check_chunk(lambda: _generic(_trainer("mlp", "streamfit", "adam", penalty=penalty)), X, y, 3)
    trainer = _generic(_trainer("mlp", "streamfit", "adam", penalty=penalty))
    train_chunk(trainer, X, y, batch_size=3)
    assert bool(trainer.__dict__["_chunk_steps"].layouts) == flat


@pytest.mark.parametrize("schedule", [lambda: CosineDecay(0.1, decay_steps=45, eta_min=0.01),
                                      lambda: InvScaling(0.1, power_t=0.5)])
def test_a_schedule_crossing_chunk_boundaries(schedule: Callable[[], Any]) -> None:
    X, y = _data("linear", 90)
    # a linear model: its lean step, within a few ulps a step of the step graph (test_chunk_equals_step_by_step)
    _check_chunk(lambda: _trainer("linear", "streamfit", "adam", learning_rate=schedule()), X, y, 2, chunks=3,
                 atol=_LEAN_ATOL)


def test_a_loss_driven_schedule_runs_step_by_step_with_the_same_result() -> None:
    from streamfit.schedules import Adaptive

    X, y = _data("linear", 40)
    a, b = (_trainer("linear", "streamfit", "sgd", learning_rate=Adaptive(0.05, n_iter_no_change=2))
            for _ in range(2))
    r = train_chunk(a, X, y, batch_size=2)
    _by_steps(b, X, y, 2)
    assert not r.scanned
    assert_same_state(a, b)


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_nonfinite_row_inside_a_chunk(on_nonfinite: str) -> None:
    X, y = _data("linear", 30)
    X[17, 2] = 3e38  # its step's loss overflows float32
    a, b = (_trainer("linear", "streamfit", "sgd", on_nonfinite=on_nonfinite) for _ in range(2))
    if on_nonfinite == "raise":
        with pytest.raises(NonFiniteError) as got:
            train_chunk(a, X, y, batch_size=3)
        with pytest.raises(NonFiniteError) as ref:
            _by_steps(b, X, y, 3)
        assert got.value.step == ref.value.step == 6  # step 6 of 10 (rows 15-17) was not applied
        assert_same_state(a, b)
        return
    r = train_chunk(a, X, y, batch_size=3)
    _by_steps(b, X, y, 3)
    assert r.nonfinite == 5 and r.nonfinite_row == 15 and r.applied == 9
    assert not np.isfinite(r.losses[5]) and np.isfinite(np.delete(r.losses, 5)).all()
    assert_same_state(a, b)
    assert all(np.isfinite(w).all() for w in a.get_weights().values())


def test_a_resume_mid_stream_equals_the_uninterrupted_run() -> None:
    X, y = _data("mlp", 120)
    whole = _trainer("mlp", "streamfit", learning_rate=InvScaling(0.05))
    train_chunk(whole, X, y, batch_size=4)
    first = _trainer("mlp", "streamfit", learning_rate=InvScaling(0.05))
    train_chunk(first, X[:52], y[:52], batch_size=4)
    resumed = _trainer("mlp", "streamfit", learning_rate=InvScaling(0.05))
    resumed.load_state_dict(first.state_dict())
    train_chunk(resumed, X[52:], y[52:], batch_size=4)
    assert_same_state(resumed, whole)


@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_a_compiled_artifact_trains_chunks_as_step_by_step(batch_size: int) -> None:
    """streamfit's own gradient builder and portable graphs: runs on the newest plain onnxruntime too."""
    artifact = compile_artifact(mlp_model([4, 16, 1], seed=5), optimizer="adam", gradient="streamfit")
    X, y = _data("mlp", 96 if batch_size < 32 else 256)
    _check_chunk(lambda: Trainer(artifact, learning_rate=0.02), X, y, batch_size)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_host_tensors_given_per_step(batch_size: int) -> None:
    """A ready-made model's scaling: the running statistics after each step's rows, one value per step, read
    by that step only (as if written into host_arrays before it), never from rows after the step."""
    from streamfit.models._graphs import dense_model, standardized

    rng = np.random.default_rng(4)
    X = (rng.standard_normal((40, 3)) * [1.0, 5.0, 0.2] + [3.0, -1.0, 10.0]).astype(np.float32)
    y = (X @ np.array([1.0, -0.5, 2.0], np.float32)).astype(np.float32)
    steps = -(-len(X) // batch_size)
    ends = [min((k + 1) * batch_size, len(X)) for k in range(steps)]
    mean = np.stack([X[:e].mean(axis=0) for e in ends]).astype(np.float32)
    scale = np.stack([X[:e].std(axis=0) + 1.0 for e in ends]).astype(np.float32)

    def make() -> Trainer:
        layers = [(np.zeros((3, 1), np.float32), np.zeros(1, np.float32))]
        return Trainer(standardized(dense_model(layers), np.zeros(3), np.ones(3)), weights=["coef_0", "intercept_0"],
                       host=("sf_mean", "sf_scale"), optimizer="adam", learning_rate=0.05, gradient="streamfit")

    a, b = make(), make()
    r = train_chunk(a, X[:39], y[:39], batch_size=batch_size,
                    host_steps={"sf_mean": mean[:-(-39 // batch_size)], "sf_scale": scale[:-(-39 // batch_size)]})
    assert r.scanned
    outs = []
    for k in range(-(-39 // batch_size)):
        b.host_arrays["sf_mean"][...] = mean[k]
        b.host_arrays["sf_scale"][...] = scale[k]
        sl = slice(k * batch_size, min((k + 1) * batch_size, 39))
        b.step(X[sl], y[sl])
        outs.append(b.last_output.copy())
    np.testing.assert_allclose(r.outputs.ravel(), np.concatenate(outs).ravel(), rtol=RTOL, atol=ATOL)
    assert_same_state(a, b)
    for name in ("sf_mean", "sf_scale"):
        np.testing.assert_array_equal(a.host_arrays[name], b.host_arrays[name])
    with pytest.raises(ValueError, match="one value per step"):
        train_chunk(a, X[:6], y[:6], batch_size=batch_size, host_steps={"sf_mean": mean[:1]})


def _table_data(n: int, fields: int, buckets: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.zipf(1.5, (n, fields)) % buckets  # skewed: ids repeat within and across steps
    x = rng.standard_normal((n, 2)).astype(np.float32)
    y = (x[:, 0] + (ids[:, 0] % 3 == 0) > 0.5).astype(np.float32)
    return {"ids": ids.astype(np.int64), "x": x}, y


def _table_trainer(kind: str, optimizer: str, gradient: str = "streamfit") -> Trainer:
    from streamfit.models._fm_graph import fm_model

    factors = 3 if kind == "fm" else 0  # no factors: the hashed linear model's graph
    model = fm_model(4, 2, buckets=64, n_factors=factors, rng=np.random.default_rng(1), init_scale=0.1)
    return Trainer(model, loss="log_loss", optimizer=optimizer, learning_rate=0.05, sparse=True, gradient=gradient)


def _by_steps_named(trainer: Trainer, X: dict[str, np.ndarray], y: np.ndarray, batch_size: int) -> np.ndarray:
    outs = []
    for start in range(0, len(y), batch_size):
        sl = slice(start, start + batch_size)
        trainer.step({k: v[sl] for k, v in X.items()}, y[sl])
        outs.append(trainer.last_output.copy())
    return np.concatenate(outs)


@pytest.mark.parametrize("gradient", GRADIENTS)
@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("kind, optimizer", [("hashed", "sgd"), ("hashed", "ftrl"), ("hashed", "adagrad"),
                                             ("fm", "adam"), ("fm", "ftrl")])
def test_row_sparse_tables_chunk_equals_step_by_step(kind: str, optimizer: str, batch_size: int, gradient: str) -> None:
    """The chunk's distinct rows as one block the Scan carries: the tables, their optimizer state (lazy rules:
    untouched rows keep theirs) and the touched rows end as step by step."""
    X, y = _table_data(192 if batch_size == 32 else 90, 4, 64)
    a, b = _table_trainer(kind, optimizer, gradient), _table_trainer(kind, optimizer, gradient)
    assert a.tables is not None and sorted(a.tables.arrays) == (["factors", "linear"] if kind == "fm" else ["linear"])
    r = train_chunk(a, X, y, batch_size=batch_size)
    assert r.scanned
    ref = _by_steps_named(b, X, y, batch_size)
    np.testing.assert_allclose(r.outputs, ref, rtol=RTOL, atol=1e-6)
    assert_same_state(a, b)
    ta, tb = a.tables.touched(), b.tables.touched()  # type: ignore[union-attr]
    assert all(np.array_equal(ta.rows[k], tb.rows[k]) for k in tb.rows)


def test_a_chunk_of_many_ids_runs_in_blocks_that_stay_small() -> None:
    from streamfit._engine.steps import scan

    X, y = _table_data(300, 4, 64, seed=2)
    a, b = _table_trainer("hashed", "ftrl"), _table_trainer("hashed", "ftrl")
    before = scan.BLOCK_POSITIONS
    scan.BLOCK_POSITIONS = 64  # 16 steps of 4 ids per Scan
    try:
        r = train_chunk(a, X, y, batch_size=1)
    finally:
        scan.BLOCK_POSITIONS = before
    assert r.scanned and len(r.losses) == 300
    np.testing.assert_allclose(r.outputs, _by_steps_named(b, X, y, 1), rtol=RTOL, atol=1e-6)
    assert_same_state(a, b)


def test_an_id_outside_its_table_trains_the_steps_before_it_then_raises() -> None:
    from streamfit.exceptions import BadInputError

    X, y = _table_data(40, 4, 64)
    X["ids"][25, 2] = 64
    a, b = _table_trainer("hashed", "adagrad"), _table_trainer("hashed", "adagrad")
    with pytest.raises(BadInputError, match="outside the table 'linear'"):
        train_chunk(a, X, y, batch_size=5)
    with pytest.raises(BadInputError):
        _by_steps_named(b, X, y, 5)
    assert a.n_steps == b.n_steps == 5
    assert_same_state(a, b)


def test_trainer_step_chunk_is_train_chunk() -> None:
    X, y = _data("logistic", 30)
    a, b = _trainer("logistic", "streamfit"), _trainer("logistic", "streamfit")
    r = a.step_chunk(X, y, batch_size=4)
    s = train_chunk(b, X, y, batch_size=4)
    assert r.scanned and len(r.losses) == 8 and r.applied == 8
    np.testing.assert_array_equal(r.outputs, s.outputs)
    assert_same_state(a, b)
