"""The report page: one self-contained HTML file (inline CSS, plots as base64 PNG, no script, no network)."""

from __future__ import annotations

import base64
import datetime
import html
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfit.history import History
from streamfit.report._plots import Plot

__all__ = ["CheckpointRow", "checkpoint_chain", "render_page"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1000px;
color:#222;padding:0 12px}
h1{font-size:1.5em;margin-bottom:0}.sub{color:#666;margin-top:4px}
h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
table{border-collapse:collapse;font-size:0.88em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}
img{max-width:100%;display:block;margin:8px 0 18px 0}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:0.82em}
.warn{color:#a40}
"""


@dataclass(frozen=True)
class CheckpointRow:
    """A checkpoint of the chain as its manifest says (not verified: ``streamfit inspect`` does that)."""

    name: str
    step: int
    rows: int | None
    created_at: str
    kind: str          # "full", "delta" (row-sparse chains) or "dense"
    parent: int | None
    bytes: int
    loss: float | None


def checkpoint_chain(root: Path) -> list[CheckpointRow]:
    """The committed checkpoints of ``root``, oldest first, read from their manifests."""
    from streamfit.checkpoint import CheckpointStore

    rows = []
    for info in CheckpointStore(root).list():
        try:
            manifest = json.loads((info.path / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        meta = manifest.get("meta") or {}
        tables = manifest.get("tables")
        files = manifest.get("files") or {}
        window = (meta.get("metrics") or {}).get("window") or {}
        rows.append(CheckpointRow(info.path.name, int(manifest.get("step", info.step)), meta.get("rows"),
                                  str(manifest.get("created_at", "?")),
                                  str(tables.get("kind", "?")) if isinstance(tables, dict) else "dense",
                                  tables.get("parent") if isinstance(tables, dict) else None,
                                  sum(int(f.get("size", 0)) for f in files.values() if isinstance(f, dict)),
                                  window.get("loss") if isinstance(window.get("loss"), float) else None))
    return rows


def _e(value: Any) -> str:
    return html.escape(str(value))


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else _e(v)


def render_page(root: Path, history: History, plots: list[Plot], chain: list[CheckpointRow]) -> str:
    """The HTML text of the report of the run kept in ``root``."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>streamfit report: {_e(root.name)}</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>streamfit run report</h1>",
           f'<p class="sub">{_e(os.fspath(root))}'
           + (f" &middot; source {_e(history.runs[0].source)}" if history.runs and history.runs[0].source else "")
           + "</p>"]
    out += _summary(history)
    out.append("<h2>Plots</h2>")
    for plot in plots:
        data = base64.b64encode(plot.png).decode("ascii")
        out.append(f'<img id="plot-{_e(plot.name)}" alt="{_e(plot.title)}" '
                   f'src="data:image/png;base64,{data}">')
    out += _rollbacks(history)
    out += _chain(chain)
    out += _configuration(history)
    out += _intervals(history)
    out.append(f'<p class="sub">written {_e(_when(__import__("time").time()))} by streamfit report</p>')
    out.append("</body></html>")
    return "\n".join(out)


def _summary(history: History) -> list[str]:
    """The run in one table (rows, batches, checkpoints, rollbacks, skips, time, last loss) and its gaps."""
    ivs = history.intervals
    rows = ivs[-1].rows_end if ivs else 0
    batches = ivs[-1].batch_end if ivs else 0
    skipped: dict[str, int] = {}
    for iv in ivs:
        for reason, n in iv.skipped_rows.items():
            skipped[reason] = skipped.get(reason, 0) + n
    rollbacks = [r for iv in ivs for r in iv.rollbacks]
    quarantined = [q for r in rollbacks for q in r.quarantined]
    seconds = sum(iv.time_end - iv.time_start for iv in ivs)
    summary = [("rows trained", f"{rows:,}"), ("batches", f"{batches:,}"), ("intervals", len(ivs)),
               ("process starts (fresh + resumed)", len(history.runs)),
               ("checkpoints written", sum(len(iv.checkpoints) for iv in ivs)),
               ("rollbacks", len(rollbacks)), ("quarantined messages", ", ".join(quarantined) or "none"),
               ("rows skipped", ", ".join(f"{k}: {n:,}" for k, n in sorted(skipped.items())) or "none"),
               ("training time", f"{seconds:,.1f} s")]
    last_loss = next((iv.metrics.get("loss") for iv in reversed(ivs) if iv.metrics.get("loss") is not None), None)
    if last_loss is not None:
        summary.append(("progressive loss, last interval", f"{last_loss:.4g}"))
    out = ["<table>" + "".join(f'<tr><th class="l">{_e(k)}</th><td class="l">{_e(v)}</td></tr>'
                               for k, v in summary) + "</table>"]
    gaps = history.gaps()
    if gaps:
        out.append(f'<p class="warn">the history has {len(gaps)} gap(s) between intervals (batches '
                   + ", ".join(f"{a}..{b}" for a, b in gaps[:5]) + ")</p>")
    return out


def _rollbacks(history: History) -> list[str]:
    rollbacks = [r for iv in history.intervals for r in iv.rollbacks]
    if not rollbacks:
        return []
    out = ["<h2>Rollbacks and quarantines</h2><table><tr><th>at row</th><th>back to row</th>"
           "<th>batch</th><th class='l'>reason</th><th>lr scale</th><th class='l'>quarantined</th></tr>"]
    for r in rollbacks:
        out.append(f"<tr><td>{r.at_rows:,}</td><td>{r.to_rows:,}</td><td>{r.to_step}</td>"
                   f"<td class='l'>{_e(r.reason)}</td><td>{r.lr_scale:g}</td>"
                   f"<td class='l'>{_e(', '.join(r.quarantined))}</td></tr>")
    out.append("</table>")
    return out


def _chain(chain: list[CheckpointRow]) -> list[str]:
    out = ["<h2>Checkpoint chain</h2>"]
    if not chain:
        return out + ["<p>no committed checkpoint</p>"]
    out.append("<table><tr><th class='l'>checkpoint</th><th>step</th><th>rows</th><th class='l'>kind</th>"
               "<th>parent</th><th>bytes</th><th>window loss</th><th class='l'>written</th></tr>")
    for c in chain:
        out.append(f"<tr><td class='l'>{_e(c.name)}</td><td>{c.step}</td><td>{_fmt(c.rows)}</td>"
                   f"<td class='l'>{_e(c.kind)}</td><td>{_fmt(c.parent)}</td><td>{c.bytes:,}</td>"
                   f"<td>{_fmt(c.loss)}</td><td class='l'>{_e(c.created_at)}</td></tr>")
    out.append("</table>")
    return out


def _configuration(history: History) -> list[str]:
    out = ["<h2>Configuration</h2>"]
    for run in history.runs:
        how = f"resumed from {_e(Path(run.resumed_from).name)}" if run.resumed_from else "fresh"
        out.append(f"<h3>start {run.run}: {_when(run.time)}, {how}, at row {run.rows:,} (batch {run.batches})</h3>")
        out.append(f"<pre>{html.escape(json.dumps(run.config, indent=2, sort_keys=True), quote=False)}</pre>")
    return out


def _intervals(history: History) -> list[str]:
    out = ["<h2>Intervals (the last 50)</h2><table><tr><th>seq</th><th>run</th><th>rows</th><th>rows/s</th>"
           "<th>loss</th><th>skipped</th><th>checkpoints</th><th>lr scale</th></tr>"]
    for iv in history.intervals[-50:]:
        out.append(f"<tr><td>{iv.seq}</td><td>{iv.run}</td><td>{iv.rows_start:,}&ndash;{iv.rows_end:,}</td>"
                   f"<td>{iv.rows_per_s:,.0f}</td><td>{_fmt(iv.metrics.get('loss'))}</td>"
                   f"<td>{sum(iv.skipped_rows.values()) or ''}</td>"
                   f"<td>{', '.join(str(c.step) for c in iv.checkpoints)}</td><td>{_fmt(iv.lr_scale)}</td></tr>")
    out.append("</table>")
    return out
