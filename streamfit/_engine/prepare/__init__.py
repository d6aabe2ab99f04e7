"""Model preparation: load an ONNX model, make it loadable and trainable, choose what to train."""
