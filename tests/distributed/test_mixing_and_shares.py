"""Parameter mixing and share planning, without Ray: pure numpy and real files / the real broker."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit.distributed import mix, plan_shares, synced_names


def _stats(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"scaler/count": np.asarray(float(len(x))), "scaler/mean": x.mean(0),
            "scaler/m2": ((x - x.mean(0)) ** 2).sum(0)}


def test_weights_are_averaged_by_rows_and_idle_learners_left_out() -> None:
    a = {"trainer/weights/W": np.array([[1.0], [2.0]], np.float32), "trainer/optimizer/W__m": np.ones((2, 1))}
    b = {"trainer/weights/W": np.array([[5.0], [6.0]], np.float32), "trainer/optimizer/W__m": np.zeros((2, 1))}
    out = mix([a, b], [300, 100], None)
    np.testing.assert_allclose(out["trainer/weights/W"], [[2.0], [3.0]])
    assert out["trainer/weights/W"].dtype == np.float32
    np.testing.assert_allclose(out["trainer/optimizer/W__m"], 0.75)
    np.testing.assert_array_equal(mix([a, None], [300, 0], None)["trainer/weights/W"], a["trainer/weights/W"])
    assert mix([None, None], [0, 0], None) is None
    assert synced_names({**a, "n": np.zeros(2, np.int64)}, sync_optimizer=False) == ["trainer/weights/W"]


def test_scaler_statistics_merge_exactly_across_rounds() -> None:
    rng = np.random.default_rng(0)
    shared = rng.standard_normal((50, 3))          # what both learners held after the last mix
    new_a, new_b = rng.standard_normal((30, 3)) + 1, 2 * rng.standard_normal((70, 3))
    state_a = {"trainer/weights/W": np.zeros(1), **_stats(np.vstack([shared, new_a]))}
    state_b = {"trainer/weights/W": np.zeros(1), **_stats(np.vstack([shared, new_b]))}
    out = mix([state_a, state_b], [30, 70], _stats(shared))
    expected = _stats(np.vstack([shared, new_a, new_b]))  # every row once
    for key, value in expected.items():
        np.testing.assert_allclose(out[key], value, rtol=1e-12)
    # any running statistics (the target scaler too), each group on its own
    target = {f"target_{k}": v for k, v in _stats(shared[:, :1]).items()}
    a2 = {**state_a, **{f"target_{k}": v for k, v in _stats(np.vstack([shared, new_a])[:, :1]).items()}}
    b2 = {**state_b, **{f"target_{k}": v for k, v in _stats(np.vstack([shared, new_b])[:, :1]).items()}}
    out = mix([a2, b2], [30, 70], {**_stats(shared), **target})
    np.testing.assert_allclose(out["target_scaler/mean"], np.vstack([shared, new_a, new_b])[:, :1].mean(0))
    assert "target_scaler/m2" in synced_names(a2, sync_optimizer=False)


def test_parquet_files_are_dealt_round_robin(tmp_path) -> None:
    for i in range(5):
        pq.write_table(pa.table({"x": [float(i)], "y": [1.0]}), tmp_path / f"part-{i}.parquet")
    shares = plan_shares(f"parquet:{tmp_path}", 2)
    assert [[f.rsplit("/", 1)[1] for f in s.files] for s in shares] == [
        ["part-0.parquet", "part-2.parquet", "part-4.parquet"], ["part-1.parquet", "part-3.parquet"]]
    with pytest.raises(ValueError, match="5 Parquet file\\(s\\) cannot be shared among 6 learners"):
        plan_shares(f"parquet:{tmp_path}", 6)
    # a followed directory (refused before): no file list (it grows), each learner reads the files its name hashes to
    followed = plan_shares(f"parquet:{tmp_path}?follow=true", 2)
    assert [(s.follow, s.learners, s.files) for s in followed] == [(True, 2, ()), (True, 2, ())]
    from streamfit.distributed._shares import file_owner

    owners = [file_owner(f"part-{i}.parquet", 2) for i in range(5)]
    assert set(owners) == {0, 1}
    assert followed[0].describe() == {"index": 0, "kind": "parquet", "partitions": [], "files": [], "follow": True,
                                      "learners": 2}


@pytest.mark.kafka
def test_kafka_partitions_are_assigned_by_the_coordinator(kafka_broker) -> None:
    topic = kafka_broker.create_topic(partitions=3)
    uri = f"kafka://{kafka_broker.bootstrap}/{topic}?group=g"
    assert [s.partitions for s in plan_shares(uri, 2)] == [(0, 2), (1,)]
    with pytest.raises(ValueError, match="3 partition\\(s\\): at most that many learners"):
        plan_shares(uri, 4)


def test_a_running_scaler_kept_as_shifted_sums_loads_the_merged_statistics() -> None:
    """The real RunningScaler's state (count, shift, s1, s2 and the derived mean, m2): the mix carries the merged
    statistics in its sums too, so a learner that loads it has one consistent scaler of every row.  (Merging only
    count/mean/m2 left each learner's own sums beside the merged count: its mean and scale went wrong, the
    progressive loss of tests/distributed/test_ray.py 7 % above one learner's.)"""
    from streamfit.models.scaler import RunningScaler

    rng = np.random.default_rng(1)
    shared, new_a, new_b = rng.standard_normal((50, 3)) + 5, rng.standard_normal((30, 3)), rng.standard_normal((70, 3))

    def scaler(*parts: np.ndarray, state: dict | None = None) -> RunningScaler:
        s = RunningScaler(3)
        if state is not None:
            s.load_state_dict(state)
        for x in parts:
            s.update(x)
        return s

    def arrays(s: RunningScaler) -> dict[str, np.ndarray]:
        return {"trainer/weights/W": np.zeros(1), **{f"scaler/{k}": v for k, v in s.state_dict().items()}}

    before = arrays(scaler(shared))
    state = {k.removeprefix("scaler/"): v for k, v in before.items() if k.startswith("scaler/")}
    a, b = arrays(scaler(new_a, state=state)), arrays(scaler(new_b, state=state))
    assert {"scaler/shift", "scaler/s1", "scaler/s2"} <= set(synced_names(a, sync_optimizer=False))
    out = mix([a, b], [30, 70], before)
    loaded = scaler(state={k.removeprefix("scaler/"): v for k, v in {**a, **out}.items() if k.startswith("scaler/")})
    every = np.vstack([shared, new_a, new_b])
    assert loaded.count == len(every)
    np.testing.assert_allclose(loaded.mean_, every.mean(0), rtol=1e-12)
    np.testing.assert_allclose(loaded.var_, every.var(0), rtol=1e-10)
