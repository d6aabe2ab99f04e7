"""Helpers to test streaming pipelines against real components on 127.0.0.1 (a local Kafka broker), a
seeded synthetic click stream (:class:`ClickStream`), and small ONNX models to train (:func:`mlp_model`,
:func:`linear_model`, ...: the examples in streamfit's documentation use them)."""

from streamfit._engine.testing import cnn_model, flags_model, linear_model, mlp_model, two_input_model
from streamfit._public import reexport
from streamfit.testing.clicks import ClickStream
from streamfit.testing.kafka import LocalKafkaBroker, BrokerUnavailable, ipc_bytes, tansu_binary

__all__ = ["linear_model", "mlp_model", "two_input_model", "cnn_model", "flags_model",
           "ClickStream", "LocalKafkaBroker", "BrokerUnavailable", "ipc_bytes", "tansu_binary"]

reexport(__name__, globals(), __all__)
