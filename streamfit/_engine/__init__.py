"""The training engine: model preparation, ONNX graph building, device buffers and the step strategies."""
