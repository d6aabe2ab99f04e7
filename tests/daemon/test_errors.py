"""The error surface of `streamfit train` / `serve`: one line, the right exit code, no traceback.

Exit code 2 for bad input or configuration, 1 for runtime failures (issue 9, item 7).  The `serve`
failures that used to end in an ExceptionGroup traceback run as real processes, all started at once
(module fixture) so the suite waits for the slowest one only; the other cases call ``main()`` in process
(same code path, stderr captured at the file descriptor).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit import OnnxRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.cli import main
from streamfit.daemon import Runner
from tests.daemon.helpers import write_model, write_stream

OPTS = ["--batch-size", "32", "--threads", "1", "--no-progress"]


@dataclass
class Done:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def _bad_rows(path: Path) -> None:
    path.mkdir(parents=True)
    table = pa.table({**{f"x{j}": pa.array([1.0, None, 2.0], pa.float32()) for j in range(6)},
                      "y": pa.array([1.0, 2.0, 3.0], pa.float32())})
    pq.write_table(table, path / "part-000.parquet")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Done]:
    root = tmp_path_factory.mktemp("errors")
    data, _ = write_stream(root, files=1, rows=1024)
    model = str(write_model(root))
    bad = root / "bad"
    _bad_rows(bad)
    (root / "garbage.onnx").write_bytes(b"not an onnx model")
    (root / "undecodable").mkdir()
    (root / "undecodable" / "part-000.parquet").write_bytes(b"not parquet either")
    (root / "wrong.toml").write_text(f'source = "parquet:{data}"\nmodel = "{model}"\nbatch_size = "64"\n')
    (root / "a-file").write_text("")
    # a run's checkpoints: one valid directory, one whose every checkpoint is corrupt
    for name in ("ck-valid", "ck-corrupt"):
        est = OnnxRegressor(model, batch_size=64, threads=1)
        anyio.run(Runner(est, f"parquet:{data}", checkpoint_dir=root / name, every_batches=4, batch_size=64,
                         max_rows=512).run)
    for info in CheckpointStore(root / "ck-corrupt").list():
        blob = bytearray((info.path / "model.onnx").read_bytes())
        blob[10] ^= 0x10
        (info.path / "model.onnx").write_bytes(bytes(blob))
    src, badsrc = f"parquet:{data}", f"parquet:{bad}"
    scenarios = {
        "on_bad_raise": ["serve", "--source", badsrc, "--model", model, "--on-bad", "raise", *OPTS],
        "on_bad_raise_json": ["serve", "--source", badsrc, "--model", model, "--on-bad", "raise", "--log-json", *OPTS],
        "divergence": ["serve", "--source", src, "--model", model, "--optimizer", "sgd", "--learning-rate",
                       "constant", "--eta0", "1e30", *OPTS],
        "all_skipped_serve": ["serve", "--source", badsrc, "--model", model, "--features", "x0,nope", "--on-bad", "skip", *OPTS],
    }
    in_process = {
        "on_bad_raise_debug": ["train", "--source", badsrc, "--model", model, "--on-bad", "raise", "--debug", *OPTS],
        "fresh_over_checkpoints": ["serve", "--source", src, "--model", model, "--checkpoint-dir",
                                   str(root / "ck-valid"), *OPTS],
        "resume_all_corrupt": ["serve", "--source", src, "--model", model, "--checkpoint-dir",
                               str(root / "ck-corrupt"), "--resume", "--log-json", *OPTS],
        "checkpoint_dir_unusable": ["train", "--source", src, "--model", model, "--checkpoint-dir",
                                    str(root / "a-file" / "ck"), *OPTS],
        "config_type": ["train", "--config", str(root / "wrong.toml"), *OPTS],
        "config_type_json": ["train", "--config", str(root / "wrong.toml"), "--log-json", *OPTS],
        "bad_flag": ["serve", "--source", src, "--model", model, "--batch-size", "many"],
        "bad_value": ["train", "--source", src, "--model", model, "--eta0", "-1", *OPTS],
        "garbage_model": ["train", "--source", src, "--model", str(root / "garbage.onnx"), *OPTS],
        "all_skipped_train": ["train", "--source", badsrc, "--model", model, "--features", "x0,nope", "--on-bad", "skip", *OPTS],
        "all_undecodable_train": ["train", "--source", f"parquet:{root / 'undecodable'}", "--model", model, "--on-bad", "skip", *OPTS],
    }
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # warnings would show up as extra stderr lines
    procs = {}
    for name, args in scenarios.items():
        with open(root / f"{name}.err", "w") as err:
            procs[name] = subprocess.Popen([sys.executable, "-m", "streamfit.cli", *args], stdout=subprocess.PIPE,
                                           stderr=err, text=True, env=env, cwd=root)
    # the serve that skips everything runs until told to stop: SIGTERM it once it has skipped the file's rows
    err_file = root / "all_skipped_serve.err"
    deadline = time.monotonic() + 120
    while procs["all_skipped_serve"].poll() is None and "skipped 3 row(s)" not in err_file.read_text():
        assert time.monotonic() < deadline, err_file.read_text()
        time.sleep(0.05)
    procs["all_skipped_serve"].send_signal(signal.SIGTERM)
    results = {}
    for name, args in in_process.items():  # while the processes start
        results[name] = _in_process(args, root / f"{name}.err")
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=180)
        results[name] = Done(proc.returncode, out, (root / f"{name}.err").read_text())
    return results


def _in_process(args: list[str], err_path: Path) -> Done:
    """``main(args)`` with stdout and stderr redirected at the file descriptor (what a process would print)."""
    import contextlib
    import io
    import logging

    out = io.StringIO()
    with open(err_path, "w") as err, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse's own exit
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # escaped main(): what a process would print as a traceback
            import traceback

            traceback.print_exc(file=err)
            code = 1
        finally:
            logging.getLogger("streamfit").handlers[:] = []  # main() pointed them at this file
            logging.getLogger("streamfit").propagate = True
    return Done(code, out.getvalue(), err_path.read_text())


def _assert_one_clean_line(done: Done, code: int, command: str, *needles: str) -> str:
    assert done.code == code, done.err
    assert "Traceback" not in done.err and "ExceptionGroup" not in done.err and "  File " not in done.err, done.err
    last = done.lines[-1]
    assert last.startswith(f"streamfit {command}: "), done.err
    for needle in needles:
        assert needle in last, last
    return last


def test_bad_input_under_raise_is_one_line_exit_2(runs):
    _assert_one_clean_line(runs["on_bad_raise"], 2, "serve", "BadInputError: column 'x0' has a null",
                           "part-000.parquet")


def test_bad_input_under_log_json_is_one_json_line(runs):
    done = runs["on_bad_raise_json"]
    assert done.code == 2 and "Traceback" not in done.err
    records = [json.loads(line) for line in done.lines]  # every stderr line is JSON
    assert [r["event"] for r in records if r["level"] == "ERROR"] == ["error"]
    last = records[-1]
    assert last["event"] == "error" and last["exit_code"] == 2 and last["kind"] == "bad_input"
    assert last["error"] == "BadInputError" and last["column"] == "x0" and last["reason"] == "null"
    assert last["position"] == {"file": "part-000.parquet", "row": 1}


def test_debug_adds_the_traceback_and_still_ends_with_the_line(runs):
    done = runs["on_bad_raise_debug"]
    assert done.code == 2 and "Traceback" in done.err
    assert done.lines[-1].startswith("streamfit train: BadInputError: column 'x0' has a null")


def test_refused_resume_is_a_configuration_error(runs):
    _assert_one_clean_line(runs["fresh_over_checkpoints"], 2, "serve", "ResumeError", "already holds checkpoints")


def test_resume_with_no_valid_checkpoint_is_a_runtime_error(runs):
    done = runs["resume_all_corrupt"]
    assert done.code == 1 and "Traceback" not in done.err
    last = json.loads(done.lines[-1])
    assert last["event"] == "error" and last["exit_code"] == 1 and last["error"] == "CorruptCheckpointError"
    assert "no valid checkpoint" in last["message"] and "model.onnx fails its SHA-256 check" in last["message"]


def test_divergence_is_a_runtime_error(runs):
    _assert_one_clean_line(runs["divergence"], 1, "serve", "DivergenceError")


def test_unusable_checkpoint_directory_is_a_runtime_error(runs):
    _assert_one_clean_line(runs["checkpoint_dir_unusable"], 1, "train", "CheckpointError", "a-file")


def test_bad_configuration_and_flags_exit_2(runs):
    _assert_one_clean_line(runs["config_type"], 2, "train", "OptionError", "wrong.toml: Invalid batch_size: '64', "
                           "expected an int >= 1")
    done = runs["config_type_json"]
    assert done.code == 2 and len(done.lines) == 1 and json.loads(done.lines[0])["kind"] == "configuration"
    done = runs["bad_flag"]
    assert len(done.lines) == 1  # no multi-line usage block
    _assert_one_clean_line(done, 2, "serve", "argument --batch-size: invalid int value: 'many'")
    _assert_one_clean_line(runs["bad_value"], 2, "train", "Invalid eta0: '-1', expected a positive number or 'auto'")


def test_model_error_exit_2(runs):
    _assert_one_clean_line(runs["garbage_model"], 2, "train", "ModelError", "cannot load the ONNX model")


def test_a_run_that_skipped_every_row_fails_and_says_why(runs):
    """Issue 9: a stream in which every row is skipped used to end "successfully" with rows=0."""
    _assert_one_clean_line(runs["all_skipped_train"], 2, "train", "no row trained", "all 3 rows read were skipped",
                           "missing_column: 3")
    assert "trained 0 rows" not in runs["all_skipped_train"].out
    _assert_one_clean_line(runs["all_skipped_serve"], 2, "serve", "no row trained", "missing_column: 3")


def test_a_run_whose_every_message_was_undecodable_says_so(runs):
    _assert_one_clean_line(runs["all_undecodable_train"], 2, "train", "no row trained",
                           "1 whole message or file was skipped (undecodable: 1)")
