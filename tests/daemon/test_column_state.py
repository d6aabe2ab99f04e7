"""The column plan is part of a run's state: fixed once, saved in checkpoints, enforced on resume."""

from __future__ import annotations

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit import OnnxRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.exceptions import CheckpointError
from tests.daemon.helpers import N_FEATURES, record_batches, write_model, write_stream

FEATURES = [f"x{j}" for j in range(N_FEATURES)]


def _estimator(model):
    return OnnxRegressor(str(model), optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None,
                         batch_size=64, on_nonfinite="skip", threads=1)


def _run(runner):
    return anyio.run(runner.run)


def _rewrite(path, change):
    pq.write_table(change(pq.read_table(path)), path, row_group_size=300)


def test_extra_column_in_the_first_file_is_bad_input_not_a_new_feature(tmp_path):
    data, total = write_stream(tmp_path)
    _rewrite(data / "part-000.parquet",
             lambda t: t.add_column(3, "extra", pa.array(np.ones(t.num_rows, np.float32))))
    model = write_model(tmp_path)
    summary = _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=8,
                          batch_size=64, on_bad="skip"))
    assert summary.rows == total - 1024 and summary.skipped_rows == {"feature_count": 1024}
    meta = CheckpointStore(tmp_path / "ck").load_latest().meta
    assert meta["columns"] == {"features": FEATURES, "widths": [1] * N_FEATURES, "label": "y", "weight": None,
                               "dtype": "float32", "task": "regression"}


def test_resume_reads_reordered_columns_by_the_saved_plan(tmp_path):
    data, total = write_stream(tmp_path)
    model = write_model(tmp_path)
    ref = _estimator(model)
    _run(Runner(ref, f"parquet:{data}", batch_size=64))
    first = _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=5,
                        batch_size=64, max_rows=1280))
    assert first.rows == 1280
    for i in (1, 2):  # the files after the checkpoint now hold their columns in another order
        _rewrite(data / f"part-{i:03d}.parquet", lambda t: t.select(["y"] + FEATURES[::-1]))
    again = _estimator(model)
    second = _run(Runner(again, f"parquet:{data}", checkpoint_dir=tmp_path / "ck", resume=True, batch_size=64))
    assert second.rows == total
    for name, w in ref.trainer_.get_weights().items():
        np.testing.assert_allclose(again.trainer_.get_weights()[name], w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_resume_refuses_a_configuration_that_contradicts_the_saved_plan(tmp_path):
    data, total = write_stream(tmp_path, files=1)
    model = write_model(tmp_path)
    _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", every_batches=4,
                batch_size=64, max_rows=512))
    with pytest.raises(CheckpointError, match=r"the checkpoint's column plan has features \['x0'"):
        _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", resume=True,
                    batch_size=64, features=FEATURES[::-1]))
    with pytest.raises(CheckpointError, match="label 'y' \\(configured: 'x5'\\)"):
        _run(Runner(_estimator(model), f"parquet:{data}", checkpoint_dir=tmp_path / "ck", resume=True,
                    batch_size=64, label="x5", features=FEATURES[:5]))


def _non_utf8(batch: pa.RecordBatch, name: str) -> bytes:
    from streamfit.testing import ipc_bytes

    data = bytearray(ipc_bytes(batch))
    i = data.find(len(name).to_bytes(4, "little") + name.encode() + b"\0")
    data[i + 4] = 0xFF
    return bytes(data)


@pytest.mark.kafka
def test_kafka_non_utf8_column_name_is_skipped_and_resume_does_not_crash_again(tmp_path, kafka_broker):
    from streamfit.testing import ipc_bytes

    batches = record_batches(files=1, rows=1024)  # 8 messages of 128 rows
    values = [ipc_bytes(b) for b in batches[:4]] + [_non_utf8(batches[4], "x2")] + \
        [ipc_bytes(b) for b in batches[5:]]
    topic = kafka_broker.create_topic(partitions=1)
    kafka_broker.produce(topic, values, partition=0)
    source = f"kafka://{kafka_broker.bootstrap}/{topic}?group=g-{topic}&session.timeout.ms=2000"
    model = write_model(tmp_path)
    first = _run(Runner(_estimator(model), source, checkpoint_dir=tmp_path / "ck", every_batches=2,
                        batch_size=64, on_bad="skip", max_rows=512))
    assert first.rows == 512  # stopped just before the bad message
    again = Runner(_estimator(model), source, checkpoint_dir=tmp_path / "ck", resume=True, batch_size=64,
                   on_bad="skip")

    async def until_all_good_rows_trained():
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            async def watch():
                with anyio.fail_after(60):
                    while again.rows < 1024 - 128:
                        await anyio.sleep(0.01)
                stop.set()
            tg.start_soon(watch)
            return await again.run(stop)

    second = anyio.run(until_all_good_rows_trained)
    assert second.rows == 1024 - 128 and second.skipped_rows == {"invalid_name": 128}
    assert second.position["partitions"] == {"0": {"offset": 8, "row": 0}}
