"""``streamfit check`` and ``streamfit inspect`` say the same about what trains (issue 21, items 1 and 6): the
constants rule, which initializers train, which are constants and why, which ``--freeze`` kept out; inspect
reads it from the stamp ``to_onnx()`` writes into a checkpoint's model (before: inspect said nothing of it)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._engine.prepare.constants import RULE, WEIGHTS_KEY, trained_set_of
from streamfit._engine.trainer import Trainer
from streamfit.cli import main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMFIT_CACHE_DIR", str(tmp_path / "cache"))


def _model() -> onnx.ModelProto:
    """y = (x @ W + b) * s, s a rank-0 initializer (a constant by the rule)."""
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((3, 1)).astype(np.float32), "b": np.array([0.5], np.float32),
             "s": np.array(2.0, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Mul", ["hb", "s"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weight_lines(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("weights: "))
    return [line.strip() for line in lines[start:] if line.startswith("    ") or line.strip().startswith("weights: ")]


def test_to_onnx_stamps_what_trained():
    trainer = Trainer(_model(), freeze=["b"])
    stamp = trained_set_of(trainer.to_onnx())
    assert stamp is not None and stamp.weights == ("W",)
    assert stamp.constants == {"b": "freeze=", "s": "a scalar (rank 0)"}
    again = Trainer(trainer.to_onnx())  # a re-export keeps one stamp, its own
    keys = [p.key for p in again.to_onnx().metadata_props]
    assert keys.count(WEIGHTS_KEY) == 1 and trained_set_of(again.to_onnx()).weights == ("W", "b")


def test_check_and_inspect_say_the_same(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    assert main(["check", str(path), "--freeze", "b"]) == 0
    checked = _weight_lines(capsys.readouterr().out)
    assert checked == [f"weights: 1 initializers train (0 made by the exporter), 1 constants, 1 frozen by freeze=; "
                       f"the rule: {RULE}",
                       "frozen   b [1]: kept out by freeze=", "constant s [scalar]: a scalar (rank 0)"]
    rng = np.random.default_rng(1)
    X = rng.standard_normal((64, 3))
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"f0": X[:, 0], "f1": X[:, 1], "f2": X[:, 2], "y": X.sum(1)}),
                   tmp_path / "data" / "part-0.parquet")
    code = main(["train", "--source", f"parquet:{tmp_path / 'data'}", "--model", str(path), "--input",
                 "x=f0,f1,f2", "--label", "y", "--freeze", "b", "--no-progress", "--checkpoint-dir",
                 str(tmp_path / "ck"), "--batch-size", "16"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "ck")]) == 0
    assert _weight_lines(capsys.readouterr().out)[:3] == checked


def test_inspect_of_a_checkpoint_without_the_stamp_says_what_the_state_holds(tmp_path, capsys):
    """A checkpoint written before the stamp: the trained weights are the trainer's saved ones."""
    from streamfit import OnnxRegressor
    from streamfit.checkpoint import CheckpointStore
    from streamfit.daemon.state import snapshot_estimator

    reg = OnnxRegressor(_model(), freeze=["b"])
    reg.partial_fit(np.ones((4, 3), np.float32), np.zeros(4, np.float32))
    model, arrays, state = snapshot_estimator(reg)
    bare = onnx.load_from_string(model)
    del bare.metadata_props[:]
    CheckpointStore(tmp_path).save(1, bare.SerializeToString(), arrays, {"estimator": state, "rows": 4,
                                                                        "batches": 1, "position": None})
    assert main(["inspect", str(tmp_path)]) == 0
    lines = _weight_lines(capsys.readouterr().out)
    assert lines[0].startswith("weights: 1 initializers train (0 made by the exporter), 2 constants")
    assert "constant s [scalar]: a scalar (rank 0)" in lines
    assert any(line.startswith("constant b [1]: not trained by this run") for line in lines)
