"""Peak RSS of checkpointing a 1 GiB table (slow): a full checkpoint and its publication copy no table whole.

The run happens in a fresh interpreter (this process's peak says nothing), on a model saved with external data
as a model with a GiB table is stored; the peak is taken from the moment the trainer is built.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from streamfit._engine.testing import two_input_model

_CHILD = textwrap.dedent("""
    import gc, json, sys
    import numpy as np, pyarrow as pa, anyio

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    path, rows, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    import streamfit
    from streamfit.daemon import Runner
    from streamfit.sources import MemorySource

    touched = rows // 100  # every batch's ids from the same 1 % of the rows
    subset = np.random.default_rng(0).permutation(rows)[:touched]

    def batches(seed):
        g = np.random.default_rng(seed)
        while True:
            x = g.standard_normal((1024, 8)).astype(np.float32)
            ids = subset[g.integers(0, touched, 1024)]
            cols = {f"x{j}": x[:, j] for j in range(8)}
            cols["ids"], cols["y"] = ids, (x.sum(axis=1) + (ids % 7) * 0.1).astype(np.float32)
            yield pa.record_batch(cols)

    est = streamfit.OnnxRegressor(path, optimizer="adagrad", learning_rate="constant", eta0=0.01, penalty=None,
                                  inputs={"x": [f"x{j}" for j in range(8)], "ids": "ids"})
    first = next(batches(2))
    est.partial_fit(pa.Table.from_batches([first]).drop(["y"]), first.column("y").to_numpy())
    tables = est.trainer_.tables
    state = sum(a.nbytes for a in tables.arrays.values()) + sum(
        a.nbytes for st in tables.state_arrays().values() for a in st.values())
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = status("VmRSS")
    runner = Runner(est, lambda: MemorySource(batches(1)), checkpoint_dir=root + "/ck", every_batches=20,
                    full_every=2, keep=3, publish_path=root + "/pub/model.onnx", publish_every=0.0, label="y",
                    batch_size=1024, guard=False, max_rows=300 * 1024)
    summary = anyio.run(runner.run)
    kinds = [json.load(open(f"{root}/ck/{d}/manifest.json"))["tables"]["kind"]
             for d in sorted(__import__("os").listdir(root + "/ck")) if d.startswith("ckpt-")]
    print(json.dumps({"peak": status("VmHWM") - base, "state": state, "checkpoints": summary.checkpoints,
                      "kinds": kinds, "published": len(runner._publisher.results)}))
""")


@pytest.mark.slow
def test_checkpointing_a_1_gib_table_adds_a_small_fraction_of_it_to_the_peak_rss(tmp_path: Path):
    """2^24 x 16 float32 (1 GiB) with AdaGrad (1 GiB of state) under the Runner: fulls (copy-on-write, streamed
    by the writer), deltas, and a publication after each.  Before, a full copied the table and its state on the
    training thread and the publisher kept a copy of the table: +2.5x the tables and state at the peak.
    ~2-3 minutes here."""
    rows = 1 << 24
    model = two_input_model(8, rows, dim=16, seed=0)
    path = tmp_path / "big.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="big.data", size_threshold=1024)
    del model
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(rows), str(tmp_path)], capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert "full" in r["kinds"] and r["published"] >= 1, r
    print(f"peak RSS +{r['peak'] / r['state']:.3f}x the tables and state ({r})")  # shown with -s
    assert r["peak"] < 0.5 * r["state"], f"peak RSS +{r['peak'] / r['state']:.2f}x the tables and state ({r})"
