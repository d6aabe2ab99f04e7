"""Faults of a cluster, not only of a process (issue 22, part 5), on real local Ray clusters on 127.0.0.1.

A second Ray node (its own ``ray start`` processes, started here) SIGKILLed mid-run; a learner's worker process
stopped (SIGSTOP) so that it hangs without dying; the coordinator (``streamfit serve --workers``) SIGKILLed while
it writes a global checkpoint, between the files of it.  Each run ends with every row trained exactly once: the
weights equal an uninterrupted run's (rounds are deterministic) and the feature scaler, merged exactly over the
learners, has counted every row once.  Each test starts (and always stops) its own cluster: ~20-60 s each.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

ray = pytest.importorskip("ray")

from streamfit import LinearRegressor  # noqa: E402
from streamfit.checkpoint import CheckpointStore  # noqa: E402
from streamfit.distributed import DistributedTrainer, LocalRayCluster  # noqa: E402
from tests.distributed._clusters import driven_cluster, linear_tables, write_parts  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

D = 8
ROWS_PER_FILE = 4000
FILES = 4
ROWS = FILES * ROWS_PER_FILE
BATCH = 100
#: a lost node is declared dead after ~1.5 s instead of Ray's default ~15 s (health checks of the raylets)
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                   "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "1000"}


def _tables(seed: int = 0) -> list[pa.Table]:
    return linear_tables(FILES, ROWS_PER_FILE, D, seed)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_parts(root, _tables(), row_group_size=1000)
    return root


def _estimator() -> LinearRegressor:
    return LinearRegressor(optimizer="sgd", learning_rate="constant", eta0=0.1, penalty=None)


def _run(source: str, ckpt: Path, **kw: Any) -> tuple[LinearRegressor, Any]:
    est = _estimator()
    summary = DistributedTrainer(est, source, workers=2, sync_every_batches=5, batch_size=BATCH, checkpoint_dir=ckpt,
                                 learner_cpus=0.5, **kw).run()
    return est, summary


def _assert_same_model(est: LinearRegressor, ref: LinearRegressor) -> None:
    got, want = est.trainer_.get_weights(), ref.trainer_.get_weights()
    assert set(got) == set(want)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-7, err_msg=name)


def _assert_every_row_once(ckpt: Path, rows: int = ROWS) -> None:
    """The newest global checkpoint counts ``rows`` rows, and so does every merged running statistic (the feature
    scaler's count: a row trained twice or lost changes it)."""
    latest = CheckpointStore(ckpt).load_latest()
    assert latest.meta["rows"] == rows
    counts = {k: int(v) for k, v in latest.arrays.items() if k.endswith("/count") and not k.startswith("learners/")}
    assert counts and set(counts.values()) == {rows}, counts


def _node_of(actor: Any) -> str:
    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))


def test_a_node_killed_mid_run_its_learner_restarts_on_the_other_node_exactly_once(parquet_dir, tmp_path) -> None:
    """Node 1 (a raylet, its object store and the learner it hosts) SIGKILLed while the learners train round 4:
    Ray declares the node dead, restarts the learner on the head (the only node with room), the coordinator
    restarts the group from round 3's global checkpoint; the run ends with every row once and the model of a
    run without the fault."""
    source = f"parquet:{parquet_dir}"
    with driven_cluster(nodes=2, env=FAST_NODE_DEATH) as cluster:
        head = ray.get_runtime_context().get_node_id()
        ref, ref_summary = _run(source, tmp_path / "ref")
        assert ref_summary.rows == ROWS and ref_summary.restarts == 0
        placed: dict[str, Any] = {}

        def kill_node(trainer: DistributedTrainer, stats: Any) -> None:
            if stats.round == 3 and "before" not in placed:
                placed["before"] = [_node_of(a) for a in trainer.learners]
                cluster.kill_node(1)
                placed["killed_at"] = time.monotonic()
            elif "before" in placed and "after" not in placed:
                placed["after"] = [_node_of(a) for a in trainer.learners]
                placed["recovered_in"] = time.monotonic() - placed["killed_at"]

        est, summary = _run(source, tmp_path / "kill", on_round=kill_node)
    assert len(set(placed["before"])) == 2 and head in placed["before"]  # SPREAD: one learner per node
    lost = 1 - placed["before"].index(head)  # the learner node 1 hosted
    assert placed["after"] == [head, head]  # the lost node's learner restarted on the surviving node
    assert summary.restarts == 1 and [(f.learner, f.kind) for f in summary.faults] == [(lost, "died")]
    assert summary.rows == ROWS and summary.learner_rows == [ROWS // 2] * 2
    _assert_every_row_once(tmp_path / "kill")
    _assert_same_model(est, ref)
    assert placed["recovered_in"] < 60, placed


def test_a_hung_learner_is_detected_within_learner_timeout_and_replaced_once(parquet_dir, tmp_path) -> None:
    """Learner 1's worker process SIGSTOPped while it trains round 4: Ray sees a live process, its calls never
    return.  The coordinator's ping goes unanswered for learner_timeout (5 s): declared hung, killed (Ray restarts
    it), the group restarted from round 3's checkpoint, once; every row once, the model of a run without it."""
    source = f"parquet:{parquet_dir}"
    timeout = 5.0
    stopped: dict[str, Any] = {}
    with driven_cluster(nodes=1) as _:
        ref, _ref_summary = _run(source, tmp_path / "ref")

        def stop_learner(trainer: DistributedTrainer, stats: Any) -> None:
            if stats.round == 3 and "pid" not in stopped:
                stopped["pid"] = pid = trainer.learner_pids()[1]
                os.kill(pid, signal.SIGSTOP)
                stopped["at"] = time.monotonic()
            elif "pid" in stopped and "next_round_in" not in stopped:
                stopped["next_round_in"] = time.monotonic() - stopped["at"]
                stopped["pids"] = trainer.learner_pids()

        try:
            est, summary = _run(source, tmp_path / "hung", on_round=stop_learner, learner_timeout=timeout)
        finally:
            if "pid" in stopped:  # never leave a process stopped (it is gone when the coordinator killed it)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(stopped["pid"], signal.SIGCONT)
    assert summary.restarts == 1
    [fault] = summary.faults
    assert (fault.learner, fault.kind, fault.round) == (1, "hung", 4)
    assert timeout <= fault.seconds <= timeout + 1.0, fault  # pinged every timeout / 4 s, polled every 0.1 s
    assert stopped["next_round_in"] < timeout + 15, stopped  # detected, killed, restarted, a round trained
    assert stopped["pid"] not in stopped["pids"] and not Path(f"/proc/{stopped['pid']}").exists()
    assert summary.rows == ROWS and summary.learner_rows == [ROWS // 2] * 2
    _assert_every_row_once(tmp_path / "hung")
    _assert_same_model(est, ref)


def _cli(args: list[str], cluster: LocalRayCluster, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "streamfit.cli", *args],
                            env={**os.environ, "HOME": str(cluster.home), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _committed(kafka_broker: Any, topic: str, group: str, partitions: int = 2) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                       timeout=10)]
    finally:
        consumer.close()


def _fill_topic(kafka_broker: Any) -> tuple[str, list[int]]:
    topic = kafka_broker.create_topic(partitions=2)
    counts = []
    for p in range(2):
        batches = [b for t in _tables()[2 * p:2 * p + 2] for b in t.to_batches(max_chunksize=250)]
        kafka_broker.produce_batches(topic, batches, partition=p)
        counts.append(len(batches))
    return topic, counts


def _wait_for(what: str, ready: Any, proc: subprocess.Popen[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {what}: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def _health_rows(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["rows"])
    except (OSError, ValueError, KeyError):
        return -1


@pytest.mark.kafka
def test_coordinator_killed_between_the_files_of_a_global_checkpoint_resumes_exactly_once(kafka_broker,
                                                                                          tmp_path) -> None:
    """`streamfit serve --workers 2` on a 2-partition topic, SIGKILLed once the global checkpoint of round 6 has
    written model.onnx but not state.npz nor its manifest (the checkpoint store's pause point, armed by the
    coordinator's test hook).  That checkpoint never counts (a .tmp- directory, not committed); the offsets
    committed are those of the last durable one.  `serve --workers 2 --resume` continues from it: every row once
    (the scaler's count), offsets committed at the ends, the model of an uninterrupted run's."""
    from streamfit.checkpoint._fs import PAUSE_ENV
    from streamfit.daemon.config import load_config
    from streamfit.distributed._cli import _trainer
    from streamfit.distributed._coordinator import PAUSE_ROUND_ENV

    topic, counts = _fill_topic(kafka_broker)
    config = "&".join(f"{k}={v}" for k, v in kafka_broker.consumer_config.items())
    ckpt, health, marker = tmp_path / "ckpt", tmp_path / "health.json", tmp_path / "paused"

    def flags(group: str) -> dict[str, Any]:
        return {"source": f"kafka://{kafka_broker.bootstrap}/{topic}?group={group}&{config}",
                "estimator": "LinearRegressor", "optimizer": "sgd", "learning_rate": "constant", "eta0": 0.1,
                "penalty": "none", "workers": 2, "sync_every_batches": 4, "batch_size": BATCH}

    def args(group: str) -> list[str]:
        out = []
        for k, v in flags(group).items():
            out += [f"--{k.replace('_', '-')}", str(v)]
        return out + ["--checkpoint-dir", str(ckpt), "--health-file", str(health)]

    with driven_cluster(nodes=1, cpus=2) as cluster:
        ray_address = ["--ray-address", cluster.address]
        proc = _cli(["serve", *args("g"), *ray_address], cluster,
                    {PAUSE_ROUND_ENV: f"6:model_written:{marker}", PAUSE_ENV: ""})
        try:
            _wait_for("the pause inside a checkpoint write", marker.exists, proc)
            os.kill(proc.pid, signal.SIGKILL)  # the process this test started
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        partial = [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]
        assert len(partial) == 1 and {f.name for f in partial[0].iterdir()} == {"model.onnx"}, partial
        durable = CheckpointStore(ckpt).load_latest()
        assert durable is not None and durable.meta["distributed"]["round"] < 7
        assert sum(_committed(kafka_broker, topic, "g")) < sum(counts)  # the rest not committed: read again

        health.unlink()
        proc = _cli(["serve", *args("g"), *ray_address, "--resume"], cluster)
        try:
            _wait_for("every row trained", lambda: _health_rows(health) >= ROWS, proc)
            proc.send_signal(signal.SIGTERM)  # the whole topic is trained; serve would wait for more
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        ref = _trainer(load_config(None, flags("ref")), serve=False)  # what the CLI builds, uninterrupted
        ref.run()
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]  # the next save removed it
    _assert_every_row_once(ckpt)
    assert _committed(kafka_broker, topic, "g") == counts
    weights = {k.removeprefix("trainer/weights/"): v for k, v in CheckpointStore(ckpt).load_latest().arrays.items()
               if k.startswith("trainer/weights/")}
    want = ref.estimator.trainer_.get_weights()
    assert weights and set(weights) == set(want)
    for name, w in want.items():
        np.testing.assert_allclose(weights[name], w, rtol=1e-6, atol=1e-7, err_msg=name)
