"""Adam's update as onnxruntime-training's kernel (streamfit._engine.steps.fused_adam): where a lean step runs it,
it computes streamfit's Adam -- against the standard nodes and the numpy reference, over many steps, at the
bias corrections' end -- and where it does not apply the nodes stay."""

from __future__ import annotations

import numpy as np
import pytest

from streamfit._engine.common.ort_private import has_ort_training
from streamfit._engine.steps import fused_adam
from streamfit._engine.steps.scan import train_chunk
from streamfit._engine.testing import linear_model, mlp_model
from streamfit._engine.trainer import Trainer
from streamfit.optim import Adam, AdamW
from tests.engine.test_chunk_steps import assert_same_state

needs_kernel = pytest.mark.skipif(not has_ort_training(), reason="the kernel is onnxruntime-training's")


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4)).astype(np.float32)
    return X, (X[:, 0] + 0.5 * rng.standard_normal(n) > 0).astype(np.float32)


def _trainer(**kw) -> Trainer:  # type: ignore[no-untyped-def]
    return Trainer(linear_model(4, seed=1), loss="log_loss", optimizer=kw.pop("optimizer", "adam"), learning_rate=0.05,
                   **kw)


def _kernel_nodes(tr: Trainer) -> int:
    return sum(n.op_type == "AdamOptimizer" for g in tr.step_graphs().values() for n in g.graph.node)


@needs_kernel
def test_the_training_build_has_the_kernel() -> None:
    assert fused_adam.kernel_available()


@needs_kernel
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9), (0.0, 0.99)])
def test_the_kernel_step_is_streamfits_adam_over_many_steps(monkeypatch: pytest.MonkeyPatch,
                                                             betas: tuple[float, float]) -> None:
    """One-row steps (the lean row step) and chunks of them, the kernel's against the standard nodes': the
    same outputs, weights and moments within float32 rounding after 400 steps."""
    X, y = _data(400)

    def run(kernel: bool) -> tuple[Trainer, np.ndarray]:
        with monkeypatch.context() as m:
            if not kernel:
                m.setattr(fused_adam, "applies", lambda tr: False)
            tr = _trainer(optimizer=Adam(*betas))
            got = [train_chunk(tr, X[:150], y[:150], batch_size=1).outputs]
            for i in range(150, 250):  # one step per call
                tr.step(X[i:i + 1], y[i:i + 1])
                got.append(tr.last_output)
            got.append(train_chunk(tr, X[250:], y[250:], batch_size=1).outputs)
        assert tr.step_kind == "fused" and tr.n_steps == 400
        return tr, np.concatenate([g.reshape(-1) for g in got])

    (a, out_a), (b, out_b) = run(True), run(False)
    assert _kernel_nodes(a) == 2 and _kernel_nodes(b) == 0  # the one-row step's and the small batches'
    assert {role for role, g in a.step_graphs().items() if any(n.op_type == "AdamOptimizer" for n in g.graph.node)} \
        == {"fused_row", "fused_batch"}
    np.testing.assert_allclose(out_a, out_b, rtol=1e-6, atol=1e-6)
    assert_same_state(a, b, 1e-6)


@needs_kernel
def test_the_kernel_step_matches_the_numpy_reference_past_the_last_fed_step_number() -> None:
    """Step numbers stop at 2**24, where float32 stops holding every integer; the bias corrections are exactly
    1 long before, so a step far past it is the numpy reference's.  The first step's correction is where a
    wrong step number shows most (a step of ``lr`` in every coordinate)."""
    for n_steps in (0, 1, 2 ** 24 + 12345):
        tr = _trainer()
        tr.n_steps = n_steps
        w0, s0 = tr.get_weights(), tr.optimizer_state()
        X, y = _data(1, seed=n_steps % 7)
        tr.step(X, y)
        assert tr.n_steps == n_steps + 1
        opt = tr.optimizer
        scal = dict(zip(opt.scalar_names, opt.scalars(0.05, n_steps)))
        z = float(X[0] @ w0["W"][:, 0] + w0["B"][0]) if "W" in w0 else None
        if z is None:
            pytest.skip("linear_model's weight names changed")
        gz = 1.0 / (1.0 + np.exp(-z)) - float(y[0])
        grads = {"W": X[0][:, None] * gz, "B": np.array([gz])}
        for w, g in grads.items():
            state = {s: s0[f"{w}__{s}"].astype(np.float64) for s in opt.slots}
            want, new_state = opt.numpy_update(w0[w].astype(np.float64), g.reshape(w0[w].shape), state, scal)
            np.testing.assert_allclose(tr.get_weights()[w], want, rtol=1e-6, atol=1e-7, err_msg=f"{n_steps} {w}")
            for s in opt.slots:
                np.testing.assert_allclose(tr.optimizer_state()[f"{w}__{s}"], new_state[s], rtol=1e-5, atol=1e-12)


@needs_kernel
@pytest.mark.parametrize("make, rows", [(lambda: _trainer(), 1), (lambda: _trainer(), 8),
                                        (lambda: Trainer(mlp_model([4, 8, 1], activation="Relu", seed=2),
                                                         loss="log_loss", optimizer="adam", learning_rate=0.05), 1)],
                         ids=["dense-one-row", "dense-8-rows", "mlp-one-row"])
def test_the_kernel_never_writes_the_live_values_it_reads(make, rows: int) -> None:  # type: ignore[no-untyped-def]
    """The kernel writes its outputs over its inputs (onnxruntime's alias); bound as the lean steps bind it, the
    live set it reads stays as it was (the next step, and the replay after a non-finite one, start from it)."""
    X, y = _data(96)
    tr = make()
    tr.step(X[:rows], y[:rows])  # the one-row step (or a minibatch's)
    train_chunk(tr, X[:48], y[:48], batch_size=rows)
    for run in (lambda: tr.step(X[:rows], y[:rows]), lambda: train_chunk(tr, X[48:], y[48:], batch_size=rows)):
        live = tr.params.current
        before = {n: v.numpy().copy() for n, v in tr.params.sets[live].items()}
        columns = {n: v.numpy().copy() for n, v in tr.params.column_sets[live].items()}
        run()
        assert tr.params.current != live
        for n, a in before.items():
            np.testing.assert_array_equal(tr.params.sets[live][n].numpy(), a, err_msg=n)
        for n, a in columns.items():
            np.testing.assert_array_equal(tr.params.column_sets[live][n].numpy(), a, err_msg=n)
    graphs = list(tr.step_graphs().values()) + list(tr.__dict__["_chunk_steps"].models.values())
    assert any(_holds_kernel(g.graph) for g in graphs)


def _holds_kernel(graph) -> bool:  # type: ignore[no-untyped-def]
    return any(n.op_type == "AdamOptimizer" or any(a.g.node and _holds_kernel(a.g) for a in n.attribute)
               for n in graph.node)


def test_step_numbers_stop_where_float32_stops_holding_integers() -> None:
    np.testing.assert_array_equal(fused_adam.step_numbers(4, 3), [5, 6, 7])
    last = fused_adam.step_numbers(2 ** 24 - 2, 4)
    np.testing.assert_array_equal(last, [2 ** 24 - 1, 2 ** 24, 2 ** 24, 2 ** 24])
    assert np.array_equal(last.astype(np.float32).astype(np.float64), last)  # exact in float32
    assert fused_adam.step_number(0) == 1.0 and fused_adam.step_number(2 ** 30) == 2.0 ** 24


def test_where_the_kernel_does_not_apply_the_nodes_stay() -> None:
    """AdamW (another rule), a portable trainer (plain onnxruntime has no kernel), betas whose float32 powers do
    not vanish by step 2**24 (the step number fed stops there)."""
    for kw in ({"optimizer": AdamW()}, {"portable": True}, {"optimizer": Adam(beta2=0.99999)}):
        tr = Trainer(linear_model(4, seed=1), loss="log_loss", learning_rate=0.05, **{"optimizer": "adam", **kw})
        assert not fused_adam.applies(tr)
        tr.step(*_data(1))
        assert _kernel_nodes(tr) == 0


def test_adam_takes_its_betas_as_float32_values() -> None:
    """The moments' coefficients and the bias corrections use one float32 beta (as the kernel does): then the
    corrected second moment of a constant gradient is that gradient's square, at every step."""
    opt = Adam()
    b1, b2 = opt.betas()
    assert (b1, b2) == (float(np.float32(0.9)), float(np.float32(0.999)))
    g = np.array([0.3])
    state = opt.init_state(np.zeros(1))
    w = np.zeros(1)
    for t in range(50):
        s = dict(zip(opt.scalar_names, opt.scalars(0.1, t)))
        w, state = opt.numpy_update(w, g, state, s)
        v_hat = state["exp_avg_sq"] * s["inv_sqrt_bc2"] ** 2
        assert v_hat[0] == pytest.approx(0.09, rel=1e-14)
