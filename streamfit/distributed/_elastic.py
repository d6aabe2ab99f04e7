"""Elastic resume: a global checkpoint written by N learners, resumed by N' learners.

The source is re-dealt with every row's fate kept: Kafka partitions go to their new owners (``p % N'``) with
the positions the checkpoint holds for them; Parquet files are dealt again (sorted, round-robin) with each
file's progress (done files left out, a file read in part starts after its trained rows).  Every new learner
starts from the mixed model, with the per-learner state (optimizer moments when they are not mixed) of old
learner ``i % N``; the counters of old learner ``j`` (rows, skips, rollbacks, loss sums) go to new learner
``j % N'``, so the totals carry over exactly; every learner gets the poison state of all (the messages it may
now read), the quarantined rows stay counted once (with the learner ``j % N'``).  Pure: no Ray, no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamfit.distributed._messages import LearnerState, StartFrom
from streamfit.distributed._messages import array_refs as _refs
from streamfit.distributed._shares import Share
from streamfit.exceptions import ResumeError

__all__ = ["Redealt", "redeal"]



@dataclass(frozen=True)
class Redealt:
    """The new shares and where each new learner starts."""

    shares: list[Share]
    starts: list[StartFrom]


def _names(files: list[str]) -> dict[str, str]:
    """Each file's name as a position names it (relative to the files' common directory, as ParquetSource)."""
    if not files:
        return {}
    root = os.path.commonpath([os.path.dirname(p) for p in files])
    return {p: os.path.relpath(p, root).replace(os.sep, "/") for p in files}


def _file_progress(entries: list[Mapping[str, Any]]) -> dict[str, int | None]:
    """Rows trained of every file of the old shares (None: the file is done)."""
    progress: dict[str, int | None] = {}
    for entry in entries:
        share = entry["share"]
        files = sorted(share.get("files") or ())
        names = _names(files)
        starts = {str(k): int(v) for k, v in (share.get("starts") or {}).items()}
        pos = entry.get("position")
        at = pos.get("file") if isinstance(pos, Mapping) else None
        for path in files:
            name = names[path]
            if at is None:
                progress[path] = starts.get(name, 0)
            elif name < at:
                progress[path] = None
            elif name == at:
                progress[path] = int(pos["row"])  # type: ignore[index]
            else:
                progress[path] = starts.get(name, 0)
    return progress


def _kafka_positions(entries: list[Mapping[str, Any]]) -> tuple[str | None, dict[str, Any]]:
    topic, merged = None, {}
    for entry in entries:
        pos = entry.get("position")
        if isinstance(pos, Mapping):
            topic = pos.get("topic", topic)
            merged.update({str(p): at for p, at in (pos.get("partitions") or {}).items()})
    return topic, merged


def _sum(counts: list[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in (c or {}).items():
            out[k] = out.get(k, 0) + int(v)
    return out


def _poison(entries: list[Mapping[str, Any]], own: list[int]) -> dict[str, Any]:
    """Every old learner's strikes, bisections and whole quarantines; the quarantined rows of ``own`` only."""
    out: dict[str, Any] = {"strikes": {}, "scale_before": {}, "quarantined": [], "bisecting": {},
                           "quarantined_rows": []}
    for j, entry in enumerate(entries):
        state = entry.get("poison") or {}
        for key, n in (state.get("strikes") or {}).items():
            out["strikes"][key] = max(int(n), out["strikes"].get(key, 0))
        out["scale_before"].update(state.get("scale_before") or {})
        out["quarantined"] = sorted(set(out["quarantined"]) | set(state.get("quarantined") or ()))
        out["bisecting"].update(state.get("bisecting") or {})
        if j in own:
            out["quarantined_rows"] += list(state.get("quarantined_rows") or ())
    return out


def redeal(entries: list[Mapping[str, Any]], arrays: Mapping[str, np.ndarray], plan: list[Share]
           ) -> Redealt:
    """Re-deal the checkpoint's learners (``entries``: its ``distributed.learners``, ``arrays``: its arrays) to
    the learners of ``plan`` (the shares :func:`~streamfit.distributed._shares.plan_shares` makes for N')."""
    n_old, n_new = len(entries), len(plan)
    if not plan:
        raise ResumeError("no learner to resume with")
    kind = plan[0].kind
    if any(e["share"].get("kind") != kind for e in entries):
        raise ResumeError(f"the checkpoint's learners read another kind of source than {kind} now")
    if kind == "kafka":
        topic, merged = _kafka_positions(entries)
        shares = list(plan)
        positions: list[Any] = []
        for share in shares:
            parts = {str(p): merged[str(p)] for p in share.partitions if str(p) in merged}
            positions.append({"topic": topic, "partitions": parts} if parts and topic is not None else None)
    else:
        progress = _file_progress(entries)
        left = sorted(p for p, rows in progress.items() if rows is not None)
        if len(left) < n_new:
            raise ResumeError(f"{len(left)} Parquet file(s) are left to train: resume with at most that many "
                              f"learners, not {n_new}")
        shares, positions = [], []
        for i in range(n_new):
            files = left[i::n_new]
            names = _names(files)
            starts = {names[p]: int(progress[p] or 0) for p in files if progress[p]}
            shares.append(replace(plan[i], files=tuple(files), starts=starts))
            positions.append(None)
    starts_out = []
    for i in range(n_new):
        own = [j for j in range(n_old) if j % n_new == i]
        model = entries[i % n_old]
        state = None
        if model.get("state") is not None:
            tree = model["state"]["tree"]
            state = LearnerState(model["state"]["class"], tree, {r: arrays[r] for r in _refs(tree)})
        mine = [entries[j] for j in own]
        dead = entries[i]["dead_letter"] if i < n_old else (
            {"kind": "file", "records": 0, "bytes": 0}
            if any((e.get("dead_letter") or {}).get("kind") == "file" for e in entries) else None)
        starts_out.append(StartFrom(
            state, positions[i], sum(int(e["rows"]) for e in mine), sum(int(e["batches"]) for e in mine),
            sum(int(e["evaluated_rows"]) for e in mine), sum(float(e["loss_sum"]) for e in mine),
            _sum([e.get("skipped_rows") or {} for e in mine]), _sum([e.get("skipped_messages") or {} for e in mine]),
            sum(int(e.get("rollbacks", 0)) for e in mine), _poison(entries, own), dead))
    return Redealt(shares, starts_out)
