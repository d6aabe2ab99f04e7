"""A seeded synthetic click stream: categorical fields with Zipf-distributed values, dense fields, and labels
drawn from a known logistic model with pairwise field interactions (what click and ranking models learn).

The true model is fixed by the seed and evaluated by hashing, so it needs no table per value: each value of
each categorical field has a scalar effect and a factor vector, both standard-normal draws derived from a
hash of (seed, field, value).  The logit of a row is::

    intercept + sum_f effect_f(v_f) + sum_{(f, g) in pairs} <factor_f(v_f), factor_g(v_g)> + dense @ w

Batch ``k`` of a stream is drawn from its own generator seeded by ``(seed, k)``, so any batch can be
regenerated alone, and the same seed gives the same stream in every process.

>>> stream = ClickStream(seed=7)
>>> batch = stream.batch(0, rows=1000)
>>> batch.num_columns, batch.column_names[:2], batch.column_names[20:22], batch.column_names[-1]
(29, ['c0', 'c1'], ['d0', 'd1'], 'label')
>>> stream.cardinalities[0], stream.cardinalities[-1]
(10, 1000000)
>>> 0.1 < float(np.mean(batch.column("label").to_numpy())) < 0.5
True
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

__all__ = ["ClickStream"]

_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 (a bijection that scatters nearby inputs)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _normal(seed: int, field_: int, slot: int, values: np.ndarray) -> np.ndarray:
    """A near-normal draw (mean 0, variance 1) per value, the same for the same (seed, field, slot, value):
    the sum of the four 16-bit parts of one hash (Irwin-Hall), cheap enough for millions of rows."""
    key = _mix(np.array([(seed * 1_000_003 + field_ * 7919 + slot * 104_729 + 1) & _MASK], np.uint64))[0]
    h = _mix(values.astype(np.uint64) ^ key)
    m = np.uint64(0xFFFF)
    total = (h & m).astype(np.float64)
    for shift in (16, 32, 48):
        total += ((h >> np.uint64(shift)) & m).astype(np.float64)
    return (total / 65535.0 - 2.0) * math.sqrt(3.0)


def _default_cardinalities(n: int) -> tuple[int, ...]:
    return tuple(int(round(c)) for c in np.logspace(1, 6, n)) if n > 1 else (10,) * n


@dataclass(frozen=True)
class ClickStream:
    """A synthetic click stream (see the module docstring).

    Parameters
    ----------
    seed
        Fixes the true model and every batch.
    n_categorical, n_dense
        Number of categorical fields (columns ``c0..``) and of dense float32 fields (``d0..``).
    cardinalities
        Values per categorical field; default log-spaced from 10 to 10^6.
    zipf
        Exponent ``s`` of the value distribution: the value of rank ``r`` has probability ~ ``r**-s``.
    n_pairs, n_factors
        Interacting field pairs (chosen by the seed) and the rank of their interactions.
    effect_scale, interaction_scale, dense_scale, intercept
        Scales of the true model's terms (standard deviations of the effects and factor elements, of the
        dense weights) and its intercept.
    strings
        Categorical columns as strings (the decimal value) instead of int64.
    """

    seed: int = 0
    n_categorical: int = 20
    n_dense: int = 8
    cardinalities: tuple[int, ...] = ()
    zipf: float = 1.1
    n_pairs: int = 10
    n_factors: int = 4
    effect_scale: float = 0.4
    interaction_scale: float = 0.5
    dense_scale: float = 0.3
    intercept: float = -1.5
    strings: bool = False
    pairs: tuple[tuple[int, int], ...] = field(init=False, repr=False)
    dense_weights: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cards = tuple(self.cardinalities) or _default_cardinalities(self.n_categorical)
        if len(cards) != self.n_categorical or any(int(c) < 1 for c in cards):
            raise ValueError(f"cardinalities must give {self.n_categorical} positive counts, got {cards}")
        if not self.zipf > 0:
            raise ValueError(f"zipf must be > 0, got {self.zipf!r}")
        object.__setattr__(self, "cardinalities", tuple(int(c) for c in cards))
        rng = np.random.default_rng([self.seed, 1 << 20])
        all_pairs = [(f, g) for f in range(self.n_categorical) for g in range(f + 1, self.n_categorical)]
        chosen: Any = rng.choice(len(all_pairs), size=min(self.n_pairs, len(all_pairs)), replace=False) \
            if all_pairs else []
        object.__setattr__(self, "pairs", tuple(all_pairs[i] for i in sorted(chosen)))
        object.__setattr__(self, "dense_weights", rng.standard_normal(self.n_dense) * self.dense_scale)

    # -- columns -------------------------------------------------------------------------------------
    @property
    def categorical(self) -> list[str]:
        return [f"c{f}" for f in range(self.n_categorical)]

    @property
    def dense(self) -> list[str]:
        return [f"d{j}" for j in range(self.n_dense)]

    def _values(self, rng: np.random.Generator, f: int, rows: int) -> np.ndarray:
        """Ranks 0..C-1 with P(r) ~ (r + 1)**-s: the inverse CDF of the bounded continuous power law."""
        c, s = self.cardinalities[f], self.zipf
        u = rng.random(rows)
        if abs(s - 1.0) < 1e-9:
            r = np.exp(u * math.log(c + 1.0))
        else:
            r = (u * ((c + 1.0) ** (1.0 - s) - 1.0) + 1.0) ** (1.0 / (1.0 - s))
        return np.minimum(np.floor(r).astype(np.int64) - 1, c - 1)

    def logit(self, values: list[np.ndarray], dense: np.ndarray) -> np.ndarray:
        """The true logit of rows given their categorical values (one int array per field) and dense fields.

        Parameters
        ----------
        values
            One int array of value indices per categorical field.
        dense
            The dense fields, ``(n, n_dense)``.
        """
        z = np.full(len(dense), self.intercept) + dense @ self.dense_weights
        for f, v in enumerate(values):
            z += self.effect_scale * _normal(self.seed, f, 0, v)
        for f, g in self.pairs:
            for k in range(self.n_factors):
                z += self.interaction_scale ** 2 * _normal(self.seed, f, 1 + k, values[f]) \
                    * _normal(self.seed, g, 1 + k, values[g])
        return z

    def batch(self, index: int, rows: int) -> pa.RecordBatch:
        """Batch ``index`` of the stream: ``rows`` rows, the categorical, dense and ``label`` columns (plus
        none of the true model's internals; :meth:`true_logit` recomputes them).

        Parameters
        ----------
        index
            Which batch: the same index gives the same rows, in any process.
        rows
            Rows in it.
        """
        rng = np.random.default_rng([self.seed, int(index)])
        values = [self._values(rng, f, rows) for f in range(self.n_categorical)]
        dense = rng.standard_normal((rows, self.n_dense))
        p = 1.0 / (1.0 + np.exp(-self.logit(values, dense)))
        label = (rng.random(rows) < p).astype(np.int64)
        cols = [pa.array(v).cast(pa.string()) if self.strings else pa.array(v) for v in values]
        cols += [pa.array(dense[:, j].astype(np.float32)) for j in range(self.n_dense)]
        return pa.record_batch(cols + [pa.array(label)], names=self.categorical + self.dense + ["label"])

    def true_logit(self, batch: "pa.RecordBatch | pa.Table") -> np.ndarray:
        """The true model's logit for rows of this stream (the best any learner can do, in expectation).

        Parameters
        ----------
        batch
            Rows of this stream (a batch or table it made).
        """
        values = [np.asarray(batch.column(c).to_numpy(zero_copy_only=False)).astype(np.int64)
                  for c in self.categorical]
        dense = np.column_stack([batch.column(c).to_numpy() for c in self.dense]).astype(np.float64) \
            if self.n_dense else np.zeros((batch.num_rows, 0))
        return self.logit(values, dense)

    # -- whole streams -------------------------------------------------------------------------------
    def batches(self, rows: int, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        """The first ``rows`` rows, as batches of ``batch_rows`` (the last one shorter).

        Parameters
        ----------
        rows
            Rows in all.
        batch_rows
            Rows per batch.
        """
        for k, start in enumerate(range(0, rows, batch_rows)):
            yield self.batch(k, min(batch_rows, rows - start))

    def table(self, rows: int, batch_rows: int = 65536) -> pa.Table:
        """The first ``rows`` rows as one table (of :meth:`batches`).

        Parameters
        ----------
        rows, batch_rows
            As for :meth:`batches`.
        """
        return pa.Table.from_batches(list(self.batches(rows, batch_rows)))

    def write_parquet(self, directory: "str | os.PathLike[str]", rows: int, rows_per_file: int = 262144,
                      batch_rows: int = 65536) -> list[Path]:
        """The first ``rows`` rows as Parquet files ``part-00000.parquet, ...`` in ``directory``.

        Parameters
        ----------
        directory
            Where the files go (made if missing).
        rows
            Rows in all.
        rows_per_file, batch_rows
            Rows per file (a file ends at the first whole batch that reaches it), and per record batch written.
        """
        import pyarrow.parquet as pq

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        writer = None
        in_file = 0
        for batch in self.batches(rows, batch_rows):
            if writer is None:
                paths.append(out / f"part-{len(paths):05d}.parquet")
                writer = pq.ParquetWriter(paths[-1], batch.schema)
            writer.write_batch(batch)
            in_file += batch.num_rows
            if in_file >= rows_per_file:
                writer.close()
                writer, in_file = None, 0
        if writer is not None:
            writer.close()
        return paths

    def kafka_messages(self, rows: int, rows_per_message: int = 1024) -> Iterator[bytes]:
        """The first ``rows`` rows as Kafka message values (Arrow IPC stream bytes, one batch each).

        Parameters
        ----------
        rows
            Rows in all.
        rows_per_message
            Rows per message.
        """
        from streamfit.testing.kafka import ipc_bytes

        for batch in self.batches(rows, rows_per_message):
            yield ipc_bytes(batch)
