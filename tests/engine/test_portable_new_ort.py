"""The portable step graphs on the newest plain onnxruntime: same weights as onnxruntime-training 1.19.2.

Cases are recorded here on 1.19.2 (``tests/portable/cases.py``: the engine's own steps, the portable graphs,
the batches, the weights reached), then replayed by ``tests/portable/run_new_ort.py`` in a subprocess of an
interpreter with plain onnxruntime: ``STREAMFIT_PLAIN_ORT_PYTHON`` (e.g. a Python 3.13 venv with
``onnxruntime`` and ``numpy``), else ``<repo>/.venv-ort/bin/python`` or ``<repo>/.venv313/bin/python`` (.ci/run's
second leg).  Without one these tests are skipped,
saying so.  The default suite replays a quick set; ``-m slow`` the whole zoo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_ort_training  # records/compares against onnxruntime-training 1.19.2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "portable"))
import cases as portable_cases  # noqa: E402
import run_new_ort  # noqa: E402

RUNNER = ROOT / "tests" / "portable" / "run_new_ort.py"


@lru_cache(maxsize=None)
def plain_python() -> "tuple[str, str] | None":
    """(interpreter, its onnxruntime version) of a plain-onnxruntime interpreter, or None."""
    given = os.environ.get("STREAMFIT_PLAIN_ORT_PYTHON")
    candidates = [given] if given else [str(ROOT / d / "bin" / "python") for d in (".venv-ort", ".venv313")]
    for python in candidates:
        if not python or not Path(python).exists():
            continue
        probe = subprocess.run([python, "-c", "import onnxruntime, onnxruntime.capi._pybind_state as C; "
                                "print(onnxruntime.__version__, hasattr(C, 'TrainingAgent'))"],
                               capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            raise RuntimeError(f"{python} cannot import onnxruntime: {probe.stderr[-500:]}")
        version, training = probe.stdout.split()
        if training == "True":
            raise RuntimeError(f"{python} has onnxruntime-training {version}; these tests need plain onnxruntime")
        return python, version
    return None


def _need_plain() -> tuple[str, str]:
    found = plain_python()
    if found is None:
        pytest.skip("no plain-onnxruntime interpreter: set STREAMFIT_PLAIN_ORT_PYTHON to the python of a venv "
                    "with onnxruntime (>= 1.20, e.g. 1.31.1 on Python 3.13) and numpy")
    return found


def _replay(python: str, cases: Path, tmp: Path) -> dict:
    report = tmp / "report.json"
    proc = subprocess.run([python, str(RUNNER), str(cases), "--json", str(report)], capture_output=True, text=True,
                          timeout=900)
    assert report.exists(), proc.stdout + proc.stderr
    return {"rc": proc.returncode, "stdout": proc.stdout, **json.loads(report.read_text())}


def _check(result: dict, n_cases: int) -> None:
    assert len(result["results"]) == n_cases
    bad = [r for r in result["results"] if not r["ok"]]
    assert not bad, result["stdout"]
    assert result["rc"] == 0


def test_replay_on_this_build_equals_the_engine(tmp_path):
    """The replay itself (portable graphs fed back by the runner) reproduces the engine's 1.19.2 weights."""
    written = portable_cases.make_cases(tmp_path, quick=True, only=lambda n: n.startswith(("engine.", "ready.")))
    assert len(written) >= 8
    results = [run_new_ort.run_case(case) for case in written]
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]]


def test_quick_set_on_the_newest_onnxruntime(tmp_path):
    python, version = _need_plain()
    written = portable_cases.make_cases(tmp_path / "cases", quick=True)
    result = _replay(python, tmp_path / "cases", tmp_path)
    assert result["onnxruntime"] == version
    _check(result, len(written))


@pytest.mark.slow
def test_every_zoo_step_on_the_newest_onnxruntime(tmp_path):
    python, _ = _need_plain()
    written = portable_cases.make_cases(tmp_path / "cases")
    assert len(written) >= 57 + 8  # the zoo without GRU/LSTM, and the engine's and ready-made models
    _check(_replay(python, tmp_path / "cases", tmp_path), len(written))


def test_the_original_graphs_do_not_load_there(tmp_path):
    """Why the rewrite: the engine's small-batch MLP graph holds ReluGrad, which inference builds lack."""
    python, _ = _need_plain()
    portable_cases.make_cases(tmp_path / "cases", quick=True, portable=False,
                              only=lambda n: n == "engine.mlp_relu.sgd")
    result = _replay(python, tmp_path / "cases", tmp_path)
    (only,) = result["results"]
    assert not only["ok"] and "ReluGrad" in only["problems"][0], only


def test_ort_versions_bench_smoke():
    """bench/ort_versions.py --quick runs (with the plain interpreter when there is one) and prints its table."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMFIT_PLAIN_ORT_PYTHON"}
    found = plain_python()
    args = ["--new-python", found[0]] if found else []
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ort_versions.py"), "--quick", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "CPU: " in proc.stdout and "mlp bs2048" in proc.stdout and "port/orig@1.19.2" in proc.stdout
    if found:
        assert "ReluGrad" in proc.stdout  # the original small-batch MLP graph does not load there
