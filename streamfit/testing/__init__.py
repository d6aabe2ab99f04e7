"""Helpers to test streaming pipelines against real components on 127.0.0.1 (a local Kafka broker)."""

from streamfit.testing.kafka import LocalKafkaBroker, BrokerUnavailable, ipc_bytes, tansu_binary

__all__ = ["LocalKafkaBroker", "BrokerUnavailable", "ipc_bytes", "tansu_binary"]
