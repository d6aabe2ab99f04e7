"""The benchmarks still run: each one's --quick smoke run exits 0 and prints its figures (not their values).

The longest smoke runs (``slow``: 5-25 s each) stay out of the default suite; ``.ci/run`` runs them as a call of
their own (``pytest -m slow tests/test_bench.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str, timeout: float = 240) -> str:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), "--quick", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_engine_bench_smoke():
    out = _run("engine.py")
    assert "== targets" in out and "streamfit fused step" in out and "ORT on-device API" in out


@pytest.mark.slow
def test_checkpoint_bench_smoke():
    out = _run("checkpoint.py")
    assert "none" in out and "vs none" in out and "ERROR" not in out


@pytest.mark.slow
def test_checkpoint_tables_bench_smoke():
    out = _run("checkpoint.py", "--tables")
    assert "== delta checkpoints" in out and " full " in out and " delta " in out
    assert "== target: a delta checkpoint of 1 % touched rows" in out and "publications:" in out
    assert "copy-on-write fulls: rows saved aside" in out and "peak during the run" in out
    assert "batch interval while a checkpoint was written" in out


def test_checkpoint_cow_bench_smoke():
    out = _run("checkpoint.py", "--cow")
    assert "== a full checkpoint while training" in out and "\ncopy " in out and "\ncow " in out


@pytest.mark.kafka
@pytest.mark.slow
def test_pipeline_bench_smoke():
    out = _run("pipeline.py")
    assert "parquet" in out and "kafka" in out


def test_primitives_bench_smoke():
    out = _run("primitives.py", timeout=120)
    assert "session run, 1 node" in out and "update        Gemm" in out


def test_river_defaults_bench_smoke():
    pytest.importorskip("river")
    out = _run("river_defaults.py", timeout=120)
    assert "TrumpApproval" in out and "Bananas" in out and ("met" in out or "MISSED" in out)


@pytest.mark.slow
def test_eta0_study_bench_smoke():
    pytest.importorskip("river")
    out = _run("eta0_study.py", timeout=120)
    assert "streams met" in out and "Bananas" in out and "Friedman" in out


def test_inputs_bench_smoke():
    pytest.importorskip("river")
    out = _run("inputs.py", timeout=180)
    assert "== targets ==" in out and "Trainer.step" in out and "River" in out
    # each target met/MISSED: partial_fit and predict of 4 models, Phishing time and accuracy
    assert sum(line.startswith(("met ", "MISSED ")) for line in out.splitlines()) == 10
    assert "streamfit / floor" in out and "ORT floor / River" in out


def test_columns_bench_smoke():
    out = _run("columns.py", timeout=120)
    assert "features= (one X)" in out and "Hashed(dictionary city)" in out and "vs features=" in out


@pytest.mark.slow
def test_sparse_bench_smoke():
    out = _run("sparse.py", timeout=200)
    assert "== targets" in out and "streamfit FMClassifier k=4, AdaGrad, batch 1024" in out and "per step" in out
    assert "-- batch 1 (one row per step)" in out and "FTRL, batch 1 " in out
    try:  # the VW comparison is printed only where vowpalwabbit is installed (it is not a test dependency)
        import vowpalwabbit  # noqa: F401
    except ImportError:
        assert "vowpalwabbit is not installed" in out
    else:
        assert "VW's rows/s" in out


@pytest.mark.slow
def test_bigtable_bench_smoke():
    out = _run("bigtable.py")
    assert "ratio" in out and "floor, bare numpy" in out and "RSS growth" in out


@pytest.mark.kafka
@pytest.mark.slow
def test_soak_bench_smoke(tmp_path):
    """A few seconds of the daemon's soak on a local broker: every figure is produced, exactly once holds, also
    for the partial batch at the stream's end (trained while the stream is quiet: --max-batch-wait)."""
    import json

    out = _run("soak.py", "--json", str(tmp_path / "soak.json"), timeout=300)
    for row in ("RSS slope, second half", "fds first/last/max", "threads first/last/max", "lag p50 / p95",
                "checkpoint writes p50 / p95", "SIGTERM", "rows/s", "quiet 3 s after", "AVX-512"):
        assert row in out, row
    assert "exactly once: OK" in out and "FAIL" not in out
    fig = json.loads((tmp_path / "soak.json").read_text())
    assert fig["exactly_once"] and fig["sigterm_exit_code"] == 0 and fig["checkpoints"] >= 1
    assert fig["rows_trained"] == fig["produced"]["good_rows"] > 0
    assert fig["config"]["partial_tail"] and fig["rows_trained"] % fig["config"]["batch_size"]
    assert all(fig["produced"]["kinds"].get(kind) for kind in ("undecodable", "missing_column", "wrong_type",
                                                                 "null_label"))
    for key in ("rss_slope_mb_per_h", "fds", "threads", "lag_p50_s", "lag_p95_s", "checkpoint_write_p95_ms",
                "sigterm_exit_s", "rows_per_s"):
        assert fig[key] is not None, key


@pytest.mark.slow
def test_hashing_bench_smoke():
    out = _run("hashing.py", timeout=200)
    assert "session (old) vs numpy (new)" in out and "Hashed.encode" in out and "partial_fit" in out


def test_message_path_smoke():
    out = _run("message_path.py")
    assert "functions entered every batch" in out and "_columns/plan.py" in out


def test_perrow_bench_smoke():
    pytest.importorskip("river")
    out = _run("perrow.py", timeout=240)
    assert "AVX-512" in out and "== 6. floor" in out and "== targets" in out
    for section in ("== 1. River's streams", "== 2. hashed", "== 3. one event per call", "== 4. partial_fit",
                    "== 5. MLPClassifier"):
        assert section in out, section
    targets = out.split("== targets")[1].strip().splitlines()
    assert len(targets) > 10 and all(line.startswith(("met ", "MISSED ")) for line in targets[:-1])


def test_chunk_steps_bench_smoke():
    out = _run("chunk_steps.py", timeout=180)
    assert "chunk us/row" in out and "ready-made estimators" in out and "AVX-512" in out


def test_plots_of_the_committed_bench_json(tmp_path):
    """bench/plots.py draws every committed bench JSON, and docs/benchmarks/_figures.md is its output (not edited)."""
    docs = os.path.join(ROOT, "docs", "benchmarks")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plots.py"), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ, MPLBACKEND="Agg"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("engine", "pipeline", "op_census", "river_defaults"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert os.path.exists(os.path.join(docs, f"{name}.png")), f"docs/benchmarks/{name}.png is not committed"
    made = (tmp_path / "_figures.md").read_text()
    assert "No JSON yet" not in made
    assert "2 cores" in made or " cores, onnxruntime" in made  # each figure names the CPU it ran on
    with open(os.path.join(docs, "_figures.md")) as f:
        assert f.read() == made, "docs/benchmarks/_figures.md differs from what bench/plots.py makes: rerun it"


@pytest.mark.slow
def test_scan_unroll_bench_smoke():
    """The unrolled bodies (a design tried, not kept) compute what streamfit's chunk graphs compute."""
    out = _run("scan_unroll.py")
    assert out.count("outputs the same") == 12 and "DIFFER" not in out and "AVX-512" in out
