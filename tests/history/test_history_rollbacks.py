"""The history of a real run that rolls back and quarantines a poison message: the rollbacks and the
quarantine are in it, the diverged intervals are not (the lineage has no gap and no overlap), and skipped
rows count where they fell."""

from __future__ import annotations

import json

import anyio
import pytest

from streamfit.daemon import Runner
from streamfit.daemon.guard import DivergenceGuard
from streamfit.history import HistoryOptions, read_history
from tests.daemon.helpers import write_model
from tests.daemon.test_poison import MESSAGE, _estimator, _poisoned, _tables, _write


def test_rollbacks_and_the_quarantine_are_in_the_history_without_gap(tmp_path):
    model = write_model(tmp_path)
    est = _estimator(model)
    runner = Runner(est, f"parquet:{_write(tmp_path / 'poisoned', _poisoned(_tables()))}", batch_size=64,
                    on_bad="skip", source_options={"batch_size": MESSAGE}, checkpoint_dir=tmp_path / "ck",
                    every_batches=4, guard=DivergenceGuard(max_rollbacks=3, lr_factor=0.1),
                    history=HistoryOptions(every_rows=256, every_seconds=None))
    summary = anyio.run(runner.run)
    assert summary.rollbacks == 9 and summary.quarantined_rows  # 2 lowering the rate, 6 halvings, 1 quarantine

    h = read_history(tmp_path / "ck")
    ivs = h.intervals
    assert not h.gaps() and [i.seq for i in ivs] == list(range(len(ivs)))
    assert ivs[0].rows_start == 0 and ivs[-1].rows_end == summary.rows == 2048 - 1
    assert sum(i.rows_end - i.rows_start for i in ivs) == summary.rows  # the diverged intervals are gone
    marks = [r for i in ivs for r in i.rollbacks]
    assert len(marks) == 9
    assert all(r.to_rows < r.at_rows and r.reason for r in marks)
    [row] = summary.quarantined_rows
    assert [r.quarantined for r in marks][-1] == (f"row {json.dumps(row['row'], sort_keys=True)} of message "
                                                  f"{row['message']}",)
    # lowered twice, then the message is poison: the scale from before its first rollback, while it is bisected
    assert [r.lr_scale for r in marks] == pytest.approx([0.1, 0.01] + [1.0] * 7)
    assert [bool(r.quarantined) for r in marks] == [False] * 8 + [True]
    skipped = {}
    for i in ivs:
        for k, n in i.skipped_rows.items():
            skipped[k] = skipped.get(k, 0) + n
    assert skipped == summary.skipped_rows == {"poison": 1}  # the quarantined row, as 'poison'
