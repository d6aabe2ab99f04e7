"""bench/scaleout.py still runs (its --quick smoke run starts its own 2-node cluster)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_scaleout_bench_smoke(tmp_path) -> None:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scaleout.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=540, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for figure in ("1 learner actor", "2 learner actors", "ms/round", "Projection on paper", "M=64"):
        assert figure in proc.stdout
