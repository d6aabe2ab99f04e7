"""`streamfit report` of a real `streamfit train --demo` run: one self-contained page whose every plot renders
in headless Chromium (no console error), the PNG files, and the trackers read back with their own readers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from streamfit.history import read_history  # noqa: E402

PLOTS = ("metrics", "throughput", "lr_scale", "skips", "lag", "checkpoints")


def _cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "streamfit.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


#: the demo run's own trackers (logging while it goes), when their extras are installed
LIVE = _have("mlflow") and _have("tensorboardX")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A small real run: the demo's first 8,000 rows, a checkpoint every 10 batches, an interval every 800 rows;
    with --mlflow and --tensorboard (logging as it goes) when they are installed."""
    root = tmp_path_factory.mktemp("demo")
    live = ["--mlflow", (root / "live-mlruns").as_uri(), "--tensorboard", str(root / "live-tb")] if LIVE else []
    proc = _cli("train", "--demo", "--demo-dir", str(root), "--max-rows", "8000", "--checkpoint-every-batches", "10",
                "--history-every-rows", "800", "--no-progress", *live, cwd=root, env={"MLFLOW_ALLOW_FILE_STORE": "true"})
    (root / "train.out").write_text(proc.stdout)
    return root, root / "checkpoints"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_the_demo_run_keeps_a_history(demo_run):
    _, ck = demo_run
    h = read_history(ck)
    assert len(h.runs) == 1 and h.runs[0].config["options"]["batch_size"] == 128
    assert h.intervals[-1].rows_end == 8000 and not h.gaps()
    assert len(h.intervals) >= 10
    # checkpoints are due every 10 batches, one in flight delays the next (how many land depends on the
    # machine's speed); the final one always lands
    assert 63 in {c.step for i in h.intervals for c in i.checkpoints}
    losses = [i.metrics["loss"] for i in h.intervals if i.metrics.get("loss") is not None]
    assert losses[-1] < losses[0]  # it learns


def test_report_page_is_self_contained_and_every_plot_renders_in_chromium(demo_run, tmp_path):
    root, ck = demo_run
    out, png = tmp_path / "report.html", tmp_path / "png"
    proc = _cli("report", str(ck), "-o", str(out), "--png", str(png), cwd=root)
    assert "6 plots" in proc.stdout
    page = out.read_text()
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # no network: nothing fetched
    assert "http://" not in page and "https://" not in page
    images = re.findall(r'<img id="plot-(\w+)"[^>]*src="data:image/png;base64,', page)
    assert tuple(images) == PLOTS
    assert "ckpt-000000000063" in page  # the checkpoint chain (8,000 rows: 63 batches, the final one)
    assert '"batch_size": 128' in page  # the configuration
    for name in PLOTS:  # --png: the same plots as files
        data = (png / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000

    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium found (Debian: apt-get install chromium): the page was not opened in a browser")
    # a copy of the page with a probe that says which images decoded (the report itself has no script)
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", "<script>document.body.setAttribute('data-plots', Array.from("
                                  "document.images).map(i => i.id + ':' + (i.complete && i.naturalWidth > 0 ? "
                                  "i.naturalWidth : 0)).join(','));</script></body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr", "--v=0",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,4000"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    loaded = dict(item.split(":") for item in re.search(r'data-plots="([^"]*)"', dom.stdout).group(1).split(","))
    assert set(loaded) == {f"plot-{n}" for n in PLOTS}
    assert all(int(w) >= 500 for w in loaded.values()), loaded  # every image decoded (0: broken)
    shot = tmp_path / "shot.png"
    run = subprocess.run([chromium, *flags, f"--screenshot={shot}", out.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    console = [line for line in (run.stderr + dom.stderr).splitlines() if "CONSOLE" in line or ":ERROR:" in line
               and ("Uncaught" in line or "Failed to load" in line or "net::" in line)]
    assert not console, console
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] >= 3000 and pixels[..., :3].std() > 0.05  # drawn, not blank


def test_trackers_read_back_with_their_own_readers(demo_run, tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboardX")
    root, ck = demo_run
    uri = (tmp_path / "mlruns").as_uri()
    tb = tmp_path / "tb"
    proc = _cli("report", str(ck), "--mlflow", uri, "--tensorboard", str(tb), cwd=root,
                env={"MLFLOW_ALLOW_FILE_STORE": "true"})
    run_id = re.search(r"mlflow: (\w+)", proc.stdout).group(1)
    h = read_history(ck)
    losses = [(i.rows_end, i.metrics["loss"]) for i in h.intervals if i.metrics.get("loss") is not None]

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.data.params["options.batch_size"] == "128" and run.data.params["estimator"] == "OnnxRegressor"
    history = client.get_metric_history(run_id, "metrics/loss")
    history = sorted(history, key=lambda m: m.step)
    assert [m.step for m in history] == [s for s, _ in losses]
    assert [m.value for m in history] == pytest.approx([v for _, v in losses])
    checkpoints = {c.rows for i in h.intervals for c in i.checkpoints}
    assert {m.step for m in client.get_metric_history(run_id, "checkpoint/write_seconds")} == checkpoints
    artifact = Path(client.download_artifacts(run_id, "model/model.onnx", str(tmp_path / "dl")))
    import onnx

    onnx.checker.check_model(onnx.load(artifact))

    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    ea = ea_mod.EventAccumulator(str(tb))
    ea.Reload()
    assert {"metrics/loss", "rows_per_s", "lr_scale", "checkpoint/bytes"} <= set(ea.Tags()["scalars"])
    events = ea.Scalars("metrics/loss")
    assert [e.step for e in events] == [s for s, _ in losses]
    assert [e.value for e in events] == pytest.approx([v for _, v in losses], rel=1e-6)  # float32 events


@pytest.mark.skipif(not LIVE, reason="needs the [mlflow] and [tensorboard] extras")
def test_train_with_trackers_logged_the_history_as_it_went(demo_run):
    root, ck = demo_run
    run_id = re.search(r"mlflow: (\w+)", (root / "train.out").read_text()).group(1)
    h = read_history(ck)
    losses = [(i.rows_end, i.metrics["loss"]) for i in h.intervals if i.metrics.get("loss") is not None]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(root / "live-mlruns").as_uri())
    history = sorted(client.get_metric_history(run_id, "metrics/loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(s, pytest.approx(v)) for s, v in losses]
    assert client.get_run(run_id).data.params["options.batch_size"] == "128"
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    ea = ea_mod.EventAccumulator(str(root / "live-tb"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("metrics/loss")] == [s for s, _ in losses]


def test_report_of_a_directory_without_history_fails_clearly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "streamfit.cli", "report", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "holds no metrics history" in proc.stderr
