"""The forward/backward step (the seed's design): TrainingAgent forward, loss graph, backward, update graph.

Slower than the fused step (three sessions, per-step gradient binding) but usable piece by piece: a
caller may run :meth:`forward`, compute dL/dY however it likes, then :meth:`backward` and
:meth:`apply`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnxruntime as ort
from onnx import ModelProto

from streamfit._engine.common import ort_private as C
from streamfit._engine.common.names import Names
from streamfit._engine.gradient.graphs import GradientGraphs
from streamfit._engine.prepare.model import PreparedModel
from streamfit._engine.prepare.running_stats import running_stats_model
from streamfit._engine.runtime.buffers import HostScalars, PingPong
from streamfit._engine.runtime.device import Device, make_session
from streamfit._engine.runtime.staging import Staging, StagingCache
from streamfit._engine.steps.step_graphs import build_loss_model, build_update_model
from streamfit.exceptions import StreamfitError
from streamfit.losses.base import Loss
from streamfit.optim.base import Optimizer
from streamfit.penalties import Penalty

__all__ = ["ForwardBackwardStep"]


class ForwardBackwardStep:
    """TrainingAgent over ORT's gradient graph, plus a loss session and a ping-pong update session."""

    name = "forward_backward"

    def __init__(self, pm: PreparedModel, graphs: GradientGraphs, loss: Loss, optimizer: Optimizer,
                 penalty: Penalty | None, device: Device, options: ort.SessionOptions, y_rank: int,
                 params: PingPong, scalars: HostScalars) -> None:
        self.pm = pm
        self.device = device
        self.params = params
        self.scalars = scalars
        self.y_rank = y_rank
        self.session = make_session(graphs.gradient.SerializeToString(), options, device, pm.dtype)
        self.feed_names = [i.name for i in self.session.get_inputs()]
        expected = [i.name for i in pm.inputs] + list(pm.weights) + list(pm.host)
        if sorted(self.feed_names) != sorted(expected):
            raise StreamfitError(f"unexpected gradient-graph inputs {self.feed_names}, expected {expected}")
        dev = device.ort_device()
        n_fw = len(graphs.info.user_output_names) + len(graphs.info.frontier_node_arg_map)
        self.agent = C.training_agent(self.session, self.feed_names, [dev] * n_fw, graphs.grad_names,
                                      [dev] * len(graphs.grad_names))
        self._gradient_model = graphs.gradient
        self._loss_model = build_loss_model(loss, pm.dtype, y_rank)
        self._update_model = build_update_model(pm, optimizer, penalty)
        self.loss_session = make_session(self._loss_model.SerializeToString(), options, device, pm.dtype)
        self.update_session = make_session(self._update_model.SerializeToString(), options, device, pm.dtype)
        self.outputs = HostScalars([Names.loss, Names.check], pm.dtype)
        self._update_inputs = {i.name for i in self.update_session.get_inputs()}
        self._state: Any = None
        self._stats_session: Any = None
        if pm.running_stats:  # the TrainingAgent has no room for extra outputs: a forward of its own
            stats = running_stats_model(pm.with_host_inputs(pm.model), [i.name for i in pm.inputs], pm.weights,
                                        pm.running_stats, pm.dtype, Names)
            self._stats_session = make_session(stats.SerializeToString(), options, device, pm.dtype)
        self._updated = [n for n in params.names if n not in pm.buffers]
        self.lr_in_grad_weights = False  # dL/dY is the plain gradient; the update graph applies the lr
        self.cache = StagingCache(device, self._bindings, loss_factor=loss.loss_factor)

    def graphs(self) -> dict[str, ModelProto]:
        """The step graphs by role: ``gradient`` (forward and backward), ``loss`` and ``update``."""
        return {"gradient": self._gradient_model, "loss": self._loss_model, "update": self._update_model}

    def _bindings(self, staging: Staging) -> dict[str, Any]:
        io = C.io_binding(self.loss_session)
        io.bind_ortvalue_input(Names.target, staging.t_value)
        io.bind_ortvalue_input(Names.loss_weight, staging.lw_value)
        io.bind_ortvalue_input(Names.grad_weight, staging.gw_value)
        io.bind_ortvalue_output(Names.loss, self.outputs.values[Names.loss])
        io.bind_output(Names.dy, self.device.ort_device())
        return {"loss_io": io}

    # -- pieces -------------------------------------------------------------------------------------
    def forward(self, x_values: tuple[C.OrtValue, ...]) -> C.OrtValue:
        """Run the forward pass on the model inputs (model order), keeping what the backward needs; return Y."""
        live = dict(self.params.live())
        live.update(zip((i.name for i in self.pm.inputs), x_values))
        live.update((name, self.scalars.values[name]) for name in self.pm.host)
        feeds = C.value_vector([live[name] for name in self.feed_names])
        fetches = C.value_vector()
        self._state = C.partial_state()
        self.agent.run_forward(feeds, fetches, self._state, None)
        return fetches[0]

    def backward(self, dy_value: C.OrtValue) -> list[C.OrtValue]:
        """Gradients of the trained weights given dL/dY, in the order of ``pm.weights``."""
        if self._state is None:
            raise StreamfitError("backward() needs a forward() first")
        grads_in = C.value_vector([dy_value])
        grads = C.value_vector()
        self.agent.run_backward(grads_in, grads, self._state)
        self._state = None
        return [grads[i] for i in range(len(grads))]

    def apply(self, grads: Sequence[C.OrtValue]) -> bool:
        """Update weights and state from ``grads``; swap only if every new value is finite."""
        io = C.io_binding(self.update_session)
        src, dst = self.params.live(), self.params.spare()
        for w, g in zip(self.pm.weights, grads):
            io.bind_ortvalue_input(Names.grad(w), g)
        for name, value in self.scalars.values.items():
            if name in self._update_inputs:
                io.bind_ortvalue_input(name, value)
        for name in self._updated:
            io.bind_ortvalue_input(name, src[name])
            io.bind_ortvalue_output(Names.new(name), dst[name])
        io.bind_ortvalue_output(Names.check, self.outputs.values[Names.check])
        C.raw_session(self.update_session).run_with_iobinding(io, None)
        ok = bool(np.isfinite(self.outputs.arrays[Names.check]))
        if ok:
            self.params.swap()
        return ok

    # -- whole step ---------------------------------------------------------------------------------
    def update_running_stats(self, x_values: Sequence[C.OrtValue]) -> None:
        """New running statistics from this batch into the spare set (live once the step is applied)."""
        io = C.io_binding(self._stats_session)
        for spec, value in zip(self.pm.inputs, x_values):
            io.bind_ortvalue_input(spec.name, value)
        src, dst = self.params.live(), self.params.spare()
        for name in list(self.pm.weights) + list(self.pm.buffers):
            io.bind_ortvalue_input(name, src[name])
        for name in self.pm.host:
            io.bind_ortvalue_input(name, self.scalars.values[name])
        for name in self.pm.buffers:
            io.bind_ortvalue_output(Names.new(name), dst[name])
        C.raw_session(self._stats_session).run_with_iobinding(io, None)

    def run(self, staging: Staging) -> tuple[float, bool]:
        if self._stats_session is not None:
            self.update_running_stats(staging.x_values)
        y = self.forward(staging.x_values)
        np.copyto(staging.y, y.numpy())  # CUDA: a device-to-host copy, as the fused step's bound output
        io = staging.extra["loss_io"]
        io.bind_ortvalue_input(Names.y, y)
        C.raw_session(self.loss_session).run_with_iobinding(io, None)
        loss = float(self.outputs.arrays[Names.loss])
        if not np.isfinite(loss):
            self._state = None
            return loss, False
        dy = io.get_outputs()[1]  # bound second, after the loss
        grads = self.backward(dy)
        return loss, self.apply(grads)
