"""The click-model tutorial's Kafka example (docs/tutorials/kafka-clicks.md), run as written against a real broker
(addresses and sizes swapped in); the docs suite skips it there, naming this test."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "kafka-clicks.md"


def _click_example() -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S) if "kafka_messages(" in b]
    assert len(blocks) == 1, "the tutorial has one click-model example from Kafka"
    return blocks[0]


@pytest.mark.kafka
def test_readme_click_model_from_kafka(kafka_broker):
    code = _click_example()
    topic = kafka_broker.create_topic()
    config = "&".join(f"{k}={v}" for k, v in kafka_broker.consumer_config.items())
    for old, new in (("127.0.0.1:9092/clicks?group=ctr", f"{kafka_broker.bootstrap}/{topic}?group=ctr&{config}"),
                     ("127.0.0.1:9092", kafka_broker.bootstrap), ('"clicks"', repr(topic)),
                     ("200_000", "12_288"), ("2**20", "2**16")):
        assert old in code, old
        code = code.replace(old, new)
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    summary, ctr, stream = namespace["summary"], namespace["ctr"], namespace["stream"]
    assert summary.rows == 12_288
    assert summary.stream_metrics["log_loss"] < math.log(2)  # it learned while it read
    test = stream.batch(500, 2000)
    sess = ort.InferenceSession(namespace["onnx_model"].SerializeToString())
    names = [i.name for i in sess.get_inputs()]
    assert sorted(names) == sorted(stream.categorical + stream.dense)
    logit = sess.run(None, {c: test.column(c).to_numpy() for c in names})[0].ravel()
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), ctr.predict_proba(test)[:, 1], rtol=1e-4, atol=1e-6)
