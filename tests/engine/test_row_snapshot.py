"""Copy-on-write snapshots of row-sparse tables: exactly the state at one step, read while training goes on."""

from __future__ import annotations

import threading
import time
import tracemalloc

import numpy as np
import pytest

from streamfit._engine.steps.row_snapshot import CowSnapshot
from streamfit._engine.trainer import Trainer
from tests.engine.test_bigtable import _batches, table_model

ROWS = 4096


def _state(trainer: Trainer) -> dict[str, np.ndarray]:
    tables = trainer.tables
    out = {k: v.copy() for k, v in tables.arrays.items()}
    for st in tables.state_arrays().values():
        out.update({k: v.copy() for k, v in st.items()})
    return out


def _read(snap: CowSnapshot, pause: "threading.Event | None" = None, steps: "threading.Semaphore | None" = None
          ) -> dict[str, np.ndarray]:
    """Every array of ``snap`` read block by block; after each block, let the training thread take a step."""
    out = {}
    for name in snap.names:
        parts = []
        for block in snap.blocks(name):
            parts.append(block.copy())
            if steps is not None:
                steps.release()
                assert pause is not None
                pause.wait(5)
                pause.clear()
        out[name] = np.concatenate(parts)
    return out


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd"])
def test_a_snapshot_read_while_steps_write_the_table_is_the_state_at_its_step(optimizer):
    trainer = Trainer(table_model(ROWS, dim=4), loss="log_loss", optimizer=optimizer, learning_rate=0.5,
                      sparse=True)
    batches = list(_batches(ROWS, 16, n=48))
    for X, y in batches[:5]:
        trainer.step(X, y)
    want = _state(trainer)  # the state at step 5, captured by stopping there
    snap = trainer.tables.snapshot()
    snap._block_rows = {k: 256 for k in snap._block_rows}  # 16 blocks per array: a step between two blocks
    steps, stepped = threading.Semaphore(0), threading.Event()
    got: dict[str, np.ndarray] = {}
    reader = threading.Thread(target=lambda: got.update(_read(snap, stepped, steps)))
    reader.start()
    done = 0
    while reader.is_alive():
        if steps.acquire(timeout=0.05):
            trainer.step(*batches[done % len(batches)])  # writes rows behind and ahead of the reader's cursor
            done += 1
            stepped.set()
    reader.join()
    assert done >= 16 and snap.saved_rows > 0 and snap.closed  # steps overwrote rows it had not read yet
    assert trainer.tables.open_snapshots == 0
    assert sorted(got) == sorted(want)
    now = _state(trainer)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert not np.array_equal(want[name], now[name]), name  # training went on meanwhile


def test_a_state_load_during_a_snapshot_keeps_the_snapshot_and_closing_stops_saving():
    trainer = Trainer(table_model(ROWS, dim=4), loss="log_loss", optimizer="adagrad", learning_rate=0.5,
                      sparse=True)
    for X, y in _batches(ROWS, 3, n=32):
        trainer.step(X, y)
    want = _state(trainer)
    snap = trainer.tables.snapshot()
    trainer.tables.write({"E": np.zeros((ROWS, 4), np.float32)})  # e.g. a rollback restoring another state
    got = _read(snap)
    np.testing.assert_array_equal(got["E"], want["E"])
    abandoned = trainer.tables.snapshot()
    abandoned.close()  # a write that failed or never ran
    assert trainer.tables.open_snapshots == 0
    X, y = next(_batches(ROWS, 1, n=32, seed=9))
    trainer.step(X, y)
    assert abandoned.saved_rows == 0
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(abandoned.blocks("E")))


def test_taking_a_snapshot_allocates_nothing_table_sized():
    """The training thread's part of a full checkpoint: no copy of the table or its optimizer state."""
    from streamfit._engine.testing import two_input_model
    from streamfit.daemon.state import snapshot_tables
    from streamfit.estimators import OnnxRegressor

    rows = 1 << 15  # 2 MiB of table, 2 MiB of AdaGrad state
    est = OnnxRegressor(two_input_model(3, rows, dim=16, seed=0), optimizer="adagrad", learning_rate="constant",
                        eta0=0.05, penalty=None)
    rng = np.random.default_rng(0)
    est.partial_fit({"x": rng.standard_normal((64, 3)).astype(np.float32), "ids": rng.integers(0, rows, 64)},
                    rng.standard_normal(64).astype(np.float32))
    table_bytes = rows * 16 * 4
    tracemalloc.start()
    try:
        ts = snapshot_tables(est, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        ts.tables.release()
    assert peak < table_bytes / 2, peak  # (the skeleton model and the small state: ~0.5 MB here)
    assert est.trainer_.tables.open_snapshots == 0
    tracemalloc.start()
    try:
        copied = snapshot_tables(est, None, copy=True)  # an in-memory rollback point does copy, as fulls did
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(isinstance(v, np.ndarray) for v in copied.tables.arrays.values())
    assert peak > 2 * table_bytes


def test_a_snapshot_read_while_another_thread_writes_rows_freely_is_exact():
    """No interleaving imposed: a thread writes random rows (after ``before_write``, as a step does) as fast
    as it can while blocks are copied; every block read still holds the values frozen when it was taken."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1 << 18, 8)).astype(np.float32)  # 8 MiB: copies of 1 MiB blocks release the GIL
    b = np.zeros((1 << 18, 8), np.float32)
    current: list[CowSnapshot] = []
    step = threading.Lock()  # one "step" (save aside, then write) at a time, as on the training thread
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        g = np.random.default_rng(4)
        while not stop.is_set():
            rows = np.unique(g.integers(0, a.shape[0], 2000))
            with step:
                for name, arr in (("a", a), ("b", b)):
                    for snap in current:
                        snap.before_write(name, rows)
                    arr[rows] = g.standard_normal((rows.size, 8)).astype(np.float32)
            writes[0] += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(6):
            with step:  # between two steps: the state to compare with, and the snapshot of it
                want = {"a": a.copy(), "b": b.copy()}
                snap = CowSnapshot({"a": a, "b": b}, block_rows=1 << 15)
                current[:] = [snap]
            got = {}
            for name in ("a", "b"):
                parts = []
                for blk in snap.blocks(name):
                    parts.append(blk.copy())
                    time.sleep(0.0005)  # lets the writing thread in between blocks too, not only during copies
                got[name] = np.concatenate(parts)
            assert snap.saved_rows > 0
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    finally:
        stop.set()
        thread.join()
    assert writes[0] > 10
