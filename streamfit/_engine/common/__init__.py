"""Shared by every room of the engine: graph names, onnxruntime's private API, ONNX helpers, the node builder."""
