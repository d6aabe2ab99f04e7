"""A SIGTERM while ``serve`` is still starting (its preflight runs the model in a child process) stops it cleanly:
exit 0, a line saying nothing was trained, no checkpoint written; before, the default action killed it (-15)."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.daemon.helpers import run_cli, wait_for, write_model, write_stream


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


def test_sigterm_during_the_preflight_stops_serve_cleanly(tmp_path: Path) -> None:
    data, _ = write_stream(tmp_path, files=1, rows=256)
    model = write_model(tmp_path)
    ck = tmp_path / "ck"
    proc = run_cli("serve", "--source", f"parquet:{data}", "--model", str(model), "--checkpoint-dir", str(ck),
                   "--batch-size", "32", "--threads", "1", "--no-progress",
                   env={"STREAMFIT_CACHE_DIR": str(tmp_path / "cache")})  # an unchecked model: a child runs it
    wait_for(lambda: bool(_children(proc.pid)), proc, what="the preflight's child process")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "signal SIGTERM during start-up: stopping before the first batch (nothing trained)" in err
    assert not ck.exists() or not any(ck.iterdir())
