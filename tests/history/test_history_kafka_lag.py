"""A Kafka run's history holds the lag per partition: messages behind the high watermark after the interval's
last trained batch (librdkafka's cached watermark), falling as the learner catches up."""

from __future__ import annotations

import anyio
import pytest

from streamfit import OnnxRegressor
from streamfit.daemon import Runner
from streamfit.history import HistoryOptions, read_history
from streamfit.sources import KafkaSource
from tests.daemon.helpers import record_batches, write_model

pytestmark = pytest.mark.kafka


def test_the_history_holds_the_lag_per_partition(tmp_path, kafka_broker):
    topic = kafka_broker.create_topic(partitions=2)
    batches = record_batches(files=2, rows=1024)  # 16 messages of 128 rows
    kafka_broker.produce_batches(topic, batches[:8], partition=0)
    kafka_broker.produce_batches(topic, batches[8:], partition=1)
    model = write_model(tmp_path)
    est = OnnxRegressor(str(model), optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None,
                        batch_size=128, threads=1)

    def source() -> KafkaSource:
        return KafkaSource(kafka_broker.bootstrap, topic, group=f"g-{topic}", config=kafka_broker.consumer_config,
                           until_eof=True)

    async def run(runner: Runner):  # type: ignore[no-untyped-def]
        with anyio.fail_after(60):
            return await runner.run()

    summary = anyio.run(run, Runner(est, source, checkpoint_dir=tmp_path / "ck", every_batches=4, batch_size=128,
                                    history=HistoryOptions(every_rows=256, every_seconds=None)))
    assert summary.rows == 16 * 128
    ivs = [i for i in read_history(tmp_path / "ck").intervals if i.rows_end > i.rows_start]
    lags = [i.lag for i in ivs if i.lag]
    assert lags, [i.lag for i in ivs]
    assert all(set(lag) <= {"0", "1"} and all(0 <= n <= 8 for n in lag.values()) for lag in lags)
    assert ivs[-1].lag and all(n == 0 for n in ivs[-1].lag.values())  # caught up with both partitions
    assert max(sum(lag.values()) for lag in lags) > 0, [(i.rows_end, i.lag) for i in ivs]  # behind at first
