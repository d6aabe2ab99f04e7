"""A commit the consumer group refuses outside a handover (a rebalance revoked the partitions just before the
commit of a durable checkpoint went out): a normal event in a group, not a reason for the daemon to stop.

The Runner logs it (the step and the offsets) and goes on; commits are cumulative (a position names every
partition the learner trained), so the next durable checkpoint's commit covers the refused offsets.  A run whose
last commit is refused ends cleanly; resumed, it starts at its checkpoint's position: no row lost or trained twice.

A stand-in for KafkaSource refuses the commits (a broker refusing one at an exact moment cannot be produced
reliably); it raises what ``KafkaSource.commit`` raises for a refused commit.
"""

from __future__ import annotations

import logging

import anyio
import numpy as np
import pyarrow as pa
import pytest

from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import RunSummary
from streamfit.exceptions import SourceError
from streamfit.sources._base import Position, Source, SourceBatch
from tests.daemon.test_handover_partial_batch import TOPIC, _message, _runner, _until

GROUP = "g"
#: what KafkaSource.commit raises when the broker refuses a commit after a rebalance (confluent-kafka's text)
REFUSED = (f"Kafka commit to group {GROUP!r} failed: KafkaError{{code=ILLEGAL_GENERATION,val=22,"
           'str="Commit failed: Broker: Specified group generation id is not valid"}')


def _at(offset: int) -> Position:
    return {"topic": TOPIC, "partitions": {"0": {"offset": offset, "row": 0}}}


class _Topic(Source):
    """Partition 0 of a topic in KafkaSource's form (message k at offset k), replayable (``seek``): at the end of
    ``messages`` it ends, or waits for more (``live``); its first ``refusals`` commits are refused."""

    def __init__(self, messages: list[pa.RecordBatch], live: bool = False, refusals: int = 0) -> None:
        self.messages = messages
        self.live = live
        self.refusals = refusals
        self.commits: list[Position] = []  # accepted
        self.refused: list[Position] = []
        self._offset = 0

    def seek(self, position: Position) -> None:
        self._offset = position["partitions"]["0"]["offset"]

    async def __anext__(self) -> SourceBatch:
        while self._offset >= len(self.messages):
            if not self.live:
                raise StopAsyncIteration
            await anyio.sleep(0.005)
        offset = self._offset
        batch = self.messages[offset]
        self._offset += 1
        n = batch.num_rows

        def position_at(r: int) -> Position:
            return _at(offset + 1) if r >= n else {"topic": TOPIC, "partitions": {"0": {"offset": offset, "row": r}}}

        return SourceBatch(batch, position_at, where=f"partition 0 offset {offset}", meta={"partition": 0})

    async def commit(self, position: Position) -> None:
        if len(self.refused) < self.refusals:
            self.refused.append(position)
            raise SourceError(REFUSED)
        self.commits.append(position)


def _steps(tmp_path) -> list[int]:  # type: ignore[no-untyped-def]
    return [c.step for c in CheckpointStore(tmp_path / "ck").list()]


def _refusals(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [r.fields for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "event", None) == "commit" and r.levelno == logging.WARNING]


@pytest.mark.anyio
async def test_a_refused_commit_outside_a_handover_is_logged_and_the_next_checkpoint_commits_its_offsets(
        tmp_path, caplog):
    source = _Topic([], live=True, refusals=1)
    runner = _runner(tmp_path, source, every_batches=1, keep=10)
    stop = anyio.Event()
    summaries: list[RunSummary] = []

    async def run() -> None:
        summaries.append(await runner.run(stop))

    with caplog.at_level(logging.WARNING, logger="streamfit.daemon"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            source.messages.append(_message(64, seed=0))  # batch 1, checkpointed: its commit is refused
            await _until(lambda: source.refused)
            source.messages.append(_message(64, seed=1))  # batch 2: its checkpoint's commit goes through
            await _until(lambda: source.commits)
            stop.set()
    summary, = summaries  # the run went on past the refusal and stopped when told
    assert summary.ended_by == "stop" and summary.rows == 128 and summary.batches == 2
    assert source.refused == [_at(1)]
    assert source.commits == [_at(2)]  # covers offset 1 too: nothing left uncommitted
    assert _steps(tmp_path) == [1, 2]  # each step written once
    refusal, = _refusals(caplog)
    assert refusal["step"] == 1 and refusal["position"] == _at(1) and REFUSED in refusal["error"]


@pytest.mark.anyio
async def test_a_run_whose_commits_are_all_refused_ends_cleanly_and_resumes_exactly_from_its_checkpoint(
        tmp_path, caplog):
    messages = [_message(64, seed=k) for k in range(5)]
    first = _Topic(messages[:3], refusals=10**6)  # the group refuses every commit, the final one too
    with caplog.at_level(logging.WARNING, logger="streamfit.daemon"):
        summary = await _runner(tmp_path, first, every_batches=1, keep=10).run()
    assert summary.ended_by == "end" and summary.rows == 192
    assert first.commits == [] and first.refused[-1] == _at(3)
    assert [r["step"] for r in _refusals(caplog)] == [p["partitions"]["0"]["offset"] for p in first.refused]
    steps = _steps(tmp_path)  # (a checkpoint due while a write is in flight waits for the next batch)
    assert steps[-1] == 3 and steps == sorted(set(steps))  # the last durable step not written again at exit

    again = _Topic(messages)
    resumed = await _runner(tmp_path, again, every_batches=1, keep=10, resume=True).run()
    assert resumed.rows == 320 and resumed.rows_this_run == 128  # offsets 3 and 4 only: none lost, none twice
    assert again.commits[-1] == _at(5)
    steps = _steps(tmp_path)
    assert steps[-1] == 5 and steps == sorted(set(steps))

    once = tmp_path / "once"  # the same rows in one run, no refusal: the same model
    once.mkdir()
    uninterrupted = await _runner(once, _Topic(messages), every_batches=1).run()
    assert uninterrupted.rows == 320
    want = CheckpointStore(once / "ck").load_latest()
    got = CheckpointStore(tmp_path / "ck").load_latest()
    assert want is not None and got is not None and want.arrays.keys() == got.arrays.keys()
    for name, array in want.arrays.items():
        np.testing.assert_array_equal(got.arrays[name], array, err_msg=name)
