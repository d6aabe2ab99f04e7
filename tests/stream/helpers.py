"""Test doubles for the loop: a list-backed source with instrumentation, reference training."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import anyio
import numpy as np
import pyarrow as pa

from streamfit.exceptions import BadInputError, SourceError
from streamfit.sources._base import Source, SourceBatch

UNDECODABLE = object()  #: list item: a message that cannot be decoded
FAIL = object()  #: list item: the source raises SourceError
BLOCK = object()  #: list item: the source waits forever (a live stream with no new data)


class ListSource(Source):
    """Yields record batches from a list; position ``{"batch": i, "row": r}``; counts reads and closes."""

    def __init__(self, items: Sequence[Any], *, on_read: Callable[["ListSource"], None] | None = None,
                 total_rows: int | None = None) -> None:
        self.items = list(items)
        self.on_read = on_read
        self.total_rows = total_rows
        self.reads = 0
        self.rows_read = 0
        self.close_calls = 0
        self._i = 0

    async def __anext__(self) -> SourceBatch:
        if self._closed:
            raise RuntimeError("ListSource is closed")
        self._opened = True
        await anyio.lowlevel.checkpoint()
        if self._i >= len(self.items):
            raise StopAsyncIteration
        index, item = self._i, self.items[self._i]
        self._i += 1
        if item is BLOCK:
            await anyio.sleep_forever()
        if item is FAIL:
            raise SourceError(f"connection lost before batch {index}")
        self.reads += 1
        if item is UNDECODABLE:
            sb = SourceBatch(None, lambda r, i=index: {"batch": i + 1, "row": 0},
                             error=BadInputError("not an Arrow IPC stream", reason="undecodable"),
                             where=f"batch {index}")
        else:
            self.rows_read += item.num_rows
            sb = SourceBatch(item, lambda r, i=index: {"batch": i, "row": r}, where=f"batch {index}")
        if self.on_read is not None:
            self.on_read(self)
        return sb

    async def aclose(self) -> None:
        self.close_calls += 1
        await super().aclose()


def make_batches(sizes: Sequence[int], d: int = 3, *, seed: int = 0, weight: bool = False,
                 classes: int | None = None) -> list[pa.RecordBatch]:
    """Record batches with float32 columns x0..x{d-1}, label y (float32 or int64), optional weight w."""
    rng = np.random.default_rng(seed)
    coef = np.linspace(-1.0, 2.0, d)
    out = []
    for n in sizes:
        X = rng.normal(size=(n, d)).astype(np.float32)
        cols: dict[str, Any] = {f"x{j}": X[:, j] for j in range(d)}
        if classes is None:
            cols["y"] = (X @ coef + 0.5 + 0.1 * rng.normal(size=n)).astype(np.float32)
        else:
            cols["y"] = np.clip(np.floor((X @ coef) + classes / 2), 0, classes - 1).astype(np.int64)
        if weight:
            cols["w"] = rng.uniform(0.5, 2.0, size=n).astype(np.float32)
        out.append(pa.record_batch(cols))
    return out


def to_vector(batch: pa.RecordBatch, d: int, *, tensor: bool = False) -> pa.RecordBatch:
    """Replace x0..x{d-1} by one FixedSizeList<float32, d> column 'emb' (or a fixed_shape_tensor)."""
    X = np.column_stack([batch.column(f"x{j}").to_numpy() for j in range(d)]).astype(np.float32)
    arr = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), d)
    if tensor:
        arr = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [d]), arr)
    cols = {"emb": arr, "y": batch.column("y")}
    if "w" in batch.schema.names:
        cols["w"] = batch.column("w")
    return pa.record_batch(cols)


def reference_chunks(batches: Sequence[pa.RecordBatch], features: Sequence[str], batch_size: int, *,
                     label: str = "y", weight: str | None = None, dtype: Any = np.float32,
                     label_dtype: Any = None, keep: np.ndarray | None = None):
    """The training batches the loop should produce, computed independently with numpy."""
    table = pa.Table.from_batches(batches)
    parts = []
    for name in features:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type) or isinstance(col.type, pa.BaseExtensionType):
            parts.append(np.asarray(col.to_pylist(), dtype=np.float64))
        else:
            parts.append(col.to_numpy(zero_copy_only=False).astype(np.float64)[:, None])
    X = np.hstack(parts).astype(dtype)
    y = table.column(label).to_numpy().astype(label_dtype or dtype)
    w = None if weight is None else table.column(weight).to_numpy().astype(dtype)
    if keep is not None:
        X, y = X[keep], y[keep]
        w = None if w is None else w[keep]
    return [(X[i:i + batch_size], y[i:i + batch_size], None if w is None else w[i:i + batch_size])
            for i in range(0, len(y), batch_size)]


def fit_reference(estimator: Any, chunks, classes: Any = None) -> Any:
    for k, (X, y, w) in enumerate(chunks):
        kwargs: dict[str, Any] = {}
        if w is not None:
            kwargs["sample_weight"] = w
        if k == 0 and classes is not None:
            kwargs["classes"] = classes
        estimator.partial_fit(X, y, **kwargs)
    return estimator


def expected_position(sizes: Sequence[int], consumed: int) -> dict[str, int]:
    """Position after ``consumed`` rows: the record batch holding the last row, rows consumed in it."""
    start = 0
    for i, n in enumerate(sizes):
        if start < consumed <= start + n:
            return {"batch": i, "row": consumed - start}
        start += n
    raise ValueError(consumed)
