"""The graph builder that losses, optimizers and penalties emit their ONNX nodes with: the extension API.

streamfit runs no loss or optimizer code in Python while it trains.  It asks each of them once, while it
builds the training graph, for a few ONNX nodes, and puts those nodes into the graph it runs: the one fused
graph (forward, loss, backward and update in one session run), or the separate loss and update graphs of
``step="forward_backward"``.  The same emitter serves both, so both strategies compute the same thing.  A
custom one subclasses :class:`streamfit.losses.Loss`, :class:`streamfit.optim.Optimizer` or
:class:`streamfit.Penalty` (their docstrings say what each emits and what state it has) and writes the rule
twice: as nodes through a :class:`GraphBuilder`, and in numpy (the reference to test it against).

A pinball (quantile) loss and sign-SGD, then one real step:

>>> import numpy as np
>>> from streamfit import Trainer
>>> from streamfit.graph import GraphBuilder
>>> from streamfit.losses import Loss
>>> from streamfit.optim import Optimizer
>>> from streamfit.testing import linear_model
>>> class Pinball(Loss):
...     '''Quantile loss: ``tau * r`` for ``r = t - y > 0``, ``(tau - 1) * r`` otherwise.'''
...     name = "pinball"
...     def __init__(self, tau: float = 0.5) -> None:
...         self.tau = tau                  # stored under its name: get_params() == {"tau": ...}
...     def terms(self, b: GraphBuilder, y: str, t: str) -> tuple[str, str]:
...         r = b.op("Sub", t, y)
...         loss = b.op("Max", b.op("Mul", r, b.const(self.tau)), b.op("Mul", r, b.const(self.tau - 1)))
...         return loss, b.op("Where", b.op("Greater", r, b.const(0.0)), b.const(-self.tau), b.const(1 - self.tau))
...     def numpy_terms(self, y, t):
...         r = t - y
...         return np.maximum(self.tau * r, (self.tau - 1) * r), np.where(r > 0, -self.tau, 1 - self.tau)
>>> class SignSGD(Optimizer):
...     '''``w <- w - lr * sign(g)``, no state.'''
...     name = "sign_sgd"
...     def update(self, b, w, g, state, s):
...         return b.op("Sub", w, b.op("Mul", b.op("Sign", g), s["lr"])), {}
...     def numpy_update(self, w, g, state, s):
...         return w - s["lr"] * np.sign(g), {}
>>> Pinball(tau=0.9) == Pinball(tau=0.9), Pinball(tau=0.9)  # equality and repr from get_params()
(True, Pinball(tau=0.9))
>>> trainer = Trainer(linear_model(2), loss=Pinball(tau=0.9), optimizer=SignSGD(), learning_rate=0.5)
>>> X, y = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), np.array([1.0, -1.0], np.float32)
>>> trainer.step(X, y)  # zero weights: (0.9 * 1 + 0.1 * 1) / 2
0.5
>>> trainer.get_weights()["W"].ravel(), trainer.get_weights()["B"]  # dL/dW = (-0.45, 0.05), dL/dB = -0.4
(array([ 0.5, -0.5], dtype=float32), array([0.5], dtype=float32))
"""

from __future__ import annotations

from streamfit._engine.common.graph_builder import GraphBuilder, onnx_dtype
from streamfit._public import reexport

__all__ = ["GraphBuilder", "onnx_dtype"]

reexport(__name__, globals(), __all__)
