"""The preflight: a model whose kernels crash onnxruntime is refused from a subprocess, the caller lives on."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from streamfit._preflight import check_model
from streamfit.cli import main
from tests.daemon.helpers import write_model, write_stream

ZOO = Path(__file__).resolve().parent / "zoo"


@pytest.fixture(autouse=True, scope="module")
def _own_cache(tmp_path_factory):
    """One cache for this module: the crashing model is located once, later tests read the cache."""
    old = os.environ.get("STREAMFIT_CACHE_DIR")
    os.environ["STREAMFIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    os.environ["STREAMFIT_CACHE_DIR"] = old or ""


def _crashing_model(path: Path) -> Path:
    """A model whose AveragePoolGrad node (a training kernel of onnxruntime-training 1.19.2, in the ONNX
    domain) segfaults the process that loads it: the kind of crash no Python code can catch."""
    W = numpy_helper.from_array(np.full((24, 1), 0.1, np.float32), "W")
    nodes = [helper.make_node("AveragePoolGrad", ["X"], ["P"], kernel_shape=[2], strides=[2]),
             helper.make_node("Flatten", ["P"], ["F"]), helper.make_node("MatMul", ["F", "W"], ["Y"])]
    graph = helper.make_graph(nodes, "crash", [helper.make_tensor_value_info("X", 1, [None, 6])],
                              [helper.make_tensor_value_info("Y", 1, [None, 1])], [W])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_crashing_model_is_refused_naming_the_op_and_the_caller_survives(tmp_path):
    result = check_model(_crashing_model(tmp_path / "crash.onnx"))
    assert not result.ok and result.signal == "SIGSEGV"
    assert result.op is not None and result.op.startswith("AveragePoolGrad")
    assert "refused" in result.message() and "AveragePoolGrad" in result.message()
    again = check_model(tmp_path / "crash.onnx")  # cached by model hash: no second subprocess
    assert again.cached and not again.ok and again.op == result.op
    assert os.getpid() > 0  # still here


def test_a_model_without_a_gradient_is_refused_with_its_error(tmp_path):
    W = numpy_helper.from_array(np.ones((6, 1), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Z"]), helper.make_node("Round", ["Z"], ["Y"])]
    graph = helper.make_graph(nodes, "round", [helper.make_tensor_value_info("X", 1, [None, 6])],
                              [helper.make_tensor_value_info("Y", 1, [None, 1])], [W])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "r.onnx")
    result = check_model(tmp_path / "r.onnx")
    assert not result.ok and result.signal is None and "nothing to train" in result.error


def test_models_that_crashed_before_streamfit_rewrote_their_ops_pass():
    """Conv1d + AvgPool1d (SIGFPE in AveragePoolGrad) and Conv2d + BatchNorm2d + AvgPool2d, as exported."""
    for name in ("conv1d_avgpool.legacy.onnx", "conv2d_bn_avgpool.legacy.onnx", "conv2d_bn_avgpool.dynamo.onnx"):
        result = check_model(ZOO / name)
        assert result.ok, result.message()
        assert "AveragePool x1 rewritten for training" in result.notes


def test_train_and_serve_refuse_a_crashing_model_before_training(tmp_path, capsys):
    data, _ = write_stream(tmp_path, files=1, rows=64)
    crash = _crashing_model(tmp_path / "crash.onnx")
    for command in ("train", "serve"):
        code = main([command, "--source", f"parquet:{data}", "--model", str(crash), "--no-progress",
                     "--checkpoint-dir", str(tmp_path / f"ck-{command}")])
        assert code == 2
        err = capsys.readouterr().err
        assert f"streamfit {command}: ModelError: model" in err and "refused" in err and "SIGSEGV" in err
        assert not (tmp_path / f"ck-{command}").exists()  # nothing was trained or checkpointed


def test_check_command(tmp_path, capsys):
    model = write_model(tmp_path)
    assert main(["check", str(model)]) == 0
    assert "preflight passed" in capsys.readouterr().out
    assert main(["check", str(model)]) == 0
    assert "(cached)" in capsys.readouterr().out
    crash = str(_crashing_model(tmp_path / "crash.onnx"))
    assert main(["check", crash]) == 2  # bad input, as train and serve say of the same model
    assert "refused" in capsys.readouterr().out
    data, _ = write_stream(tmp_path, files=1, rows=16)
    assert main(["train", "--source", f"parquet:{data}", "--model", crash, "--no-progress"]) == 2
    assert "refused" in capsys.readouterr().err
    # a classifier on logits: the loss is picked by output width, as OnnxClassifier does
    assert main(["check", str(ZOO / "classifier_logits.dynamo.onnx"), "--task", "classification"]) == 0
    assert "preflight passed" in capsys.readouterr().out


def test_strategies_that_disagree_are_reported():
    """onnxruntime's TrainingAgent computes wrong conv gradients at batch 1 for this export (the fused step
    matches finite differences): the preflight passes the model but says so."""
    result = check_model(ZOO / "conv1d_avgpool.dynamo.onnx")
    assert result.ok
    assert any(n.startswith("WARNING: step='fused' and step='forward_backward' disagree at 1 row") for n in result.notes)
    assert not any(n.startswith("WARNING") for n in check_model(ZOO / "conv1d_avgpool.legacy.onnx").notes)
