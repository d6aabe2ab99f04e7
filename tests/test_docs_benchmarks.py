"""The benchmarks page's figures: every bench bench/plots.py draws has its JSON, its PNG and the date and CPU of
its run committed (docs/benchmarks/), and a bench's --json output is what plots.py draws (the smoke runs of
chunk_steps.py, bigtable.py, columns.py, primitives.py, ort_versions.py, profile_step.py and message_path.py, a
few seconds each; those of checkpoint.py, hashing.py, soak.py, sparse.py, perrow.py and inputs.py, ~10-20 s each,
are marked slow; scaleout.py's, a local Ray cluster for ~30 s, slow and ray). The drawing of the committed JSON
and the generated _figures.md are checked by tests/test_bench.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"
sys.path.insert(0, str(ROOT / "bench"))

import plots  # noqa: E402  (bench/plots.py)


def test_every_drawn_bench_has_its_json_png_and_run_committed():
    runs = json.loads((DOCS / "data" / "runs.json").read_text())
    figures = (DOCS / "_figures.md").read_text()
    for name in plots.BENCHES:
        assert (DOCS / "data" / f"{name}.json").exists(), f"docs/benchmarks/data/{name}.json is not committed"
        assert (DOCS / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert runs.get(name, {}).get("cpu"), f"runs.json names no CPU for {name}: bench/plots.py --record {name}"
        section = figures.split(f"### `bench/{name}.py`")[1].split("### ")[0]
        assert f"![{name}]({name}.png)" in section, name
        if name != "op_census":  # counts of ops in graphs: no speed, no CPU to name
            assert runs[name]["cpu"] in section, f"the {name} figures do not name the CPU of their run"


def _json_then_plot(tmp_path: Path, bench: str, *args: str, timeout: float = 120) -> str:
    out = tmp_path / f"{bench}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / f"{bench}.py"), "--quick", *args, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["env"]["cpu_model"] and doc["env"]["cpu_count"] and doc["config"]["quick"] is True
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "plots.py"), "--data", str(tmp_path), "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, MPLBACKEND="Agg"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / f"{bench}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    made = (tmp_path / "out" / "_figures.md").read_text()
    section = made.split(f"### `bench/{bench}.py`")[1].split("### ")[0]
    assert doc["env"]["cpu_model"] in section  # the CPU named, from the JSON when runs.json has no entry
    return section


def test_chunk_steps_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "chunk_steps")
    assert "| linear d=10 sgd | 1 | 256 |" in section and "| `LogisticRegression()` | 256 |" in section


def test_bigtable_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "bigtable")
    assert "| adagrad |" in section and "| sgd |" in section and "Floor (bare numpy" in section


def test_columns_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "columns")
    assert "| `+ Vocabulary(string city)` |" in section


def test_primitives_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "primitives")
    assert "| update Gemm(h, dz, C=W, transA) |" in section


def test_ort_versions_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "ort_versions")  # onnxruntime-training alone: no --new-python here
    assert "| mlp batch 2048 |" in section and "onnxruntime 1.19.2, portable graph" in section


def test_profile_step_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "profile_step")
    assert "| 256 | large | " in section and "| FusedGemm | " in section


def test_message_path_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "message_path")
    assert "| `_engine` | " in section and "| `_stream` | " in section and "| all | " in section


@pytest.mark.slow
def test_checkpoint_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "checkpoint", timeout=240)  # --quick: three 1.5 s arms through the Runner
    assert "| none | " in section and "| 1s | " in section and "| 0.25s | " in section


@pytest.mark.slow
def test_hashing_json_is_drawn(tmp_path):
    import hashing  # bench/hashing.py: its baseline must be in this clone (not in a shallow one)

    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{hashing.BASELINE}^{{commit}}"]).returncode:
        pytest.skip(f"the old tree {hashing.BASELINE} is not in this clone")
    section = _json_then_plot(tmp_path, "hashing")  # --quick: ~10 s, the old tree checked out under the temp dir
    assert "| 32 | 20 | " in section and "| `partial_fit` batch |" in section


@pytest.mark.slow
@pytest.mark.kafka
def test_soak_json_is_drawn(tmp_path):
    section = _json_then_plot(tmp_path, "soak", timeout=240)  # --quick: 6 s of stream through a tansu broker, ~20 s
    assert "| committed offset == end of topic | ok |" in section and "| SIGTERM | exit 0 in " in section


@pytest.mark.slow
@pytest.mark.ray
def test_scaleout_json_is_drawn(tmp_path):
    pytest.importorskip("ray")
    section = _json_then_plot(tmp_path, "scaleout", timeout=300)  # --quick: a 2-node local Ray cluster, ~30 s
    assert "| linear d=100 | " in section and "Projection (star" in section


@pytest.mark.slow
def test_sparse_json_is_drawn(tmp_path):
    pytest.importorskip("river")
    section = _json_then_plot(tmp_path, "sparse", "--no-table", timeout=240)
    assert "streamfit hashed LogisticRegression, AdaGrad, batch 1024 | 2,048 |" in section


@pytest.mark.slow
def test_perrow_json_is_drawn(tmp_path):
    pytest.importorskip("river")
    section = _json_then_plot(tmp_path, "perrow", "--sections", "1", timeout=240)
    assert "| Phishing | 300 | defaults |" in section and "Targets: " in section


@pytest.mark.slow
def test_inputs_json_is_drawn(tmp_path):
    pytest.importorskip("river")
    section = _json_then_plot(tmp_path, "inputs", timeout=240)
    assert "| LinearRegressor() (defaults) partial_fit / Trainer.step (batch 1) |" in section
