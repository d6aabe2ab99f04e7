"""The preflight steps on the stream's first rows when ``train``/``serve`` can read them ahead (a file source), and a
failure on its inputs is a warning, not a refusal (issue 21, item 4): a model whose input holds a sequence of a
length its graph fixes (a Reshape to [rows, 2, 4]) fails on synthetic rows, which give a symbolic dim 3 values
(before: refused, so ``train`` refused it), and passes on the stream's 8."""

from __future__ import annotations

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from streamfit._preflight import SINGLE, check_model
from streamfit.cli import main


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMFIT_CACHE_DIR", str(tmp_path / "cache"))


def _fixed_length(path) -> str:
    """x [N, T] -> Reshape [N, 2, 4] (T must be 8) -> ReduceSum over the last axis -> MatMul W -> y [N, 1]."""
    inits = {"shape": np.array([0, 2, 4], np.int64), "axes": np.array([2], np.int64),
             "W": np.array([[0.5], [-0.5]], np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="to_pairs"),
             helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=0),
             helper.make_node("MatMul", ["s", "W"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def test_a_failure_on_synthetic_rows_is_a_warning_and_the_streams_rows_pass(tmp_path):
    model = _fixed_length(tmp_path / "m.onnx")
    synthetic = check_model(model)
    assert synthetic.ok, synthetic.message()
    warned = [n for n in synthetic.notes if n.startswith("WARNING: fused, 1 rows")]
    assert warned and "to_pairs" in warned[0] and "on synthetic inputs" in warned[0], synthetic.notes
    rows = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    real = check_model(model, rows={SINGLE: rows})
    assert real.ok and not real.cached, real.message()
    assert "preflight on the stream's first 5 rows" in real.notes
    assert not [n for n in real.notes if n.startswith("WARNING")], real.notes


def test_a_model_whose_gradient_cannot_be_built_is_still_refused(tmp_path):
    """Only what the inputs may cause is a warning: no float weight to train is the model's fault."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              tmp_path / "id.onnx")
    result = check_model(tmp_path / "id.onnx", rows={SINGLE: np.ones((3, 1), np.float32)})
    assert not result.ok and "nothing to train" in str(result.error)


def test_train_preflights_on_the_parquet_streams_first_rows(tmp_path, capsys, caplog):
    model = _fixed_length(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    X = rng.standard_normal((96, 8))
    (tmp_path / "data").mkdir()
    cols = {f"c{k}": X[:, k] for k in range(8)}
    pq.write_table(pa.table({**cols, "y": X[:, :4].sum(1) - X[:, 4:].sum(1)}), tmp_path / "data" / "p0.parquet")
    caplog.set_level("DEBUG", logger="streamfit")
    code = main(["train", "--source", f"parquet:{tmp_path / 'data'}", "--model", model, "--input",
                 "x=" + ",".join(cols), "--label", "y", "--no-progress", "--batch-size", "16", "-o",
                 str(tmp_path / "out.onnx")])
    assert code == 0, capsys.readouterr().err
    # the check on the stream's rows is cached apart: it ran, and warned of nothing
    from streamfit._preflight import _key, cache_dir

    key = _key((tmp_path / "m.onnx").read_bytes(), "squared_error", "sgd", stream=True)
    import json

    saved = json.loads((cache_dir() / f"{key}.json").read_text())
    assert saved["ok"] and "preflight on the stream's first 64 rows" in saved["notes"], saved
    assert not [n for n in saved["notes"] if n.startswith("WARNING")]
