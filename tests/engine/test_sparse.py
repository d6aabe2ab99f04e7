"""Row-sparse updates of embedding tables: == the dense/numpy reference for every optimizer, duplicates summed,
untouched rows bit-identical, refused steps write nothing."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.prepare.model import prepare_model
from streamfit._engine.steps.tables import find_tables
from streamfit._engine.trainer import Trainer
from streamfit.exceptions import BadInputError, NonFiniteError
from streamfit.optim import FTRL, SGD, AdaGrad, Adam, Momentum, RowWiseAdaGrad
from streamfit.penalties import Penalty

ROWS, DIM, FIELDS = 50, 3, 4


def embedding_model(rows=ROWS, dim=DIM, fields=FIELDS, dtype=np.float64, seed=0, extra_use=False, table_scale=0.5):
    """``Y = sum_f E[ids[:, f]] @ c + x @ v + b``: a table read by Gather, a dense projection, a dense input."""
    rng = np.random.default_rng(seed)
    elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    inits = [numpy_helper.from_array((rng.standard_normal((rows, dim)) * table_scale).astype(dtype), "E"),
             numpy_helper.from_array((rng.standard_normal((dim, 1)) * 0.5).astype(dtype), "c"),
             numpy_helper.from_array((rng.standard_normal((2, 1)) * 0.5).astype(dtype), "v"),
             numpy_helper.from_array(np.zeros(1, dtype), "b"), numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Gather", ["E", "ids"], ["rows"]),
             helper.make_node("ReduceSum", ["rows", "ax"], ["pooled"], keepdims=0),
             helper.make_node("MatMul", ["pooled", "c"], ["m"]), helper.make_node("MatMul", ["x", "v"], ["xv"]),
             helper.make_node("Add", ["m", "xv"], ["mx"]), helper.make_node("Add", ["mx", "b"], ["Y"])]
    if extra_use:  # E also read by a MatMul: not a sparse table any more
        nodes[-1] = helper.make_node("Add", ["mx", "b"], ["Y0"])
        nodes += [helper.make_node("ReduceSum", ["E"], ["esum"], keepdims=0), helper.make_node("Add", ["Y0", "esum"], ["Y"])]
    graph = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", fields]),
                                             helper.make_tensor_value_info("x", elem, ["N", 2])],
                              [helper.make_tensor_value_info("Y", elem, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def batches(steps=100, n=6, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        ids = rng.integers(0, ROWS // 2, (n, FIELDS))  # rows >= 25 never touched
        ids[0, 1] = ids[0, 0]  # a duplicate id in a row ...
        ids[1, 2] = ids[0, 0]  # ... and across rows
        x = rng.standard_normal((n, 2))
        y = rng.standard_normal(n)
        out.append((ids, x, y))
    return out


def numpy_reference(opt, steps, lr, penalty=None):
    """The same model in numpy: dense weights by the dense rule, the table lazily (touched rows only)."""
    init = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in embedding_model().graph.initializer}
    w = {k: init[k].copy() for k in ("E", "c", "v", "b")}
    state = {k: opt.init_state(w[k]) for k in w}
    for t, (ids, x, y) in enumerate(steps):
        n = len(y)
        pooled = w["E"][ids].sum(axis=1)
        r = (pooled @ w["c"] + x @ w["v"] + w["b"]).ravel() - y
        dy = (r / (1 if opt.summed_gradient else n))[:, None]  # FTRL: the summed loss
        grads = {"c": pooled.T @ dy, "v": x.T @ dy, "b": dy.sum(axis=0)}
        g_rows = np.repeat((dy @ w["c"].T)[:, None, :], FIELDS, axis=1).reshape(-1, DIM)
        uniq, inv = np.unique(ids.ravel(), return_inverse=True)
        g_e = np.zeros((len(uniq), DIM))
        np.add.at(g_e, inv.ravel(), g_rows)
        s = dict(zip(opt.scalar_names, opt.scalars(lr, t)))
        for k in ("c", "v", "b"):
            g = grads[k]
            if penalty is not None and k != "b":
                g = penalty.numpy_gradient(w[k], g)
            w[k], state[k] = opt.numpy_update(w[k], g, state[k], s)
            if penalty is not None and k != "b":
                w[k] = penalty.numpy_proximal(w[k], lr)
        rows_state = {slot: v[uniq] for slot, v in state["E"].items()}
        g = g_e if penalty is None else penalty.numpy_gradient(w["E"][uniq], g_e)
        new, new_state = opt.numpy_update(w["E"][uniq], g, rows_state, s)
        w["E"][uniq] = new if penalty is None else penalty.numpy_proximal(new, lr)
        for slot, v in new_state.items():
            state["E"][slot][uniq] = v
    return w, state, init


def train(opt, steps, lr, sparse=True, penalty=None, model=None, **kw):
    trainer = Trainer(model or embedding_model(), optimizer=opt, learning_rate=lr, sparse=sparse, penalty=penalty, **kw)
    for ids, x, y in steps:
        trainer.step({"ids": ids, "x": x}, y)
    return trainer


OPTIMIZERS = [SGD(), AdaGrad(eps=1e-8), RowWiseAdaGrad(eps=1e-8), Adam(), FTRL(beta=0.5, l1=0.001, l2=0.01),
              Momentum(0.5)]


def test_tables_found_only_when_read_by_gather_alone():
    assert [t.name for t in find_tables(prepare_model(embedding_model()))] == ["E"]
    assert find_tables(prepare_model(embedding_model(extra_use=True))) == ()


def test_auto_trains_sparsely_only_where_that_is_the_dense_step():
    def tables(**kw):
        trainer = Trainer(embedding_model(), **kw)
        return trainer._sparse is not None

    assert tables(optimizer="sgd") and tables(optimizer="adagrad") and tables(optimizer="ftrl")
    assert not tables(optimizer="adam") and tables(optimizer="adam", sparse=True)
    assert not tables(optimizer="sgd", penalty=Penalty(alpha=0.01)) and not tables(optimizer="sgd", sparse=False)
    assert not tables(optimizer="sgd", step="forward_backward", sparse=True)
    with pytest.raises(ValueError, match="sparse must be True, False or 'auto'"):
        tables(sparse="yes")


@pytest.mark.parametrize("penalty", [None, Penalty(alpha=0.01, l1_ratio=0.5)], ids=["none", "elastic"])
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_sparse_update_matches_numpy_reference(opt, penalty):
    steps = batches()
    trainer = train(opt, steps, 0.05, penalty=penalty)
    assert trainer._sparse is not None and trainer._train_pm.weights == ["c", "v", "b"]
    ref_w, ref_state, init = numpy_reference(opt, steps, 0.05, penalty)
    got = trainer.get_weights()
    assert list(got) == ["E", "c", "v", "b"]
    for k in ref_w:
        np.testing.assert_allclose(got[k], ref_w[k], rtol=1e-5, atol=1e-12, err_msg=k)
    state = trainer.optimizer_state()
    for k, slots in ref_state.items():
        for slot, value in slots.items():
            np.testing.assert_allclose(state[f"{k}__{slot}"], value, rtol=1e-5, atol=1e-12, err_msg=f"{k} {slot}")
    untouched = np.setdiff1d(np.arange(ROWS), np.concatenate([s[0].ravel() for s in steps]))
    assert len(untouched) >= ROWS // 2
    np.testing.assert_array_equal(got["E"][untouched], init["E"][untouched])  # bit-identical
    for slot, value in opt.init_state(init["E"]).items():
        np.testing.assert_array_equal(state[f"E__{slot}"][untouched], value[untouched])


@pytest.mark.parametrize("opt", [SGD(), AdaGrad(eps=1e-8), RowWiseAdaGrad(eps=1e-8), FTRL(beta=0.5, l1=0.001)], ids=repr)
def test_sparse_equals_dense_training_where_the_rules_agree(opt):
    # rows untouched by a batch get a zero gradient in the dense step: no change for these rules (FTRL: for
    # rows at zero; its dense step materializes every row from z and n, pulling a nonzero start to zero)
    steps = batches(steps=100)
    model = embedding_model(table_scale=0.0 if isinstance(opt, FTRL) else 0.5)
    sparse, dense = train(opt, steps, 0.05, model=model), train(opt, steps, 0.05, sparse=False, model=model)
    assert dense._sparse is None
    for k, v in dense.get_weights().items():
        np.testing.assert_allclose(sparse.get_weights()[k], v, rtol=1e-5, atol=1e-12, err_msg=k)
    fb = train(opt, steps[:20], 0.05, step="forward_backward")  # dense there: backward() gives dense gradients
    assert fb._sparse is None


def test_lazy_adam_differs_from_dense_adam_on_untouched_rows():
    steps = batches(steps=30)
    sparse, dense = train(Adam(), steps, 0.05), train(Adam(), steps, 0.05, sparse=False)
    E0 = numpy_helper.to_array(embedding_model().graph.initializer[0])
    rows_touched_once = np.unique(steps[0][0])
    later = np.unique(np.concatenate([s[0].ravel() for s in steps[1:]]))
    drifting = np.setdiff1d(rows_touched_once, later)  # touched at step 1 only: dense Adam keeps moving them
    if len(drifting):
        assert not np.allclose(dense.get_weights()["E"][drifting], sparse.get_weights()["E"][drifting])
    np.testing.assert_array_equal(sparse.get_weights()["E"][ROWS // 2:], E0[ROWS // 2:])


def test_refused_step_writes_no_row_and_bad_ids_are_named():
    trainer = Trainer(embedding_model(), optimizer="adagrad", learning_rate=0.05, on_nonfinite="skip", sparse=True)
    ids, x, y = batches(steps=1)[0]
    trainer.step({"ids": ids, "x": x}, y)
    before, state = trainer.get_weights(), trainer.optimizer_state()
    x_bad = x.copy()
    x_bad[2, 1] = np.inf
    trainer.step({"ids": ids, "x": x_bad}, y)
    assert trainer.n_skipped == 1
    for k, v in trainer.get_weights().items():
        np.testing.assert_array_equal(v, before[k])
    for k, v in trainer.optimizer_state().items():
        np.testing.assert_array_equal(v, state[k])
    bad = ids.copy()
    bad[3, 2] = ROWS
    with pytest.raises(BadInputError, match=r"input 'ids': id 50 at row 3, position \(2,\) is outside the table 'E' "
                                            r"of 50 rows") as info:
        trainer.step({"ids": bad, "x": x}, y)
    assert info.value.reason == "out_of_range"
    raising = Trainer(embedding_model(), optimizer="sgd", learning_rate=0.05)
    with pytest.raises(NonFiniteError):
        raising.step({"ids": ids, "x": x_bad}, y)
    np.testing.assert_array_equal(raising.get_weights()["E"], numpy_helper.to_array(embedding_model().graph.initializer[0]))


def test_negative_ids_wrap_as_gather_does_and_share_rows():
    steps = [(np.array([[-1, ROWS - 1, 0, -ROWS]]), np.ones((1, 2)), np.array([1.0]))]
    a = train(SGD(), steps, 0.1)
    b = train(SGD(), [(np.array([[ROWS - 1, ROWS - 1, 0, 0]]), np.ones((1, 2)), np.array([1.0]))], 0.1)
    np.testing.assert_array_equal(a.get_weights()["E"], b.get_weights()["E"])


def test_predict_state_dict_and_export_see_the_trained_table():
    steps = batches(steps=20)
    trainer = train(AdaGrad(), steps, 0.1)
    ids, x, _ = steps[0]
    pred = trainer.predict({"ids": ids, "x": x})
    sess = ort.InferenceSession(trainer.to_onnx().SerializeToString())
    np.testing.assert_allclose(sess.run(None, {"ids": ids, "x": x})[0], pred, rtol=1e-12)
    copy = Trainer(embedding_model(seed=5), optimizer="adagrad", learning_rate=0.1)
    copy.load_state_dict(trainer.state_dict())
    np.testing.assert_array_equal(copy.predict({"ids": ids, "x": x}), pred)
    for ids, x, y in batches(steps=5, seed=9):
        trainer.step({"ids": ids, "x": x}, y)
        copy.step({"ids": ids, "x": x}, y)
    np.testing.assert_array_equal(copy.get_weights()["E"], trainer.get_weights()["E"])


def test_float32_tables_and_large_batches():
    trainer = Trainer(embedding_model(dtype=np.float32), optimizer="adam", learning_rate=0.01, sparse=True)
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = rng.integers(0, ROWS, (300, FIELDS))
        trainer.step({"ids": ids, "x": rng.standard_normal((300, 2))}, rng.standard_normal(300))
    assert trainer.get_weights()["E"].dtype == np.float32 and trainer._sparse.touched_rows == ROWS


def test_a_step_non_finite_only_in_the_touched_rows_is_refused():
    # FTRL on a zero table with a huge projection: loss and dense updates finite, the rows' n overflows
    trainer = Trainer(embedding_model(table_scale=0.0), optimizer=FTRL(), learning_rate=0.1, on_nonfinite="skip")
    trainer.set_weights({"c": np.full((DIM, 1), 1e200)})
    before, state = trainer.get_weights(), trainer.optimizer_state()
    ids, x, y = batches(steps=1)[0]
    trainer.step({"ids": ids, "x": x}, y)
    assert trainer.n_skipped == 1 and np.isfinite(trainer.last_loss)
    for k, v in trainer.get_weights().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    for k, v in trainer.optimizer_state().items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
