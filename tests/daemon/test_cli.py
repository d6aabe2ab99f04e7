"""The command line: config file under flags, export and inspect, metrics endpoint and health file."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest

from streamfit.checkpoint import CheckpointStore
from streamfit.cli import main
from streamfit.daemon.config import load_config
from tests.daemon.helpers import write_model, write_stream


def test_flags_win_over_config_file(tmp_path):
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text('source = "parquet:/data"\nbatch_size = 512\neta0 = 0.5\noptimizer = "adam"\n')
    cfg = load_config(str(cfg_file), {"batch_size": 64, "eta0": None})
    assert (cfg.source, cfg.batch_size, cfg.eta0, cfg.optimizer) == ("parquet:/data", 64, 0.5, "adam")
    cfg_file.write_text('sorce = "typo"\n')
    with pytest.raises(ValueError, match=r"unknown key 'sorce' \(did you mean 'source'\?\)"):
        load_config(str(cfg_file), {})


def test_train_export_inspect(tmp_path, capsys):
    data, total = write_stream(tmp_path, files=2, rows=512)
    model = write_model(tmp_path)
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text(f'source = "parquet:{data}"\nmodel = "{model}"\nbatch_size = 64\noptimizer = "adam"\n'
                        f'learning_rate = "constant"\neta0 = 0.01\ncheckpoint_dir = "{tmp_path / "ck"}"\n')
    assert main(["train", "--config", str(cfg_file), "--no-progress", "-o", str(tmp_path / "m.onnx")]) == 0
    out = capsys.readouterr().out
    assert f"trained {total} rows in 16 batches" in out and "model written to" in out
    assert main(["export", str(tmp_path / "ck"), "-o", str(tmp_path / "exported.onnx")]) == 0
    X = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    a = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"X": X})[0]
    b = ort.InferenceSession(str(tmp_path / "exported.onnx")).run(None, {"X": X})[0]
    np.testing.assert_array_equal(a, b)
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "ck")]) == 0
    text = capsys.readouterr().out
    assert f"{total} rows in 16 batches" in text and '"file": "part-001.parquet", "row": 512' in text
    assert "progressive metrics (stream)" in text
    assert main(["inspect", "--json", str(CheckpointStore(tmp_path / "ck").list()[-1].path)]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["rows"] == total


def test_errors_are_reported_without_traceback(tmp_path, capsys):
    assert main(["train", "--source", "parquet:/nowhere", "--model", str(tmp_path / "missing.onnx")]) == 2
    assert "model file" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "x.onnx")]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def test_metrics_endpoint_and_health_file(tmp_path):
    pytest.importorskip("prometheus_client")
    from streamfit.daemon.health import Metrics
    import anyio

    from streamfit import OnnxRegressor
    from streamfit.daemon import Runner

    data, total = write_stream(tmp_path, files=1, rows=512)
    metrics = Metrics(0)  # a free port on 127.0.0.1
    try:
        runner = Runner(OnnxRegressor(str(write_model(tmp_path)), batch_size=64), f"parquet:{data}",
                        checkpoint_dir=tmp_path / "ck", every_batches=2, health_path=tmp_path / "h.json",
                        health_interval=0, metrics=metrics, batch_size=64)
        anyio.run(runner.run)
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).read().decode()
    finally:
        metrics.close()
    assert f"streamfit_rows_trained {float(total)}" in body
    assert "streamfit_checkpoint_write_seconds" in body and 'streamfit_source_position{part="row"} 512.0' in body
    health = json.loads((tmp_path / "h.json").read_text())
    assert health["rows"] == total and health["last_batch_at"] > 0


def test_skipped_input_is_a_structured_log_line(tmp_path):
    import logging

    import pyarrow as pa
    import pyarrow.parquet as pq

    from streamfit.daemon.health import JsonFormatter

    data, _ = write_stream(tmp_path, files=1, rows=256)
    bad = pa.table({**{f"x{j}": pa.array([1.0, None], pa.float32()) for j in range(6)}, "y": pa.array([1.0, 2.0], pa.float32())})
    pq.write_table(bad, data / "part-999.parquet")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("streamfit.stream").addHandler(handler)  # main() resets the handlers of "streamfit"
    try:
        assert main(["train", "--source", f"parquet:{data}", "--model", str(write_model(tmp_path)), "--no-progress",
                     "--batch-size", "64", "--on-bad", "skip"]) == 0
    finally:
        logging.getLogger("streamfit.stream").removeHandler(handler)
    lines = [json.loads(JsonFormatter().format(r)) for r in records]
    skipped = [line for line in lines if line.get("event") == "skipped_input"]
    assert skipped and skipped[0]["reason"] == "null" and skipped[0]["position"]["file"] == "part-999.parquet"


def test_max_rows_is_a_total_over_resumes(tmp_path, capsys):
    """Issue 9: `train --max-rows 640`, then `--resume --max-rows 1280`, trains 1280 rows in all, not 1920."""
    data, total = write_stream(tmp_path, files=2, rows=1024)
    args = ["train", "--source", f"parquet:{data}", "--model", str(write_model(tmp_path)), "--no-progress",
            "--batch-size", "64", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main([*args, "--max-rows", "640"]) == 0
    assert "trained 640 rows in 10 batches" in capsys.readouterr().out
    assert main([*args, "--resume", "--max-rows", "1280"]) == 0
    assert "trained 1280 rows in 20 batches" in capsys.readouterr().out
    meta = CheckpointStore(tmp_path / "ck").load_latest().meta
    assert meta["rows"] == 1280 and meta["position"] == {"file": "part-001.parquet", "row": 256}
    assert main([*args, "--resume", "--max-rows", "1280"]) == 0  # reached already: nothing more to train
    assert "trained 1280 rows in 20 batches" in capsys.readouterr().out
    assert CheckpointStore(tmp_path / "ck").load_latest().meta["rows"] == 1280
