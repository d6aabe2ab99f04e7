"""Operating the daemon (docs/tutorials/daemon.md as one script): ``streamfit serve`` as a supervisor runs it.

Writes Parquet files with one bad row (a null), starts ``streamfit serve`` with checkpoints, a health file,
Prometheus metrics and a dead-letter file; waits until the health file says idle, scrapes the metrics, stops
it with SIGTERM (exit 0, a final checkpoint), adds a file and resumes (every row trained once), reads the dead
letter back, and plots the run's metrics history (the resume marked) to ``<out>/operate_daemon.png``.

    python examples/operate_daemon.py --out /tmp/plots
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from streamfit import read_dead_letters  # noqa: E402
from streamfit.history import read_history  # noqa: E402
from streamfit.testing import mlp_model  # noqa: E402

ROWS = 2048


def write_part(data: Path, part: int, rng: np.random.Generator, null_at: int | None = None) -> None:
    X = rng.standard_normal((ROWS, 4)).astype(np.float32)
    y = (X[:, 0] * X[:, 1] + np.sin(X[:, 2])).astype(np.float32)
    x1 = pa.array(X[:, 1], mask=None if null_at is None else np.arange(ROWS) == null_at)
    pq.write_table(pa.table({"x0": X[:, 0], "x1": x1, "x2": X[:, 2], "x3": X[:, 3], "y": y}),
                   data / f"part-{part}.parquet")


def wait_idle(health: Path, daemon: subprocess.Popen, rows: int, timeout: float = 300) -> dict:
    """The health file once the daemon has trained ``rows`` rows and is idle (every row read is trained)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited early with {daemon.returncode}")
        try:
            state = json.loads(health.read_text())
        except (OSError, ValueError):
            state = {}
        if state.get("idle") and state.get("rows", 0) >= rows:
            return state
        time.sleep(0.2)
    raise SystemExit(f"no idle health file after {timeout} s")


def main(out: Path) -> None:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "data"
        data.mkdir()
        for part in range(3):
            write_part(data, part, rng, null_at=7 if part == 1 else None)
        onnx.save(mlp_model([4, 32, 1]), work / "model.onnx")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [sys.executable, "-m", "streamfit.cli", "serve", "--source", f"parquet:{data}", "--model",
                   str(work / "model.onnx"), "--features", "x0,x1,x2,x3", "--label", "y", "--batch-size", "256",
                   "--optimizer", "adam", "--learning-rate", "constant", "--eta0", "3e-3",
                   "--checkpoint-dir", str(work / "ckpt"), "--health-file", str(work / "health.json"),
                   "--metrics-port", str(port), "--dead-letter", str(work / "dead.jsonl"),
                   "--history-every-rows", "512"]
        daemon = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        state = wait_idle(work / "health.json", daemon, 3 * ROWS - 1)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        scraped = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                   if line.startswith("streamfit_rows_") and " " in line}
        print(f"idle after {state['rows']} rows, skipped {state['skipped_rows']}; scraped {scraped}")
        daemon.send_signal(signal.SIGTERM)  # finish the batch, write a final checkpoint, exit 0
        _, err = daemon.communicate(timeout=120)
        assert daemon.returncode == 0, err[-2000:]
        print("SIGTERM: exit 0, final checkpoint written")

        write_part(data, 3, rng)  # new data lands; the resumed daemon trains only it
        daemon = subprocess.Popen([*command, "--resume"], stderr=subprocess.PIPE, text=True)
        state = wait_idle(work / "health.json", daemon, 4 * ROWS - 1)
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=120)
        assert daemon.returncode == 0, err[-2000:]
        resumed = [line for line in err.splitlines() if "resumed from" in line]
        print(f"resumed ({resumed[0].split('INFO ')[-1] if resumed else '?'}): {state['rows']} rows in all, "
              f"each once")
        assert state["rows"] == 4 * ROWS - 1, state

        (letter,) = read_dead_letters(work / "dead.jsonl")
        print(f"dead letter: {letter.reason} in column {letter.column!r}, {letter.rows} row at {letter.position}")
        history = read_history(work / "ckpt")

    rows = [i.rows_end for i in history.intervals if i.metrics.get("loss") is not None]
    loss = [i.metrics["loss"] for i in history.intervals if i.metrics.get("loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(rows, loss, "o-", label="progressive loss per history interval")
    ax.axvline(3 * ROWS - 1, ls=":", color="grey", label="SIGTERM, then --resume")
    ax.set(xlabel="rows trained", ylabel="loss", yscale="log", title="streamfit serve: a run and its resume")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "operate_daemon.png", dpi=100)
    print("plot:", out / "operate_daemon.png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the plot")
    main(parser.parse_args().out)
