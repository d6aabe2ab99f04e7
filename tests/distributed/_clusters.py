"""What the Ray tests share: a local cluster this process drives, and the linear stream they train on."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator

import numpy as np
import pyarrow as pa

from streamfit.distributed import LocalRayCluster


@contextlib.contextmanager
def driven_cluster(nodes: int, cpus: int = 1, env: dict[str, str] | None = None) -> Iterator[LocalRayCluster]:
    """A cluster of ``nodes`` nodes of ``cpus`` CPUs on 127.0.0.1, this process its driver (``HOME`` pointed at
    the cluster's for the run); stopped whatever happens, every node's processes killed by their process group,
    which this started."""
    old_home = os.environ.get("HOME")
    root = tempfile.mkdtemp(prefix="sf-ray-")  # short: Ray's socket paths must fit 107 bytes
    try:
        with LocalRayCluster(root, nodes=nodes, cpus=cpus, env=env) as c:
            os.environ["HOME"] = str(c.home)
            c.connect()
            try:
                yield c
            finally:
                import ray  # the [ray] extra's: this module is imported (for doctests) without it too

                ray.shutdown()
                if old_home is not None:
                    os.environ["HOME"] = old_home
    finally:
        shutil.rmtree(root, ignore_errors=True)


def write_parts(root: "os.PathLike[str] | str", tables: list[pa.Table], row_group_size: int) -> None:
    """``tables`` as ``part-000.parquet``, ``part-001.parquet``, ... in ``root`` (a Parquet source's files)."""
    import pyarrow.parquet as pq

    for i, table in enumerate(tables):
        pq.write_table(table, os.path.join(root, f"part-{i:03d}.parquet"), row_group_size=row_group_size)


def linear_tables(files: int, rows: int, d: int, seed: int = 0) -> list[pa.Table]:
    """``files`` tables of ``rows`` rows: features ``x0..x{d-1}`` and ``y``, a linear target with noise 1.0."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    out = []
    for _ in range(files):
        X = rng.standard_normal((rows, d)).astype(np.float32)
        y = (X @ w + 1.0 * rng.standard_normal(rows)).astype(np.float32)
        out.append(pa.table({**{f"x{j}": X[:, j] for j in range(d)}, "y": y}))
    return out
