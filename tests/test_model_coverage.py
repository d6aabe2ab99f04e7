"""Model coverage round two (issue 21): ``streamfit check`` passes BERT-like models and says which initializers
train, HardSwish/HardSigmoid gradients against finite differences, recurrent variants
refused by name, random ops' eval form, and onnxruntime's errors as ModelErrors naming the node."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.trainer import Trainer
from streamfit.cli import main
from streamfit.exceptions import ModelError

ZOO2 = Path(__file__).resolve().parent / "zoo2"


@pytest.fixture(autouse=True, scope="module")
def _own_cache(tmp_path_factory):
    old = os.environ.get("STREAMFIT_CACHE_DIR")
    os.environ["STREAMFIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    os.environ["STREAMFIT_CACHE_DIR"] = old or ""


def _model(nodes, inputs, inits, out=("y", ["N", 1]), opset=17):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(out[0], TensorProto.FLOAT, out[1])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


# -- streamfit check and train ------------------------------------------------------------------------------

def test_check_passes_bert_and_says_which_initializers_train(capsys):
    """The dynamo export of BERT (before: refused, a raw 'Invalid rank for output' from the fused step)."""
    assert main(["check", str(ZOO2 / "bert.dynamo.onnx"), "--task", "classification"]) == 0
    out = capsys.readouterr().out
    assert "preflight passed" in out
    assert "weights: 41 initializers train (13 made by the exporter), 6 constants; the rule: " in out
    assert "constant val_69 [scalar]: a scalar (rank 0)" in out  # the mask's -3.4e38
    assert "trained  embedding_2 [1x8x16]: made by the exporter" in out  # the position embeddings' folded slice


@pytest.mark.slow
def test_check_says_the_exporter_untied_gpt2s_embeddings(capsys):
    assert main(["check", str(ZOO2 / "gpt2.legacy.onnx"), "--task", "classification"]) == 0
    out = capsys.readouterr().out
    assert ("trained  onnx::MatMul_595 [16x64]: an untied copy of model.transformer.wte.weight (transposed)"
            in out), out


def test_train_runs_bert_from_parquet_with_the_default_preflight(tmp_path, capsys):
    ref = np.load(ZOO2 / "bert.npz")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (96, 8))
    lengths = rng.integers(3, 9, 96)
    mask = (np.arange(8)[None, :] < lengths[:, None]).astype(np.int64)
    cols = {**{f"i{k}": ids[:, k] for k in range(8)}, **{f"m{k}": mask[:, k] for k in range(8)},
            "label": rng.integers(0, 3, 96)}
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table(cols), tmp_path / "data" / "part-000.parquet")
    assert ref["in_input_ids"].shape[1] == 8
    code = main(["train", "--source", f"parquet:{tmp_path / 'data'}", "--model", str(ZOO2 / "bert.dynamo.onnx"),
                 "--task", "classification", "--input", "input_ids=" + ",".join(f"i{k}" for k in range(8)),
                 "--input", "attention_mask=" + ",".join(f"m{k}" for k in range(8)), "--label", "label",
                 "--no-progress", "--checkpoint-dir", str(tmp_path / "ck"), "--batch-size", "16"])
    assert code == 0, capsys.readouterr().err
    assert any((tmp_path / "ck").iterdir())


# -- HardSwish / HardSigmoid --------------------------------------------------------------------------------

def test_hard_activations_gradients_match_finite_differences():
    """x -> MatMul W -> HardSwish -> MatMul V -> HardSigmoid(alpha 0.3, beta 0.4): the gradient of the rewritten
    ops (before: 'The gradient builder has not been registered: HardSwish') against central differences of the
    author's graph (predict), away from the kinks."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((4, 5)).astype(np.float32)
    V = (0.5 * rng.standard_normal((5, 1))).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("HardSwish", ["a"], ["h"]),
             helper.make_node("MatMul", ["h", "V"], ["b"]),
             helper.make_node("HardSigmoid", ["b"], ["y"], alpha=0.3, beta=0.4)]
    model = _model(nodes, [("x", TensorProto.FLOAT, ["N", 4])], {"W": W, "V": V})
    X = rng.standard_normal((6, 4)).astype(np.float32)
    trainer = Trainer(model, step="forward_backward")
    trainer.forward(X)
    grads = trainer.backward(np.ones((6, 1), np.float32))
    eps = 1e-3
    for name, value in (("W", W), ("V", V)):
        numeric = np.zeros_like(value, dtype=np.float64)
        for idx in np.ndindex(value.shape):
            for sign in (1, -1):
                w = value.copy()
                w[idx] += sign * eps
                trainer.set_weights({name: w})
                numeric[idx] += sign * float(trainer.predict(X).astype(np.float64).sum()) / (2 * eps)
            trainer.set_weights({name: value})
        np.testing.assert_allclose(grads[name], numeric, rtol=2e-2, atol=2e-3, err_msg=name)
        assert np.abs(numeric).max() > 1e-2  # the gradient is not trivially zero


# -- recurrent variants -------------------------------------------------------------------------------------

def test_a_bidirectional_lstm_with_sequence_lens_whose_cell_state_is_read_is_refused_naming_the_node():
    """sequence_lens itself trains now (tests/engine/test_zoo_recurrent.py); the cell state of a masked run is
    not in its Y."""
    H, I = 3, 2
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((2, 4 * H, I)).astype(np.float32),
             "R": rng.standard_normal((2, 4 * H, H)).astype(np.float32)}
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "", "lens"], ["Y", "Yh", "Yc"], hidden_size=H,
                              direction="bidirectional", name="packed_lstm"),
             helper.make_node("ReduceSum", ["Yc"], ["y"], keepdims=0)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [4, "N", I]), ("lens", TensorProto.INT32, ["N"])], inits,
                   out=("y", []))
    with pytest.raises(ModelError, match="LSTM node 'packed_lstm' \\(direction=bidirectional\\).*sequence_lens"):
        Trainer(model)


# -- random ops ---------------------------------------------------------------------------------------------

def _dropout_by_hand(compare: str, keep: float) -> onnx.ModelProto:
    """y = (x @ W) * Cast(u < keep) / keep, the mask's comparison spelled ``compare`` (Less, or Greater with
    the draw on the right)."""
    W = np.full((3, 2), 0.5, np.float32)
    cmp_in = ["u", "keep"] if compare == "Less" else ["keep", "u"]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("RandomUniformLike", ["h"], ["u"]),
             helper.make_node("Constant", [], ["keep"], value=numpy_helper.from_array(np.array(keep, np.float32))),
             helper.make_node(compare, cmp_in, ["m"]), helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["mf", "keep"], ["s"]), helper.make_node("Mul", ["h", "s"], ["y"])]
    return _model(nodes, [("x", TensorProto.FLOAT, ["N", 3])], {"W": W}, out=("y", ["N", 2]))


@pytest.mark.parametrize("compare", ["Less", "Greater"])
def test_hand_written_dropout_is_the_identity_in_predict_and_to_onnx_and_random_in_training(compare):
    trainer = Trainer(_dropout_by_hand(compare, 0.7), learning_rate=1e-30)
    X = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
    np.testing.assert_allclose(trainer.predict(X), X @ np.full((3, 2), 0.5, np.float32), rtol=1e-6)
    sess = ort.InferenceSession(trainer.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], trainer.predict(X))
    assert not any(n.op_type.startswith("Random") for n in trainer.to_onnx().graph.node)
    trainer.step(X, np.zeros((64, 2), np.float32))  # training draws: about 30 % of the outputs dropped
    graphs = trainer.step_graphs()
    seeded = [n for g in graphs.values() for n in g.graph.node if n.op_type == "RandomUniformLike"]
    assert seeded and all(any(a.name == "seed" for a in n.attribute) for n in seeded)


def test_a_random_op_without_a_known_eval_form_is_refused_naming_it():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("RandomUniformLike", ["h"], ["u"]),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
             helper.make_node("Less", ["u", "c"], ["m"], name="mask"),
             helper.make_node("Where", ["m", "h", "c"], ["y"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, ["N", 3])], {"W": np.ones((3, 1), np.float32)})
    with pytest.raises(ModelError, match="RandomUniformLike node 'u'.*used as a bool"):
        Trainer(model)


# -- onnxruntime's errors -----------------------------------------------------------------------------------

def test_onnxruntime_errors_become_model_errors_naming_the_node():
    """A real onnxruntime failure (a Reshape to a size its input does not have), and a kernel's refusal naming
    an op type (the text of 1.19.2's LSTM training kernel), looked up in the model."""
    from streamfit._engine.common.ort_errors import as_model_error

    shape = numpy_helper.from_array(np.array([5, 7], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="bad_reshape")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception) as raw:
        sess.run(None, {"x": np.zeros((2, 3), np.float32)})
    err = as_model_error(raw.value, "running the forward/backward step", model)
    assert isinstance(err, ModelError)
    assert str(err).startswith("onnxruntime failed running the forward/backward step at node 'bad_reshape': ")
    lstm = onnx.load(ZOO2 / "bilstm.legacy.onnx")
    text = ("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Exception during initialization: /onnxruntime_src/"
            "orttraining/orttraining/training_ops/cpu/rnn/lstm_io_utils.cc:156 onnxruntime::lstm::LSTMAttributes::"
            "LSTMAttributes(const onnxruntime::OpKernelInfo&) direction == rnn::detail::Direction::kForward was "
            "false. LSTM and LSTMGrad kernel only supports the forward direction for now. Provided direction: 2")
    err = as_model_error(RuntimeError(text), "building the forward/backward step", lstm)
    assert "at LSTM nodes '/rnn/LSTM', '/rnn/LSTM_1'" in str(err) and "only supports the forward direction" in str(err)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_the_two_forward_nodes_compute_what_the_bidirectional_node_does(op):
    """Against onnxruntime's own bidirectional kernel (inference), with initial states given and a reverse-only
    node; then the model trains (before: the training kernel's refusal).  (onnxruntime runs layout 0 only.)"""
    from streamfit._engine.common.onnx_helpers import ShapedRewriter
    from streamfit._engine.prepare.recurrent import bidirectional_rnn

    H, I, T, N = 3, 2, 4, 5
    g = 4 if op == "LSTM" else 3
    layout = 0
    rng = np.random.default_rng(1)
    for direction, D in (("bidirectional", 2), ("reverse", 1)):
        inits = {"W": rng.standard_normal((D, g * H, I)).astype(np.float32),
                 "R": rng.standard_normal((D, g * H, H)).astype(np.float32),
                 "B": rng.standard_normal((D, 2 * g * H)).astype(np.float32),
                 "h0": rng.standard_normal((D, N, H)).astype(np.float32),
                 "c0": rng.standard_normal((D, N, H)).astype(np.float32)}
        extra = {"linear_before_reset": 1} if op == "GRU" else {}
        states = ["h0"] + (["c0"] if op == "LSTM" else [])
        if op == "GRU":
            del inits["c0"]
        # rows first outside (streamfit's batch axis), time first inside (layout 0), as PyTorch exports it
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
                 helper.make_node(op, ["xt", "W", "R", "B", ""] + states, ["Y", "Yh"], hidden_size=H,
                                  direction=direction, layout=layout, name="rnn", **extra),
                 helper.make_node("Transpose", ["Y"], ["Yn"], perm=[2, 0, 1, 3]),
                 helper.make_node("Transpose", ["Yh"], ["Yhn"], perm=[1, 0, 2]),
                 helper.make_node("Flatten", ["Yn"], ["F"]), helper.make_node("Flatten", ["Yhn"], ["Fh"]),
                 helper.make_node("Concat", ["F", "Fh"], ["C"], axis=1),
                 helper.make_node("ReduceSum", ["C", "one"], ["y"], keepdims=1)]
        inits["one"] = np.array([1], np.int64)
        x_shape = [N, T, I]
        model = _model(nodes, [("x", TensorProto.FLOAT, x_shape)], inits, out=("y", [N, 1]), opset=17)
        X = rng.standard_normal(x_shape).astype(np.float32)
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(model)
        rw = ShapedRewriter(rewritten)
        new = []
        for node in rewritten.graph.node:
            new.extend(bidirectional_rnn(rw, node) or [node])
        del rewritten.graph.node[:]
        rewritten.graph.node.extend(new)
        rewritten.graph.initializer.extend(rw.consts)
        assert not any(n.op_type == op and any(a.name == "direction" and a.s != b"forward" for a in n.attribute)
                       for n in rewritten.graph.node)
        outs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
                for m in (model, rewritten)]
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        trainer = Trainer(model, optimizer="adam", learning_rate=0.05)
        target = np.zeros((N, 1), np.float32)
        losses = [trainer.step(X, target) for _ in range(20)]
        assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("step", ["fused", "forward_backward"])
def test_a_kernel_failing_on_a_batch_is_a_model_error_naming_the_node(step):
    """A Reshape to [-1, 4] of a [N, 2] tensor fails for odd N inside onnxruntime (before: its raw
    RuntimeError from predict and from the step)."""
    W = np.ones((3, 2), np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="bad_reshape")]
    model = _model(nodes, [("x", TensorProto.FLOAT, ["N", 3])], {"W": W, "shape": np.array([-1, 4], np.int64)},
                   out=("y", ["M", 4]))
    trainer = Trainer(model, step=step)
    with pytest.raises(ModelError, match="onnxruntime failed predicting at node 'bad_reshape': .*cannot be reshaped"):
        trainer.step(np.ones((3, 3), np.float32), np.zeros((1, 4), np.float32))
    with pytest.raises(ModelError, match="at node 'bad_reshape'"):
        trainer.predict(np.ones((1, 3), np.float32))
