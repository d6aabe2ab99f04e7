"""Helpers to test streaming pipelines against real components on 127.0.0.1 (a local Kafka broker), and a
seeded synthetic click stream (:class:`ClickStream`)."""

from streamfit.testing.clicks import ClickStream
from streamfit.testing.kafka import LocalKafkaBroker, BrokerUnavailable, ipc_bytes, tansu_binary

__all__ = ["ClickStream", "LocalKafkaBroker", "BrokerUnavailable", "ipc_bytes", "tansu_binary"]
