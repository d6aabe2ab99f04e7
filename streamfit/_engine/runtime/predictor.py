"""Inference with the live weights: the forward graph run through IOBindings bound once per batch signature.

A small batch is copied into staging buffers (one per model input, of its declared dtype) that two
bindings -- one per ping-pong weight set -- read, and the output lands in a bound buffer: a call costs a
copy in, one session run and a copy out.  A large batch binds the caller's arrays (a copy would cost more
than binding).  Weights are never copied: the bindings read the device buffers the step writes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np
import onnxruntime as ort

from streamfit._engine.common import ort_private as C
from streamfit._engine.prepare.model import PreparedModel
from streamfit._engine.runtime.buffers import PingPong
from streamfit._engine.runtime.device import PARALLEL_MIN_WORK, Device

__all__ = ["Predictor"]


class _Bound:
    """Staging buffers of one signature and the two bindings (weight set 0 / set 1) that read them."""

    __slots__ = ("xs", "values", "y", "y_value", "io")

    def __init__(self, xs: tuple[np.ndarray, ...], values: tuple[Any, ...], y: np.ndarray, y_value: Any,
                 io: tuple[Any, Any]) -> None:
        self.xs, self.values, self.y, self.y_value, self.io = xs, values, y, y_value, io


class Predictor:
    """Runs the forward graph of ``pm`` on the live values of ``params``."""

    #: batches of at most this many rows go through bound staging buffers
    staged_rows = 64
    cache_size = 8
    #: with ``heavy``, a batch of at least this many rows x weights runs on the heavy session (its thread pool)
    parallel_min_work = PARALLEL_MIN_WORK

    def __init__(self, session: ort.InferenceSession, pm: PreparedModel, params: PingPong, device: Device,
                 fixed: Mapping[str, Any] | None = None,
                 heavy: Callable[[], ort.InferenceSession] | None = None, weights_size: int = 0) -> None:
        self.session = session
        #: makes the session large predictions run on (made on the first one), or None: ``session`` for all
        self._make_heavy = heavy
        self._heavy: ort.InferenceSession | None = None
        #: the work of a row (rows x this decide the session, with ``heavy``): the trained dense weights' size (a
        #: row-sparse table's rows are gathered, not computed through)
        self._weights_size = weights_size
        self._run = C.raw_session(session).run_with_iobinding  # the C session: one call per prediction
        #: inputs bound to the same OrtValue in every run (the row-sparse tables, updated in place)
        self.fixed = dict(fixed or {})
        self.pm = pm
        self.params = params
        self.device = device
        self._weights = [n for n in params.names if n in pm.initial or n in pm.buffers]  # + BN statistics
        self._cache: OrderedDict[tuple[Any, ...], _Bound] = OrderedDict()

    def run(self, arrays: tuple[np.ndarray, ...], key: tuple[Any, ...] | None = None, copy: bool = True
            ) -> np.ndarray:
        """The output for checked ``arrays`` (model order); ``key`` their signature (shapes and kinds).

        ``copy=False`` may return the bound output buffer itself, valid until the next call (for callers
        that reduce it at once)."""
        bound = self._cache.get(key) if key is not None else None
        if bound is None:
            rows = next((a.shape[0] for a in arrays if a.ndim), 1)
            if key is None or rows > self.staged_rows:
                return self._run_unbound(arrays)
            bound = self._bind(arrays, key)
        if len(arrays) == 1:
            bound.xs[0][...] = arrays[0]
        else:
            for buf, a in zip(bound.xs, arrays):
                buf[...] = a
        self._run(bound.io[self.params.current], None)
        return bound.y.copy() if copy else bound.y

    def _session_for(self, rows: int) -> ort.InferenceSession:
        if self._make_heavy is None or rows * self._weights_size < self.parallel_min_work:
            return self.session
        if self._heavy is None:
            self._heavy = self._make_heavy()
        return self._heavy

    def _run_unbound(self, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
        arrays = tuple(np.ascontiguousarray(a, dtype=spec.dtype) for spec, a in zip(self.pm.inputs, arrays))
        session = self._session_for(next((a.shape[0] for a in arrays if a.ndim), 1))
        io = C.io_binding(session)
        for spec, a in zip(self.pm.inputs, arrays):
            io.bind_ortvalue_input(spec.name, self.device.resident(a))
        live = self.params.live()
        for name in self._weights:
            io.bind_ortvalue_input(name, live[name])
        for name, value in self.fixed.items():
            io.bind_ortvalue_input(name, value)
        io.bind_output(self.pm.output_name, C.cpu_device())
        C.raw_session(session).run_with_iobinding(io, None)
        return io.get_outputs()[0].numpy()

    def _bind(self, arrays: tuple[np.ndarray, ...], key: tuple[Any, ...]) -> _Bound:
        shape = self._run_unbound(arrays).shape  # the output's shape for this signature
        pairs = [self.device.staging(a.shape, spec.dtype) for spec, a in zip(self.pm.inputs, arrays)]
        y_value, y = self.device.staging(shape, self.pm.dtype)
        ios = []
        for params in self.params.sets:
            io = C.io_binding(self.session)
            for spec, (value, _) in zip(self.pm.inputs, pairs):
                io.bind_ortvalue_input(spec.name, value)
            for name in self._weights:
                io.bind_ortvalue_input(name, params[name])
            for name, value in self.fixed.items():
                io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(self.pm.output_name, y_value)
            ios.append(io)
        bound = _Bound(tuple(p[1] for p in pairs), tuple(p[0] for p in pairs), y, y_value, (ios[0], ios[1]))
        self._cache[key] = bound
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return bound
