"""Row-level quarantine: a poison message costs its poison rows, not its record batch.

One cell of 1e30 (a label) in a 65,536-row Parquet record batch: the run bisects the rows of the batch that
diverged from the rollback point and quarantines that one row; every other row of the record batch is trained
exactly once: the weights equal those of the same batches fed to ``partial_fit`` without the row.
"""

from __future__ import annotations

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamfit import OnnxRegressor
from streamfit._stream.deadletter import read_dead_letters
from streamfit._stream.row_quarantine import MessageCuts, pieces
from streamfit.checkpoint import CheckpointStore
from streamfit.daemon import Runner
from streamfit.daemon.guard import DivergenceGuard
from streamfit.sources._base import SourceBatch, Unit
from tests.daemon.helpers import N_FEATURES, write_model

BIG = 65_536          # rows of the poisoned record batch (the largest a Parquet record batch is by default)
HEAD = 1024           # rows of a clean file read before it
BS = 256              # training batch


def _table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, N_FEATURES)).astype(np.float32)
    y = (X.sum(axis=1) + np.sin(X[:, 0])).astype(np.float32)
    return pa.table({**{f"x{j}": X[:, j] for j in range(N_FEATURES)}, "y": y})


def _estimator(model):
    return OnnxRegressor(str(model), optimizer="adam", learning_rate="constant", eta0=0.01, penalty=None,
                         batch_size=BS, on_nonfinite="skip", threads=1)


def _expected_pieces(n: int, poison: list[int], bs: int) -> list[tuple[int, int]]:
    """The batches the message is trained in, by the bisection rule (written out here, not the runner's code):
    for each poison row, the batch of ``bs`` rows holding it (counted from the message's start, as a run that
    isolates the message trains it) is halved, towards the row, until the row is alone; tails count from the
    message's end."""
    cuts: set[int] = set()
    for p in poison:
        k = p // bs
        lo, hi, t = n - min((k + 1) * bs, n), n - k * bs, n - 1 - p
        while hi - lo > 1:
            mid = (lo + hi) // 2
            cuts |= {lo, mid, hi}
            lo, hi = (lo, mid) if t < mid else (mid, hi)
    edges = sorted({0, n} | {n - c for c in cuts} | {q for p in poison for q in (p, p + 1)})
    out = []
    for a, b in zip(edges, edges[1:]):
        if b - a == 1 and a in poison:
            continue
        out += [(s, min(s + bs, b)) for s in range(a, b, bs)]
    return out


def _reference(model, head: pa.Table, big: pa.Table, poison: list[int]) -> OnnxRegressor:
    ref = _estimator(model)
    feats = [f"x{j}" for j in range(N_FEATURES)]

    def fit(t: pa.Table) -> None:
        X = np.column_stack([t.column(f).to_numpy() for f in feats]).astype(np.float32)
        ref.partial_fit(X, t.column("y").to_numpy())

    for s in range(0, head.num_rows, BS):
        fit(head.slice(s, BS))
    for a, b in _expected_pieces(big.num_rows, poison, BS):
        fit(big.slice(a, b - a))
    return ref


def _write(root, head: pa.Table, big: pa.Table):
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(head, root / "part-000.parquet", row_group_size=HEAD)
    pq.write_table(big, root / "part-001.parquet", row_group_size=BIG)
    return root


@pytest.mark.parametrize("poison", [[40_077], [1_000, 50_001]])
def test_one_cell_in_a_65536_row_record_batch_costs_its_row(tmp_path, poison):
    model = write_model(tmp_path)
    head, big = _table(HEAD, 0), _table(BIG, 1)
    y = big.column("y").to_numpy().copy()
    y[poison] = 1e30
    bad = big.set_column(N_FEATURES, "y", pa.array(y, pa.float32()))
    data = _write(tmp_path / "data", head, bad)
    dead = tmp_path / "dead.jsonl"
    est = _estimator(model)
    runner = Runner(est, f"parquet:{data}", batch_size=BS, on_bad="skip", source_options={"batch_size": BIG},
                    checkpoint_dir=tmp_path / "ck", every_batches=50, dead_letter=str(dead),
                    guard=DivergenceGuard(max_rollbacks=3, lr_factor=0.1))
    summary = anyio.run(runner.run)

    # exactly the poison rows cost: counted, named by message and row, dead-lettered with their values
    assert summary.ended_by == "end"
    assert summary.rows == HEAD + BIG - len(poison)
    assert summary.skipped_rows == {"poison": len(poison)} and summary.skipped_messages == {}
    assert summary.quarantined == []
    key = '{"file": "part-001.parquet", "row": 65536}'
    assert summary.quarantined_rows == [{"message": key, "row": {"file": "part-001.parquet", "row": p},
                                         "from_end": BIG - 1 - p} for p in poison]
    # about log2(batch rows) extra rollbacks per poison row: 2 lowering the rate, 8 halvings, the quarantine
    assert summary.rollbacks == len(poison) * (3 + 8) - (len(poison) - 1) * 2
    letters = read_dead_letters(dead)
    assert [(d.reason, d.rows, d.message, d.position["row"]) for d in letters] == [
        ("poison", 1, False, p) for p in poison]
    assert [d.table().column("y").to_numpy()[0] for d in letters] == [np.float32(1e30)] * len(poison)
    # the manifest of the last checkpoint names the rows, and its counts are the summary's
    meta = CheckpointStore(tmp_path / "ck").load_latest().meta
    assert meta["poison"]["quarantined_rows"] == summary.quarantined_rows
    assert meta["skipped_rows"] == {"poison": len(poison)} and meta["rows"] == summary.rows
    # every other row trained once: the same weights as the same batches without the poison rows
    assert est.trainer_.lr_scale == 1.0
    ref = _reference(model, head, bad, poison)
    for name, w in ref.trainer_.get_weights().items():
        got = est.trainer_.get_weights()[name]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_pieces_keep_the_message_coordinates_when_read_from_its_middle():
    """A message read from row 100 of 300 (a restart inside it): the same tails are cut and dropped."""
    rb = pa.record_batch({"x": pa.array(np.arange(300, dtype=np.float32))})
    whole = SourceBatch(rb, lambda r: {"row": r})
    part = SourceBatch(rb.slice(100), lambda r: {"row": 100 + r})
    cuts = MessageCuts({150, 50}, {120})
    for sb, start in ((whole, 0), (part, 100)):
        got = [(p.sb.position_at(0)["row"], p.sb.num_rows, p.dropped) for p in pieces(sb, sb.units()[0], cuts)]
        expect = [(150, 29, False), (179, 1, True), (180, 70, False), (250, 50, False)]
        if start == 0:
            expect = [(0, 150, False)] + expect
        else:
            expect = [(100, 50, False)] + expect
        assert got == expect
        # a span of a piece names the tails of the message
        last = pieces(sb, sb.units()[0], cuts)[-1].sb
        [unit] = last.units()
        assert (unit.stop - 0 - 1, unit.stop - 50) == (49, 0)


@pytest.mark.slow  # three `streamfit train` processes: ~40 s here
def test_sigkill_during_the_bisection_resumes_to_the_same_result(tmp_path):
    """`streamfit train` killed (SIGKILL) in the middle of a bisection, then resumed: the same rows quarantined,
    counted once, dead-lettered once, the same weights as an uninterrupted run."""
    import json
    import signal

    from tests.daemon.helpers import run_cli, wait_for

    model = write_model(tmp_path)
    head, big = _table(HEAD, 0), _table(BIG, 1)
    y = big.column("y").to_numpy().copy()
    y[40_077] = 1e30
    data = _write(tmp_path / "data", head, big.set_column(N_FEATURES, "y", pa.array(y, pa.float32())))
    opts = ["--source", f"parquet:{data}", "--model", str(model), "--batch-size", str(BS), "--optimizer", "adam",
            "--learning-rate", "constant", "--eta0", "0.01", "--penalty", "none", "--threads", "1", "--no-progress",
            "--on-bad", "skip", "--checkpoint-every-batches", "20", "--log-json"]

    def train(name: str, *extra: str, env: dict | None = None):
        return run_cli("train", *opts, "--checkpoint-dir", str(tmp_path / name / "ck"), "--dead-letter",
                       str(tmp_path / name / "dead.jsonl"), *extra, env=env)

    (tmp_path / "ref").mkdir()
    (tmp_path / "killed").mkdir()
    proc = train("ref")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    marker = tmp_path / "marker"
    # rollback 6: the 4th of the 8 halvings of the 256 rows of the batch that diverged
    proc = train("killed", env={"STREAMFIT_CHECKPOINT_TEST_PAUSE": f"bisect6:{marker}"})
    wait_for(marker.exists, proc, timeout=300, what="the bisection's 4th halving")
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    events = [json.loads(line).get("event") for line in err.splitlines() if line.startswith("{")]
    assert events.count("bisect") == 4 and "quarantine" not in events  # killed in the middle of it
    proc = train("killed", "--resume")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]

    ref, got = (CheckpointStore(tmp_path / n / "ck").load_latest() for n in ("ref", "killed"))
    assert got.meta["rows"] == ref.meta["rows"] == HEAD + BIG - 1
    assert got.meta["skipped_rows"] == ref.meta["skipped_rows"] == {"poison": 1}
    assert got.meta["poison"]["quarantined_rows"] == ref.meta["poison"]["quarantined_rows"] == [
        {"message": '{"file": "part-001.parquet", "row": 65536}', "row": {"file": "part-001.parquet", "row": 40_077},
         "from_end": BIG - 1 - 40_077}]
    for n in ("ref", "killed"):
        letters = read_dead_letters(tmp_path / n / "dead.jsonl")
        assert [(d.reason, d.rows, d.position["row"]) for d in letters] == [("poison", 1, 40_077)]
    for name, w in ref.arrays.items():
        if name.startswith("trainer/weights/"):
            np.testing.assert_allclose(got.arrays[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
