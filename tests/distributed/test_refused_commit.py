"""A commit its source refuses (KafkaSource's SourceError: the group refused it) does not end a distributed run.

As for one learner (tests/daemon/test_refused_commit.py): the learner goes on training, its refusal goes back to
the coordinator, which logs it as a warning (learner, global checkpoint, offsets, error); that learner's next
commit carries the offsets (a position names every partition it trained).  Before, the SourceError left
``Learner.apply`` (the commit after a barrier) or ``Learner.commit`` (the final one), Ray raised it in the
coordinator, which does not restart the group for an error that is not a learner lost: the run ended with it.

The learner's side runs in this process (no Ray); the whole run's on a local Ray cluster (``-m ray``).  The
sources are a stand-in (:mod:`tests.distributed._refusing`): Parquet files whose commits are refused.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

from streamfit import LinearRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.distributed._learner import Learner
from streamfit.distributed._messages import StartFrom
from streamfit.distributed._shares import Share, plan_shares
from tests.distributed import _refusing
from tests.distributed._clusters import linear_tables, write_parts
from tests.distributed._refusing import REFUSED, commits, refusing

D = 4
ROWS_PER_FILE = 1000
FILES = 4
BATCH = 100


def _estimator() -> LinearRegressor:
    return LinearRegressor(optimizer="sgd", learning_rate="constant", eta0=0.1, penalty=None)


def _tables() -> list[pa.Table]:
    return linear_tables(FILES, ROWS_PER_FILE, D, seed=3)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_parts(root, _tables(), row_group_size=500)
    return root


def _at(position: Any) -> tuple[str, int]:
    """A Parquet position, ordered as the stream reads it (a share's files in name order)."""
    return position["file"], position["row"]


def _learner(share: Share) -> Learner:
    """One learner on ``share``, rounds of 2 batches of 100 rows, a finite share."""
    return Learner(share, _estimator(), {"batch_size": BATCH}, 2, None, None, True)


# -- the learner (no Ray) ---------------------------------------------------------------------------------------
def test_a_refused_commit_is_returned_the_learner_trains_on_and_its_next_commit_carries_the_offsets(
        parquet_dir, tmp_path) -> None:
    share, = refusing(plan_shares(f"parquet:{parquet_dir}", 1), tmp_path / "log", [1])

    async def run() -> None:
        learner = _learner(share)
        await learner.start(StartFrom())
        first = await learner.next_round(1, True)
        assert first is not None and first.rows == 200
        refusal = await learner.apply(1, None, first.position)  # raised SourceError before
        assert refusal is not None and REFUSED in refusal
        second = await learner.next_round(2, True)  # the next barrier: it trained on
        assert second is not None and second.rows == 400 and _at(second.position) > _at(first.position)
        assert await learner.apply(2, None, second.position) is None
        assert await learner.commit({"file": "part-003.parquet", "row": 0}) is None
        await learner.close()
        assert commits(tmp_path / "log", 0) == [(True, first.position), (False, second.position),
                                                (False, {"file": "part-003.parquet", "row": 0})]

    asyncio.run(run())


def test_a_refused_final_commit_is_returned_and_another_commit_error_still_raises(parquet_dir, tmp_path) -> None:
    shares = plan_shares(f"parquet:{parquet_dir}", 1)
    refused, = refusing(shares, tmp_path / "refused", [10**6])
    broken, = refusing(shares, tmp_path / "broken", [0], error=True)

    async def run() -> None:
        learner = _learner(refused)
        await learner.start(StartFrom())
        while not (report := await learner.next_round(1, True)).ended:  # type: ignore[union-attr]
            assert REFUSED in (await learner.apply(1, None, report.position) or "")  # type: ignore[union-attr]
        assert report.rows == FILES * ROWS_PER_FILE  # type: ignore[union-attr]
        assert REFUSED in (await learner.commit(report.position) or "")  # type: ignore[union-attr]
        await learner.close()

        other = _learner(broken)  # not a refusal: raised as before
        await other.start(StartFrom())
        report = await other.next_round(1, True)
        with pytest.raises(RuntimeError, match="closed"):
            await other.apply(1, None, report.position)  # type: ignore[union-attr]
        await other.close()

    asyncio.run(run())


# -- the run (a local Ray cluster) -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray")
    from tests.distributed._clusters import driven_cluster

    with driven_cluster(nodes=1, cpus=2) as c:
        yield from _refusing.ship_by_value()


def _refusals(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records  # type: ignore[attr-defined]
            if getattr(r, "event", None) == "commit" and r.levelno == logging.WARNING]


def _run(parquet_dir: Path, monkeypatch: pytest.MonkeyPatch, log: Path | None, refusals: list[int], ckpt: Path,
         **kw: Any) -> tuple[LinearRegressor, Any]:
    """A 2-learner run on ``parquet_dir`` (rounds of 5 batches, a global checkpoint each), learner ``i``'s
    first ``refusals[i]`` commits refused (``log``: none refused, plain Parquet shares)."""
    from streamfit.distributed import DistributedTrainer

    if log is not None:
        monkeypatch.setattr("streamfit.distributed._coordinator.plan_shares",
                            lambda uri, workers, options=None: refusing(plan_shares(uri, workers, options), log,
                                                                        refusals))
    est = _estimator()
    summary = DistributedTrainer(est, f"parquet:{parquet_dir}", workers=2, sync_every_batches=5, batch_size=BATCH,
                                 checkpoint_dir=ckpt, keep=100, learner_cpus=0.5, **kw).run()
    monkeypatch.undo()
    return est, summary


def _steps(ckpt: Path) -> list[int]:
    return [c.step for c in CheckpointStore(ckpt).list()]


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ray_a_refused_commit_is_logged_and_the_run_goes_on_its_next_commit_carrying_the_offsets(
        cluster, parquet_dir, tmp_path, monkeypatch, caplog) -> None:
    log = tmp_path / "log"
    with caplog.at_level(logging.WARNING, logger="streamfit.daemon"):
        _, summary = _run(parquet_dir, monkeypatch, log, [1, 0], tmp_path / "ckpt")
    assert summary.ended_by == "end" and summary.restarts == 0 and summary.rows == FILES * ROWS_PER_FILE
    (was_refused, refused), *after = commits(log, 0)
    assert was_refused and after and not any(r for r, _ in after)
    assert _at(after[0][1]) > _at(refused) and after[-1][1] == summary.positions[0]  # the offsets carried
    assert not any(r for r, _ in commits(log, 1)) and commits(log, 1)[-1][1] == summary.positions[1]
    warning, = _refusals(caplog)
    assert warning["learner"] == 0 and warning["position"] == refused and REFUSED in warning["error"]
    store = CheckpointStore(tmp_path / "ckpt")
    ckpt = store.load(next(c.path for c in store.list() if c.step == warning["round"]))  # the one refused
    assert ckpt.meta["position"]["learners"][0] == refused
    steps = _steps(tmp_path / "ckpt")
    assert steps == sorted(set(steps)) and steps[-1] == summary.rounds  # each step written once


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_ray_a_run_whose_commits_are_all_refused_ends_cleanly_and_resumes_exactly_from_its_checkpoint(
        cluster, parquet_dir, tmp_path, monkeypatch, caplog) -> None:
    log, ckpt, half = tmp_path / "log", tmp_path / "ckpt", FILES * ROWS_PER_FILE // 2
    with caplog.at_level(logging.WARNING, logger="streamfit.daemon"):
        _, first = _run(parquet_dir, monkeypatch, log, [10**6] * 2, ckpt, max_rows=half)
    assert first.ended_by == "max_rows" and first.rows == half and first.restarts == 0
    asked = [commits(log, i) for i in range(2)]
    assert all(asked) and all(r for c in asked for r, _ in c)  # every commit refused, the final one too
    assert [c[-1][1] for c in asked] == first.positions
    assert sorted((w["learner"], str(w["position"])) for w in _refusals(caplog)) == sorted(
        (i, str(p)) for i, c in enumerate(asked) for _, p in c)
    steps = _steps(ckpt)
    assert steps == sorted(set(steps)) and steps[-1] == first.rounds

    est, resumed = _run(parquet_dir, monkeypatch, log, [0, 0], ckpt, resume=True)
    assert resumed.resumed_from is not None and resumed.rows == FILES * ROWS_PER_FILE
    for i in range(2):  # the resumed learners' first commits are past the refused ones; they end at the ends
        accepted = [p for r, p in commits(log, i) if not r]
        assert _at(accepted[0]) > _at(first.positions[i]) and accepted[-1] == resumed.positions[i]
    steps = _steps(ckpt)
    assert steps == sorted(set(steps)) and steps[-1] == resumed.rounds
    # every row once: the feature scaler (merged exactly over learners) counted each, and the model is an
    # uninterrupted run's (rounds are deterministic; the budget ended the first run at a round's end)
    arrays = CheckpointStore(ckpt).load_latest().arrays
    counts = [int(v) for k, v in arrays.items() if k.endswith("/count")]
    assert counts and all(c == FILES * ROWS_PER_FILE for c in counts), counts
    ref, _ = _run(parquet_dir, monkeypatch, None, [0, 0], tmp_path / "ref")
    for name, w in ref.trainer_.get_weights().items():
        np.testing.assert_allclose(est.trainer_.get_weights()[name], w, rtol=1e-6, atol=1e-7)

