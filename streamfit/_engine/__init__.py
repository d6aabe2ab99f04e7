"""The training engine, in rooms whose imports run one way (checked by ``tests/engine/test_rooms.py``).

* ``common``: what every room uses -- the graph names (``names``), onnxruntime's private API (``ort_private``,
  its only user), small ONNX helpers and the node builder the losses, penalties and optimizers emit through.
* ``prepare`` (may import ``common``): model preparation -- load, make loadable, rewrite into trainable ops,
  choose the weights; the inputs' signature.
* ``gradient`` (``common``, ``prepare``): the gradient graphs, from onnxruntime-training's builder or
  streamfit's own, their rewrites, and the portable form.
* ``runtime`` (``common``, ``prepare``): devices, device buffers, staging buffers, the predictor.
* ``steps`` (all of the above): the step graphs (gradient + loss + penalty + optimizer) and the strategies that
  run them (fused, forward/backward, row-sparse tables).
* the top (``trainer``, ``artifact``, ``compile``): the Trainer, and training artifacts; may import every room.
"""
