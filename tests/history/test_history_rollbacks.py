"""The history of a real run that rolls back and quarantines a poison message: the rollbacks and the
quarantine are in it, the diverged intervals are not (the lineage has no gap and no overlap), and skipped
rows count where they fell."""

from __future__ import annotations

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
    assert summary.rollbacks == 3 and summary.quarantined

    h = read_history(tmp_path / "ck")
    ivs = h.intervals
    assert not h.gaps() and [i.seq for i in ivs] == list(range(len(ivs)))
    assert ivs[0].rows_start == 0 and ivs[-1].rows_end == summary.rows == 2048 - MESSAGE
    assert sum(i.rows_end - i.rows_start for i in ivs) == summary.rows  # the diverged intervals are gone
    marks = [r for i in ivs for r in i.rollbacks]
    assert len(marks) == 3
    assert all(r.to_rows < r.at_rows and r.reason for r in marks)
    assert [r.quarantined for r in marks][-1] == tuple(summary.quarantined)
    # lowered twice, then the quarantine restores the scale from before the message's first rollback
    assert [r.lr_scale for r in marks] == pytest.approx([0.1, 0.01, 1.0])
    assert [bool(r.quarantined) for r in marks] == [False, False, True]
    skipped = {}
    for i in ivs:
        for k, n in i.skipped_rows.items():
            skipped[k] = skipped.get(k, 0) + n
    assert skipped == summary.skipped_rows  # the quarantined message's rows, as 'poison'
