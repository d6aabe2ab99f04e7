"""A handover (a Kafka revoke, :class:`~streamfit.sources._commits.Handover`) settled by the Runner in process, with
a source that stands in for KafkaSource: the rows it returned of the revoked partition that wait short of a full
batch are trained at once, checkpointed and committed, not after ``max_batch_wait``.

Why it matters: the broker here (tansu) completes a rebalance about half of ``session.timeout.ms`` after a member
joins (1 s in the tests), whether or not the member settling a revoke has rejoined; a commit sent after that is
refused (``ILLEGAL_GENERATION``), and the partition's next owner trains the rows since the last commit again.  A
handover that waited for ``--max-batch-wait`` (1 s) for its partial batch missed that window.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pytest

from streamfit import OnnxRegressor
from streamfit.daemon import Runner
from streamfit.exceptions import SourceError
from streamfit.sources._base import Position, Source, SourceBatch
from streamfit.sources._commits import Handover
from tests.daemon.helpers import N_FEATURES, write_model

TOPIC = "t"


def _message(rows: int, seed: int) -> pa.RecordBatch:
    X = np.random.default_rng(seed).standard_normal((rows, N_FEATURES)).astype(np.float32)
    cols = {f"x{j}": X[:, j] for j in range(N_FEATURES)}
    cols["y"] = X.sum(axis=1).astype(np.float32)
    return pa.record_batch(cols)


class _OnePartition(Source):
    """Partition 0 of a topic, one message per record batch the test sends (message k at offset k), positions in
    KafkaSource's form; stays open (a live stream) while none is sent; keeps the settler and the commits."""

    def __init__(self) -> None:
        self.send, self._receive = anyio.create_memory_object_stream[pa.RecordBatch](100)
        self.settler = None
        self.commits: list[Position] = []
        self._offset = 0

    def attach_handover_settler(self, settler) -> None:  # type: ignore[no-untyped-def]
        self.settler = settler

    async def __anext__(self) -> SourceBatch:
        batch = await self._receive.receive()
        offset, self._offset = self._offset, self._offset + 1
        n = batch.num_rows

        def position_at(r: int) -> Position:
            at = {"offset": offset + 1, "row": 0} if r >= n else {"offset": offset, "row": r}
            return {"topic": TOPIC, "partitions": {"0": at}}

        return SourceBatch(batch, position_at, where=f"partition 0 offset {offset}", meta={"partition": 0})

    async def commit(self, position: Position) -> None:
        self.commits.append(position)


class _Refusing(_OnePartition):
    """A group that has moved on: every commit refused, as KafkaSource raises it."""

    async def commit(self, position: Position) -> None:
        raise SourceError("commit refused: ILLEGAL_GENERATION (the group rebalanced)")


async def _until(predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.005)


def _runner(tmp_path, source: Source, every_batches: int = 100, **kw: Any) -> Runner:  # type: ignore[no-untyped-def]
    """A Runner of batches of 64 rows on ``source``, checkpointed every ``every_batches`` batches (``kw``: more
    Runner options); ``max_batch_wait`` far beyond a handover's time: only a handover can have rows short of a
    full batch trained."""
    est = OnnxRegressor(str(write_model(tmp_path)), optimizer="adam", learning_rate="constant", eta0=0.01,
                        penalty=None, batch_size=64, threads=1)
    return Runner(est, lambda: source, checkpoint_dir=tmp_path / "ck",
                  every_batches=every_batches, batch_size=64, max_batch_wait=60.0, **kw)


@pytest.mark.anyio
async def test_a_handover_trains_the_partial_batch_at_once_and_commits_it(tmp_path):
    source = _OnePartition()
    runner = _runner(tmp_path, source)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run, stop)
        await source.send.send(_message(100, seed=0))  # a full batch of 64 rows, 36 rows wait for more
        await _until(lambda: runner.rows == 64)
        assert runner._loop is not None and runner._loop.rebatcher.pending_rows == 36
        handover = Handover(TOPIC, {0: (1, 0)}, time.monotonic() + 4.0)  # every row of message 0 was returned
        done: list[float] = []

        def revoke() -> None:  # as KafkaSource's revoke callback does, in its consumer thread
            t0 = time.monotonic()
            assert source.settler is not None
            source.settler(handover)
            handover.done.wait(10)
            done.append(time.monotonic() - t0)

        thread = threading.Thread(target=revoke)
        thread.start()
        await anyio.to_thread.run_sync(thread.join)
        commits = list(source.commits)
        rows = runner.rows
        stop.set()
    assert rows == 100
    assert commits and commits[-1] == {"topic": TOPIC, "partitions": {"0": {"offset": 1, "row": 0}}}
    assert handover.committed.is_set()  # what the source logs as "committed"
    # settled well within the group's patience (tansu: ~1 s), not after 60 % of the handover's 4 s
    assert done[0] < 1.0, f"the handover took {done[0]:.2f} s"


@pytest.mark.anyio
async def test_a_handover_whose_commit_is_refused_is_let_go_without_being_marked_committed(tmp_path):
    """The settler gives up at a refused commit: ``done`` without ``committed``, so the source does not log the
    partitions as committed (their next owner starts at the group's last commit)."""
    source = _Refusing()
    runner = _runner(tmp_path, source)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run, stop)
        await source.send.send(_message(100, seed=0))
        await _until(lambda: runner.rows == 64)
        handover = Handover(TOPIC, {0: (1, 0)}, time.monotonic() + 4.0)
        assert source.settler is not None
        source.settler(handover)
        await anyio.to_thread.run_sync(lambda: handover.done.wait(10))
        rows = runner.rows
        stop.set()
    assert handover.done.is_set() and not handover.committed.is_set()
    assert rows == 100  # trained all the same: the refusal loses nothing here, the next owner may train them again
