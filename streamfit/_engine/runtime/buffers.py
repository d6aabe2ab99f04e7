"""Device-resident weights and optimizer state in two ping-pong sets, and host scalars bound once.

A run reads set A and writes set B; the engine swaps only when the step was finite.  So an input is
never aliased with an output (ORT may schedule an update before a backward op that still reads the
old weight), and a rejected step costs nothing to roll back: set A is untouched.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
from streamfit._engine.common import ort_private as C

from streamfit._engine.runtime.device import Device

__all__ = ["PingPong", "HostScalars"]


class PingPong:
    """Two sets of named device buffers; ``current`` is the set holding the live values."""

    def __init__(self, device: Device, values: Mapping[str, np.ndarray]) -> None:
        self.device = device
        self.names = list(values)
        self._keep: list[np.ndarray] = []  # CPU: numpy arrays backing the OrtValues must outlive them
        self.sets: list[dict[str, C.OrtValue]] = [{}, {}]
        for name, array in values.items():
            array = np.array(array, order="C", copy=True)  # keeps a scalar's shape () (ascontiguousarray: (1,))
            self._keep.append(array)
            self.sets[0][name] = device.resident(array)
            value, backing = device.empty(array.shape, array.dtype)
            if backing is not None:
                backing[...] = array
                self._keep.append(backing)
            self.sets[1][name] = value
        self.current = 0
        self.generation = 0  # counts write()s: what a cached fact about the live values refers to
        #: per set, one column [size, 1] per group of values laid end to end (:meth:`columns`)
        self.column_sets: list[dict[str, C.OrtValue]] = [{}, {}]

    def columns(self, groups: Mapping[str, Sequence[str]]) -> None:
        """Lay each group's values end to end in one column per set (CPU): the values become views of it, so a
        graph that carries the group as one vector binds the column where others bind the values, with no copy.
        Call before anything binds the values (their OrtValues are replaced)."""
        if self.device.kind != "cpu":
            raise ValueError("columns of values are host memory: CPU only")
        cpu = self.device.ort_device()
        for group, members in groups.items():
            sizes = [int(np.prod(self.sets[0][m].shape(), dtype=np.int64)) for m in members]
            dtype = self.sets[0][members[0]].numpy().dtype
            for values, columns in zip(self.sets, self.column_sets):
                column = np.empty((sum(sizes), 1), dtype)
                self._keep.append(column)
                start = 0
                for member, size in zip(members, sizes):
                    old = values[member].numpy()
                    view = column[start:start + size].reshape(old.shape)
                    view[...] = old
                    values[member] = C.from_numpy(view, cpu)
                    start += size
                columns[group] = C.from_numpy(column, cpu)

    def live_columns(self) -> dict[str, C.OrtValue]:
        return self.column_sets[self.current]

    def spare_columns(self) -> dict[str, C.OrtValue]:
        return self.column_sets[1 - self.current]

    def live(self) -> dict[str, C.OrtValue]:
        return self.sets[self.current]

    def spare(self) -> dict[str, C.OrtValue]:
        return self.sets[1 - self.current]

    def swap(self) -> None:
        self.current = 1 - self.current

    def read(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Host copies (snapshots) of the live values."""
        live = self.live()
        return {n: self.device.to_numpy(live[n]) for n in (self.names if names is None else names)}

    def write(self, values: Mapping[str, np.ndarray]) -> None:
        """Overwrite live values in place (shapes and dtypes must match)."""
        live = self.live()
        self.generation += 1
        for name, array in values.items():
            if name not in live:
                raise KeyError(f"unknown buffer {name!r}; known: {self.names}")
            target = live[name]
            array = np.asarray(array)
            if tuple(target.shape()) != array.shape:
                raise ValueError(f"{name!r}: shape {array.shape} does not match {tuple(target.shape())}")
            if self.device.kind == "cpu":
                np.copyto(target.numpy(), array, casting="same_kind")
            else:
                target.update_inplace(np.asarray(array, dtype=target.numpy().dtype, order="C"))


class HostScalars:
    """Host arrays bound once as inputs: writing ``arrays[name][...]`` changes what the next run reads.

    0-d arrays of ``dtype`` for ``names`` (the optimizer's scalars), views of one contiguous :attr:`block` so
    that a step's scalars are written in one assignment (``block[:] = row``), and copies of ``tensors`` (a
    model's host tensors, see :attr:`~streamfit._engine.prepare.model.PreparedModel.host`)."""

    def __init__(self, names: Iterable[str], dtype: np.dtype, tensors: Mapping[str, np.ndarray] | None = None) -> None:
        self.block = np.zeros(0, dtype)
        #: the names whose arrays are views of :attr:`block`, in its order
        self.block_names: list[str] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.values: dict[str, C.OrtValue] = {}
        self.add_to_block({n: np.zeros((), dtype) for n in names})
        self.add(tensors or {})

    def add(self, arrays: Mapping[str, np.ndarray]) -> None:
        """More host arrays bound as inputs (copies), before anything binds these."""
        cpu = C.cpu_device()
        for name, array in arrays.items():
            self.arrays[name] = np.array(array, order="C")
            self.values[name] = C.from_numpy(self.arrays[name], cpu)

    def add_to_block(self, arrays: Mapping[str, np.ndarray]) -> None:
        """More one-value host arrays (of the block's dtype) bound as inputs, as views of a new :attr:`block`
        holding the old block's values then these: before anything binds these (the old views are replaced)."""
        if any(a.size != 1 for a in arrays.values()):
            raise ValueError("the block holds one-value arrays only")
        shapes = [self.arrays[n].shape for n in self.block_names] + [a.shape for a in arrays.values()]
        block = np.concatenate([self.block, np.array([a.item() for a in arrays.values()], self.block.dtype)])
        self.block, self.block_names = block, self.block_names + list(arrays)
        cpu = C.cpu_device()
        for i, (name, shape) in enumerate(zip(self.block_names, shapes)):
            self.arrays[name] = block[i:i + 1].reshape(shape)
            self.values[name] = C.from_numpy(self.arrays[name], cpu)
