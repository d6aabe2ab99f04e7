"""A run's row budget (``max_rows``: over all learners, resumes included) as a quota of rows per learner.

Each learner may have trained at most its quota in all; the quotas add up to the budget, so the run stops at
exactly ``max_rows`` rows (each learner's last batch cut short).  A learner whose share ends before its quota
leaves the rest to the learners still reading, dealt evenly (the remainder to the first): quotas only grow, so a
running loop never has to give rows back.  Pure functions, deterministic in the rows: a restart from a global
checkpoint (which stores the quotas) deals the same.

>>> start_quotas(1001, [0, 0, 0])
[334, 334, 333]
>>> redeal_quotas([500, 500], rows=[300, 500], ended=[True, False])
[300, 700]
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["start_quotas", "redeal_quotas"]


def _deal(rows: int, among: int) -> list[int]:
    """``rows`` split in ``among`` parts as even as can be, the larger first."""
    return [rows // among + (1 if i < rows % among else 0) for i in range(among)]


def start_quotas(max_rows: int, rows: Sequence[int]) -> list[int]:
    """Quotas at the start of a run: each learner's rows so far (a resume's) plus an even part of what is left."""
    left = max(max_rows - sum(rows), 0)
    return [r + part for r, part in zip(rows, _deal(left, len(rows)))]


def redeal_quotas(quotas: Sequence[int], rows: Sequence[int], ended: Sequence[bool]) -> list[int]:
    """The quotas after a barrier: the rows the learners whose share ``ended`` leave unused go to the others."""
    takers = [i for i, done in enumerate(ended) if not done]
    out = list(quotas)
    if not takers:  # every share ended: nobody can use the rest
        return out
    left = 0
    for i, (quota, trained, done) in enumerate(zip(quotas, rows, ended)):
        if done and quota > trained:
            left += quota - trained
            out[i] = trained
    for i, part in zip(takers, _deal(left, len(takers))):
        out[i] += part
    return out
