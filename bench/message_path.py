"""The path of one record batch (steady state) from a Parquet source to a weight update: the streamfit functions,
files and packages entered on every batch.  Usage: python bench/message_path.py (ARCHITECTURE.md quotes it)"""
import collections
import os
import sys
import tempfile
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import streamfit
from streamfit import LinearRegressor, train_stream_sync

root = os.path.dirname(streamfit.__file__)
d = tempfile.mkdtemp()
rng = np.random.default_rng(0)
n, bs = 256 * 40, 256
cols = {f"x{i}": rng.standard_normal(n).astype(np.float32) for i in range(4)}
cols["y"] = (cols["x0"] * 2).astype(np.float32)
pq.write_table(pa.table(cols), f"{d}/a.parquet", row_group_size=bs)
est = LinearRegressor(batch_size=bs)

seen = collections.Counter(); batches = [0]
def prof(frame, event, arg):
    if event == "call":
        fn = frame.f_code.co_filename
        if fn.startswith(root):
            seen[(os.path.relpath(fn, root), frame.f_code.co_name)] += 1
    return None
sys.setprofile(prof); threading.setprofile(prof)
summary = train_stream_sync(est, f"parquet://{d}", features=[f"x{i}" for i in range(4)], label="y",
                            batch_size=bs)
sys.setprofile(None); threading.setprofile(None)
nb = n // bs
per = {k: v for k, v in seen.items() if v >= nb}   # entered at least once per batch: the steady path
files = {f for f, _ in per}; pkgs = {f.split(os.sep)[0] if os.sep in f else "(root)" for f in files}
print(f"{nb} batches; functions entered every batch: {len(per)}, calls per batch: {sum(per.values())/nb:.0f}, "
      f"files: {len(files)}, packages: {len(pkgs)}")
for f in sorted(files): print("  ", f, sorted({c for ff, c in per if ff == f}))
