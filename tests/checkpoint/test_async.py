from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from streamfit.checkpoint import AsyncCheckpointWriter, CheckpointStore
from streamfit.exceptions import CheckpointError

from tests.checkpoint.helpers import assert_content, content


class GatedStore(CheckpointStore):
    """A real store whose saves wait for ``gate``, to hold a write in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.started = threading.Event()

    def save(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        self.started.set()
        assert self.gate.wait(10)
        return super().save(*args, **kwargs)


def test_writes_in_background_and_reports_duration(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    with AsyncCheckpointWriter(store) as writer:
        for step in (1, 2, 3):
            assert writer.submit(step, *content(step)) is True
        writer.flush()
        assert not writer.busy
        result = writer.last_result
        assert result is not None and result.step == 3 and result.path.name == "ckpt-000000000003"
        assert result.seconds >= 0
    assert [i.step for i in store.list()] == [2, 3]
    assert_content(store.load_latest(), 3)


def test_skip_or_wait_while_a_write_is_in_flight(tmp_path):
    store = GatedStore(tmp_path)
    writer = AsyncCheckpointWriter(store)
    try:
        assert writer.submit(1, *content(1))
        assert store.started.wait(5)
        assert writer.busy
        assert writer.submit(2, *content(2), wait=False) is False
        assert writer.skipped == 1
        with pytest.raises(CheckpointError, match="still running after 0.05 s"):
            writer.submit(2, *content(2), timeout=0.05)

        waiter_result: list[bool] = []
        waiter = threading.Thread(target=lambda: waiter_result.append(writer.submit(3, *content(3))))
        waiter.start()
        waiter.join(0.1)
        assert waiter.is_alive()  # wait=True blocks until the write in flight is done
        store.gate.set()
        waiter.join(5)
        assert waiter_result == [True]
        writer.flush()
    finally:
        store.gate.set()
        writer.close()
    assert [i.step for i in store.list()] == [1, 3]


def test_worker_error_surfaces_on_next_call_once(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(5, *content(5))
    writer = AsyncCheckpointWriter(store)
    assert writer.submit(3, *content(3))  # steps must increase: fails in the worker
    with pytest.raises(CheckpointError, match="background checkpoint write of step 3 failed") as info:
        writer.flush()
    assert isinstance(info.value.__cause__, CheckpointError)
    writer.flush()  # reported once, then cleared

    assert writer.submit(4, *content(4))
    with pytest.raises(CheckpointError, match="step 4 failed"):
        writer.close()  # close waits for the write and reports its error
    writer.close()  # idempotent
    with pytest.raises(CheckpointError, match="closed"):
        writer.submit(6, *content(6))
    assert_content(store.load_latest(), 5)


def test_error_surfaces_on_submit(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(5, *content(5))
    writer = AsyncCheckpointWriter(store)
    writer.submit(2, *content(2))
    deadline = time.monotonic() + 5
    while writer.busy and time.monotonic() < deadline:
        time.sleep(0.005)
    with pytest.raises(CheckpointError, match="step 2 failed.*steps must increase"):
        writer.submit(6, *content(6))
    writer.close()
    assert [i.step for i in store.list()] == [5]


def test_invalid_arguments_raise_on_the_callers_thread(tmp_path):
    with AsyncCheckpointWriter(CheckpointStore(tmp_path)) as writer:
        with pytest.raises(CheckpointError, match="expected a numpy array"):
            writer.submit(1, b"m", {"bad": object()})  # type: ignore[dict-item]
        with pytest.raises(CheckpointError, match="expected a JSON value"):
            writer.submit(1, b"m", {}, {"x": object()})
        assert not writer.busy


def test_meta_is_copied_at_submit(tmp_path):
    store = GatedStore(tmp_path)
    meta = {"position": {"row": 1}}
    with AsyncCheckpointWriter(store) as writer:
        writer.submit(1, b"m", {}, meta)
        meta["position"]["row"] = 999  # the engine moves on while the write is pending
        store.gate.set()
    assert store.load_latest().meta == {"position": {"row": 1}}


def test_close_finishes_pending_write(tmp_path):
    store = CheckpointStore(tmp_path)
    writer = AsyncCheckpointWriter(store)
    writer.submit(1, *content(1))
    writer.close()
    assert_content(store.load_latest(), 1)
