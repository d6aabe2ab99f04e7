"""Devices and buffers: where weights live, how batches get there, and session options.

On CPU an OrtValue made from a numpy array shares its memory, so the engine writes batches and scalars
into numpy arrays that stay bound.  On CUDA, weights and optimizer state are device OrtValues and
batches are staged in pinned host memory; ORT copies bound host inputs to the device during the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
from streamfit._engine.common import ort_private as C

__all__ = ["Device", "parse_device", "session_options"]


@dataclass(frozen=True)
class Device:
    """``kind`` is "cpu" or "cuda"; ``index`` the CUDA device index (kept from "cuda:N")."""

    kind: str
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @property
    def providers(self) -> list[Any]:
        if self.kind == "cpu":
            return ["CPUExecutionProvider"]
        return [("CUDAExecutionProvider", {"device_id": str(self.index)}), "CPUExecutionProvider"]

    def ort_device(self) -> C.OrtDevice:
        return C.device_of(self.kind, self.index)

    def resident(self, array: np.ndarray) -> C.OrtValue:
        """A device-resident OrtValue holding ``array`` (shares the numpy memory on CPU, copies on CUDA).

        On CPU the caller must keep ``array`` alive as long as the OrtValue is bound.
        """
        return C.from_numpy(np.asarray(array, order="C"), self.ort_device())  # not ascontiguousarray: () stays ()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> tuple[C.OrtValue, np.ndarray | None]:
        """A new device buffer; on CPU also the numpy array that backs it."""
        if self.kind == "cpu":
            arr = np.empty(shape, dtype)
            return C.from_numpy(arr, self.ort_device()), arr
        return C.from_shape_and_type(shape, dtype, self.ort_device()), None

    def staging(self, shape: tuple[int, ...], dtype: Any) -> tuple[C.OrtValue, np.ndarray]:
        """A reusable host buffer that batches are copied into, and the OrtValue bound to it.

        CPU: plain memory (the session reads it directly).  CUDA: pinned host memory when this
        onnxruntime build exposes it (faster, asynchronous host-to-device copies), else plain memory.
        """
        arr = np.zeros(shape, dtype)
        if self.kind == "cuda":
            pinned = C.pinned_device(self.index)
            try:
                value = C.from_shape_and_type(shape, dtype, pinned)
                view = value.numpy()
            except Exception:  # no pinned allocator in this build: plain memory below
                value = None
            if value is not None:
                # numpy() must be a view of the pinned memory for writes to reach it; else use plain memory
                if view.size == 0 or view.ctypes.data == value.data_ptr():
                    view[...] = 0
                    return value, view
        return C.from_numpy(arr, C.cpu_device()), arr

    def to_numpy(self, value: C.OrtValue) -> np.ndarray:
        """Host copy of a device value (a fresh array on CUDA; a copy on CPU too, so it is a snapshot)."""
        return np.array(value.numpy(), copy=True)


_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(device: "str | Device", check: bool = True) -> Device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` -> :class:`Device`, keeping the index.

    ``check`` also verifies that this onnxruntime build can run on it.

    >>> parse_device("cuda:1", check=False)
    Device(kind='cuda', index=1)
    """
    if isinstance(device, Device):
        return device
    match = _DEVICE_RE.match(str(device).strip().lower())
    if not match or (match.group(1) == "cpu" and match.group(2)):
        raise ValueError(f"unknown device {device!r}; expected 'cpu', 'cuda' or 'cuda:N'")
    kind, index = match.group(1), int(match.group(2) or 0)
    if check and kind == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise ValueError(f"device {device!r} asked for, but this onnxruntime build has no CUDA provider "
                         f"(available: {ort.get_available_providers()}); install onnxruntime-training "
                         "(the CUDA build) instead of onnxruntime-training-cpu")
    return Device(kind, index)


#: rows x trained weights from which a run is worth the intra-op thread pool (below it, the light one-thread
#: options): measured here, 2 threads lost 30 % on an MLP 100-256-256-1 at 64 rows (5.9M) and gained 36 % at
#: 128 rows (11.8M); a linear model (101 weights) gains nothing below ~10M
PARALLEL_MIN_WORK = 1 << 23


def session_options(threads: int | None = None, spinning: bool = True) -> ort.SessionOptions:
    """Options shared by every session the engine creates.

    Denormals are flushed to zero (Adam's moments decay into denormals and slowed a step 5x), and
    graph-transformer INFO chatter is silenced.
    """
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        opts.intra_op_num_threads = int(threads)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    opts.add_session_config_entry("session.set_denormal_as_zero", "1")
    return opts


# Graph transformers that create contrib ops with float-only CPU kernels (they break float64 models).
_FLOAT_ONLY_FUSIONS = ["MatmulTransposeFusion", "MatMulScaleFusion", "TransposeMatMulFusion"]


def make_session(model: bytes, options: ort.SessionOptions, device: Device, dtype: Any) -> ort.InferenceSession:
    """An InferenceSession on ``device``; float64 graphs skip fusions into float-only contrib kernels."""
    disabled = _FLOAT_ONLY_FUSIONS if np.dtype(dtype) == np.float64 else []
    return ort.InferenceSession(model, options, providers=device.providers, disabled_optimizers=disabled)
