"""A ready-made model's ``partial_fit`` pass over many rows as one chunk: statistics per step, steps in one run.

The one-step-per-call semantics, kept for a call of many rows: each step of ``batch_size`` rows standardizes its
rows with the running input statistics *after* its own rows (as a call of those rows alone would: statistics
first, then the step) and never with rows after it; a regressor's targets likewise, and each prediction is mapped
back to target units with the target statistics from before its step.  The statistics are the estimator's own
scalers, updated step by step on the host (the same float64 operations as one call per step, so the same bits);
their float32 values per step are scanned into the chunk's Scan (:func:`~streamfit._engine.steps.scan.train_chunk`
``host_steps``), which trains all the steps in one session run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfit._engine.common.names import Names
from streamfit._engine.steps.scan import ChunkResult, train_chunk
from streamfit.models.scaler import RunningScaler, update_steps_together
from streamfit.exceptions import NonFiniteError

__all__ = ["chunk_pass", "StepRows"]


@dataclass(frozen=True)
class StepRows:
    """The steps of a call of ``n`` rows at ``size`` rows a step (the last one shorter), by arithmetic: a chunk of
    many one-row steps builds no slice per step unless asked.

    >>> StepRows(7, 3).sizes.tolist(), StepRows(7, 3).slices()[-1]
    ([3, 3, 1], slice(6, 7, None))
    """

    n: int
    size: int

    @property
    def count(self) -> int:
        return -(-self.n // self.size)

    @property
    def sizes(self) -> np.ndarray:
        """Rows per step (int64)."""
        out = np.full(self.count, self.size, np.int64)
        if self.n % self.size:
            out[-1] = self.n % self.size
        return out

    def slices(self) -> list[slice]:
        return [slice(i, min(i + self.size, self.n)) for i in range(0, self.n, self.size)]


#: a scaler updated per step at once: its float64 (mean, scale) before the rows (or None) and after each step
Updated = tuple[Any, tuple[np.ndarray, np.ndarray]]


def _per_step(scaler: Any, rows: np.ndarray, sw: np.ndarray | None, steps: StepRows, transform: bool = False,
              before: bool = False, updated: Updated | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The scaler updated by each step's rows in turn: float32 (mean, scale) after each step, (``before``)
    float64 (mean, scale) before each step, and (``transform``) each step's rows standardized with the
    statistics after its own rows.  ``updated``: the scaler already updated at once (:func:`_updated_at_once`),
    else it is updated here step by step."""
    width = rows.shape[1]
    if updated is not None:  # the steps' sums added at once (cumulative sums)
        size = steps.size
        first, (mean64, scale64) = updated
        mean32, scale32 = mean64.astype(np.float32), scale64.astype(np.float32)
        b_mean = b_scale = None
        if first is not None:
            b_mean = np.concatenate([np.array([first[0]]), mean64[:-1]])
            b_scale = np.concatenate([np.array([first[1]]), scale64[:-1]])
        scaled = None
        if transform:  # each row with its step's statistics
            sizes = None if size == 1 else steps.sizes
            m32, s32 = (mean32, scale32) if sizes is None else (np.repeat(mean32, sizes, 0), np.repeat(scale32, sizes, 0))
            if rows.dtype == np.float32:
                scaled = (rows - m32) / s32
            else:
                dtype = rows.dtype if rows.dtype.kind == "f" else np.dtype(np.float32)
                m64, s64 = (mean64, scale64) if sizes is None else (np.repeat(mean64, sizes, 0),
                                                                    np.repeat(scale64, sizes, 0))
                scaled = ((rows.astype(dtype, copy=False) - m64.astype(dtype)) / s64.astype(dtype)
                          ).astype(np.float32, copy=False)
        return mean32, scale32, b_mean, b_scale, scaled
    count = steps.count
    mean32 = np.empty((count, width), np.float32)
    scale32 = np.empty((count, width), np.float32)
    before_mean = np.empty((count, width)) if before else None
    before_scale = np.empty((count, width)) if before else None
    scaled = np.empty(rows.shape, np.float32) if transform else None
    for k, sl in enumerate(steps.slices()):
        if before_mean is not None and before_scale is not None:
            before_mean[k], before_scale[k] = scaler.mean_, scaler.scale_
        scaler.update(rows[sl], None if sw is None else sw[sl])
        m, s = scaler.float32()
        mean32[k], scale32[k] = m, s
        if scaled is not None:
            scaled[sl] = scaler.transform(rows[sl])
    return mean32, scale32, before_mean, before_scale, scaled


def _updated_at_once(scalers: list[Any], rows: list[np.ndarray], before: list[bool], sw: np.ndarray | None,
                     steps: StepRows) -> list[Updated | None]:
    """Each of ``scalers`` that sums its steps at once (a RunningScaler, no sample weights) updated per step by
    its ``rows``, all in one pass (:func:`update_steps_together`: a regressor's input and target scalers side by
    side): its float64 statistics before the rows (where ``before``) and after each step; None for the others
    (absent, or updated step by step by :func:`_per_step`)."""
    fast = [i for i, s in enumerate(scalers) if sw is None and isinstance(s, RunningScaler)]
    out: list[Updated | None] = [None] * len(scalers)
    firsts = [scalers[i].float64() if before[i] else None for i in fast]
    stats = update_steps_together([scalers[i] for i in fast], [rows[i] for i in fast], steps.size) if fast else []
    for i, first, st in zip(fast, firsts, stats):
        out[i] = (first, st)
    return out


def chunk_pass(est: Any, X: Any, T: np.ndarray, sw: np.ndarray | None, outputs: np.ndarray | None) -> float:
    """``partial_fit``'s pass over ``X`` (checked, not yet standardized) and ``T`` (encoded labels or raw
    targets): updates the estimator's scalers per step, trains every step in one chunk, writes each row's
    output before its step into ``outputs`` (a regressor's in target units).  Returns the mean loss as
    ``_one_pass`` does (rows of finite steps)."""
    trainer = est.trainer_
    steps = StepRows(len(X), est.batch_size)
    scaler = est.__dict__.get("scaler_")
    target = est.__dict__.get("target_scaler_")
    saved = [(s, s.snapshot()) for s in (scaler, target) if s is not None]
    raw = {id(scaler): X, id(target): T.reshape(len(T), -1)}
    host = None
    T2 = T.reshape(len(T), -1)
    up_x, up_t = _updated_at_once([scaler, target], [X, T2], [False, True], sw, steps)
    if scaler is not None:
        in_graph = est._scaler_in_graph()
        mean, scale, _, _, scaled = _per_step(scaler, X, sw, steps, transform=not in_graph, updated=up_x)
        if in_graph:
            host = {Names.scaler_mean: mean, Names.scaler_scale: scale}
        else:  # a model saved before the scaling moved into the graph: rows standardized here, per step
            X = scaled
    before = None
    if target is not None:
        _, _, b_mean, b_scale, scaled_t = _per_step(target, T2, sw, steps, transform=True, before=True,
                                                    updated=up_t)
        assert scaled_t is not None and b_mean is not None and b_scale is not None
        T = scaled_t.reshape(T.shape)
        before = (b_mean, b_scale)
    steps_before = trainer.n_steps
    try:
        result = train_chunk(trainer, X, T, sw, est.batch_size, host)
    except NonFiniteError as exc:  # the scalers then hold the rows up to the failed step, as step by step
        failed = exc.step - 1 - steps_before if exc.step is not None else steps.count - 1
        for obj, state in saved:
            obj.restore(state)
            for sl in steps.slices()[:failed + 1]:
                obj.update(raw[id(obj)][sl], None if sw is None else sw[sl])
        est.t_ = trainer.n_steps
        raise
    if outputs is not None:
        out = result.outputs.reshape((len(X),) + outputs.shape[1:])
        if before is not None:
            # each row with its step's statistics, at once (the same elementwise operations as per step)
            mean, scale = ((b if steps.size == 1 else np.repeat(b, steps.sizes, axis=0)).reshape(out.shape)
                           for b in before)  # a step of one row: its statistics are already per row
            out = est._to_target_units(out, mean, scale)
        outputs[...] = out
    est.t_ = trainer.n_steps
    est.loss_ = _mean_loss(result, steps)
    return float(est.loss_)


def _mean_loss(result: ChunkResult, steps: StepRows) -> float:
    """The rows' mean loss over the finite steps (summed in step order, as a loop over the steps would)."""
    if steps.n and steps.n % steps.size == 0 and len(result.losses) == steps.count:  # full steps: all finite, the usual case
        losses = np.asarray(result.losses, np.float64)
        total = float(np.cumsum(losses if steps.size == 1 else losses * float(steps.size))[-1])  # x * 1.0 is x
        if math.isfinite(total):  # a non-finite loss would carry into the sum
            return total / steps.n
    finite = np.isfinite(result.losses)
    sizes = steps.sizes[:len(finite)][finite].astype(np.float64)
    rows = int(sizes.sum())
    if not rows:
        return float("nan")
    return float(np.cumsum(result.losses[finite].astype(np.float64) * sizes)[-1]) / rows

