"""Kill a writer process with SIGKILL at every named point of a save, and at random instants.

Invariant checked after each kill: ``load_latest()`` returns a complete checkpoint (the old or the
new one, never a mix), and every ``ckpt-*`` directory on disk is complete.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import streamfit.checkpoint
from streamfit.checkpoint import CheckpointStore

from tests.checkpoint.helpers import assert_content, content

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

WRITER = Path(__file__).with_name("crash_writer.py")
REPO = Path(streamfit.checkpoint.__file__).resolve().parents[2]


def _spawn(root: Path, start: int, mode: str, ready: Path, pause: str | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("STREAMFIT_CHECKPOINT_TEST_PAUSE", None)
    if pause:
        env["STREAMFIT_CHECKPOINT_TEST_PAUSE"] = pause
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(root), str(start), mode, str(ready)], env=env, stderr=subprocess.PIPE
    )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early ({proc.returncode}): {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"writer never reached {path.name}")
        time.sleep(0.005)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)  # reap it
    assert proc.returncode == -signal.SIGKILL
    proc.stderr.close()


def _assert_all_dirs_complete(store: CheckpointStore) -> None:
    for path in store.root.glob("ckpt-*"):
        ckpt = store.load(path)  # raises if any ckpt-* directory is torn
        assert_content(ckpt, ckpt.step)


# point -> (step load_latest must return, committed steps left behind)
POINTS = {
    "model_written": (2, [1, 2]),
    "files_written": (2, [1, 2]),
    "renamed": (2, [1, 2]),
    "latest_tmp_written": (2, [1, 2]),
    "latest_updated": (3, [1, 2, 3]),
    "retention": (3, [2, 3]),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_sigkill_at_named_point(tmp_path, point):
    root = tmp_path / "ckpts"
    store = CheckpointStore(root, keep=2)
    for step in (1, 2):
        store.save(step, *content(step))

    marker = tmp_path / "paused"
    proc = _spawn(root, 3, "one", tmp_path / "ready", pause=f"{point}:{marker}")
    try:
        _wait_for(marker, proc)
        assert marker.read_text() == point
    finally:
        _kill(proc)

    expected_step, committed = POINTS[point]
    assert_content(store.load_latest(), expected_step)
    assert [i.step for i in store.list()] == committed
    _assert_all_dirs_complete(store)

    # the next writer ignores and removes whatever the dead one left, and carries on
    store.save(4, *content(4))
    assert_content(store.load_latest(), 4)
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert [i.step for i in store.list()][-1] == 4 and len(store.list()) == 2


def _wait_for_commit(store: CheckpointStore, after: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """Wait until ``latest`` names a checkpoint newer than step ``after`` (the writer committed it); its step."""
    deadline = time.monotonic() + timeout
    while not (committed := store.list()) or committed[-1].step <= after:
        if proc.poll() is not None:
            raise AssertionError(f"writer exited early ({proc.returncode}): {proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"writer never committed a checkpoint after step {after}")
        time.sleep(0.002)
    return committed[-1].step


def test_sigkill_at_random_instants(tmp_path):
    """The kill instant is random, but placed by the writer's progress, not by wall time: a round waits for 0,
    1 or 2 commits of its writer (0: the kill may hit the removal of the dead writer's leftovers or the first
    save), then a random delay.  A save takes ~5 ms on an idle machine and ~100-500 ms under CPU load, so a
    delay from 'ready' alone would, under load, kill every writer before it committed anything."""
    rng = random.Random(1234)
    root = tmp_path / "ckpts"
    store = CheckpointStore(root, keep=2)
    store.save(1, *content(1))
    newest = 1
    for round_ in range(9):
        ready = tmp_path / f"ready-{round_}"
        proc = _spawn(root, newest + 1, "loop", ready)
        committed = newest
        try:
            _wait_for(ready, proc)
            for _ in range(round_ % 3):
                committed = _wait_for_commit(store, committed, proc)
            time.sleep(rng.uniform(0.0, 0.08))
        finally:
            _kill(proc)
        ckpt = store.load_latest()
        assert ckpt is not None and ckpt.step >= committed  # a commit the test saw survives the kill
        assert_content(ckpt, ckpt.step)
        _assert_all_dirs_complete(store)
        newest = ckpt.step


@pytest.mark.parametrize(("point", "expected"), [("files_written", None), ("renamed", 1)])
def test_sigkill_during_the_very_first_save(tmp_path, point, expected):
    root = tmp_path / "ckpts"
    marker = tmp_path / "paused"
    proc = _spawn(root, 1, "one", tmp_path / "ready", pause=f"{point}:{marker}")
    try:
        _wait_for(marker, proc)
    finally:
        _kill(proc)
    store = CheckpointStore(root)
    ckpt = store.load_latest()  # no latest pointer yet: a complete directory still counts
    if expected is None:
        assert ckpt is None
    else:
        assert_content(ckpt, expected)
    _assert_all_dirs_complete(store)
