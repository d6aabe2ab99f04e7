"""KafkaSource with a commit ledger: its own commits are noted before they are sent, and a committed offset of
its own ahead of the position it resumes at does not win (the rows in between are read again, and the group's
offset is set back there).  Another member's commit (not in the ledger) winning: tests/daemon/."""

from __future__ import annotations

import json

import anyio
import pytest

from streamfit.daemon.commit_ledger import RunCommitLedger
from streamfit.sources import KafkaSource
from streamfit.testing.kafka import ipc_bytes
from tests.kafka_group import committed_offset

pytestmark = [pytest.mark.kafka, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

ROWS = 16  # per message


@pytest.mark.anyio
async def test_an_own_commit_ahead_of_the_resumed_position_is_read_again(tmp_path, kafka_broker, ids_table,
                                                                          collect_ids):
    topic = kafka_broker.create_topic(partitions=1)
    group = f"g-{topic}"
    kafka_broker.produce(topic, [ipc_bytes(ids_table(k * ROWS, (k + 1) * ROWS)) for k in range(8)], partition=0)

    def source(ledger: RunCommitLedger) -> KafkaSource:
        src = KafkaSource(kafka_broker.bootstrap, topic, group=group, config=kafka_broker.consumer_config,
                          until_eof=True)
        src.attach_commit_ledger(ledger)
        return src

    ledger = RunCommitLedger(tmp_path)
    first = source(ledger)
    with anyio.fail_after(30):
        assert await collect_ids(first) == list(range(8 * ROWS))
    ledger.step = 20  # the checkpoint (since lost) that covered every message
    await first.commit({"topic": topic, "partitions": {"0": {"offset": 8, "row": 0}}})
    await first.aclose()
    assert committed_offset(kafka_broker, topic, group) == 8
    saved = json.loads((tmp_path / "kafka-commits.json").read_text())["commits"]
    assert [(c["step"], c["group"], c["offsets"]) for c in saved] == [(20, group, {"0": 8})]

    ledger = RunCommitLedger(tmp_path)  # read back from disk, as a resumed run does
    ledger.since = ledger.step = 10  # resumed from the checkpoint of step 10: message 3, 5 rows into it
    again = source(ledger)
    again.seek({"topic": topic, "partitions": {"0": {"offset": 3, "row": 5}}})
    with anyio.fail_after(30):
        got = await collect_ids(again)
    await again.aclose()
    assert got == list(range(3 * ROWS + 5, 8 * ROWS)), f"{len(got)} rows read after the resumed position"
    assert committed_offset(kafka_broker, topic, group) == 3  # set back to the resumed checkpoint's offset
    assert RunCommitLedger(tmp_path).own_offsets(topic, group, 0) == {8, 3}

