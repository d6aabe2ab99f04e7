"""The report's plots, drawn with matplotlib (extra ``[report]``) from a run's history, as PNG bytes.

Each plot is against the rows trained (the x axis every plot shares): checkpoints are thin grey lines,
resumes dotted, rollbacks red dashed lines (with the rows they went back to) and quarantines red crosses.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable

from streamfit.history import History, Interval

__all__ = ["Plot", "draw_plots"]


@dataclass(frozen=True)
class Plot:
    """One rendered plot: a file-name stem, a title and the PNG bytes."""

    name: str
    title: str
    png: bytes


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("streamfit report draws with matplotlib: pip install 'streamfit[report]'") from exc
    matplotlib.use("Agg", force=True)  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _marks(ax: Any, history: History, legend: bool = False) -> None:
    """Checkpoints, resumes, rollbacks and quarantines on an axis whose x is rows."""
    first = {"checkpoint": True, "resume": True, "rollback": True, "quarantine": True}

    def label(kind: str) -> str | None:
        if legend and first[kind]:
            first[kind] = False
            return kind
        return None

    for iv in history.intervals:
        for c in iv.checkpoints:
            ax.axvline(c.rows, color="0.75", lw=0.6, zorder=0, label=label("checkpoint"))
        for r in iv.rollbacks:
            ax.axvline(r.at_rows, color="tab:red", lw=1.0, ls="--", label=label("rollback"))
            if r.quarantined:
                ax.plot([r.at_rows], [0.98], transform=ax.get_xaxis_transform(), marker="x", color="tab:red",
                        ms=9, mew=2, ls="none", label=label("quarantine"))
    for run in history.runs[1:]:
        ax.axvline(run.rows, color="tab:purple", lw=1.0, ls=":", label=label("resume"))


def _points(intervals: list[Interval], value: Callable[[Interval], Any]) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for iv in intervals:
        v = value(iv)
        if v is not None and not iv.idle:
            xs.append(iv.rows_end)
            ys.append(float(v))
    return xs, ys


def _metric(name: str) -> Callable[[Interval], Any]:
    return lambda iv: iv.metrics.get(name)


def _lag_of(part: str) -> Callable[[Interval], Any]:
    return lambda iv: iv.lag.get(part)


def _finish(fig: Any, ax: Any, h: History, ylabel: str, bottom: float | None = None, legend: bool = False,
            empty: str | None = None) -> Any:
    """The plot's labels, legend (or the note ``empty`` of a plot without data) and marks (x: rows trained)."""
    if empty is not None:
        _empty(ax, empty)
    elif legend:
        ax.legend(loc="upper right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("rows trained")
    if bottom is not None:
        ax.set_ylim(bottom=bottom)
    _marks(ax, h)
    return fig


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _metrics(plt: Any, h: History) -> Any:
    names = sorted({k for iv in h.intervals for k, v in iv.metrics.items() if v is not None})
    others = [n for n in names if n != "loss"]
    fig, axes = plt.subplots(2 if others else 1, 1, figsize=(9, 5.5 if others else 3.4), sharex=True, squeeze=False)
    ax = axes[0][0]
    xs, ys = _points(h.intervals, lambda iv: iv.metrics.get("loss"))
    if xs:
        ax.plot(xs, ys, marker=".", color="tab:blue", label="progressive loss (per interval)")
    else:
        _empty(ax, "no evaluated rows (evaluation off?)")
    ax.set_ylabel("loss")
    _marks(ax, h, legend=True)
    ax.legend(loc="upper right", fontsize=8)
    if others:
        ax2 = axes[1][0]
        for name in others:
            xs, ys = _points(h.intervals, _metric(name))
            ax2.plot(xs, ys, marker=".", label=name)
        ax2.set_ylabel("metric")
        ax2.legend(loc="upper right", fontsize=8)
        _marks(ax2, h)
    axes[-1][0].set_xlabel("rows trained")
    return fig


def _throughput(plt: Any, h: History) -> Any:
    fig, ax = plt.subplots(figsize=(9, 3))
    xs, ys = _points(h.intervals, lambda iv: iv.rows_per_s)
    ax.plot(xs, ys, marker=".", color="tab:green")
    return _finish(fig, ax, h, "rows/s", bottom=0)


def _lr_scale(plt: Any, h: History) -> Any:
    fig, ax = plt.subplots(figsize=(9, 2.6))
    xs, ys = _points(h.intervals, lambda iv: iv.lr_scale)
    if xs:
        ax.step(xs, ys, where="post", color="tab:orange")
        ax.set_yscale("log")
    else:
        _empty(ax, "no learning-rate scale (not a streamfit trainer)")
    return _finish(fig, ax, h, "learning-rate scale")


def _skips(plt: Any, h: History) -> Any:
    fig, ax = plt.subplots(figsize=(9, 3))
    reasons = sorted({r for iv in h.intervals for r in iv.skipped_rows})
    ivs = [iv for iv in h.intervals if iv.rows_end > iv.rows_start or iv.skipped_rows]
    if reasons:
        bottom = [0.0] * len(ivs)
        lefts = [iv.rows_start for iv in ivs]
        widths = [max(iv.rows_end - iv.rows_start, 1) for iv in ivs]
        for reason in reasons:
            counts = [float(iv.skipped_rows.get(reason, 0)) for iv in ivs]
            ax.bar(lefts, counts, width=widths, bottom=bottom, align="edge", label=reason)
            bottom = [b + c for b, c in zip(bottom, counts)]
    return _finish(fig, ax, h, "rows skipped per interval", legend=True,
                   empty=None if reasons else "no row skipped")


def _lag(plt: Any, h: History) -> Any:
    fig, ax = plt.subplots(figsize=(9, 3))
    parts = sorted({p for iv in h.intervals for p in iv.lag}, key=lambda p: (len(p), p))
    for part in parts:
        xs, ys = _points(h.intervals, _lag_of(part))
        ax.plot(xs, ys, marker=".", label=f"partition {part}")
    return _finish(fig, ax, h, "messages behind", legend=True,
                   empty=None if parts else "no lag known for this source (Kafka reports it per partition)")


def _checkpoints(plt: Any, h: History) -> Any:
    fig, ax = plt.subplots(figsize=(9, 3))
    marks = [c for iv in h.intervals for c in iv.checkpoints]
    if marks:
        ax.plot([c.rows for c in marks], [c.seconds * 1e3 for c in marks], marker="o", color="tab:gray",
                label="write time (ms)")
        ax.set_ylabel("write time (ms)")
        ax2 = ax.twinx()
        ax2.plot([c.rows for c in marks], [c.bytes / 1e6 for c in marks], marker="s", ls="--", color="tab:brown",
                 label="size (MB)")
        ax2.set_ylabel("size (MB)")
        ax2.set_ylim(bottom=0)
        ax.set_ylim(bottom=0)
    else:
        _empty(ax, "no checkpoint written")
    ax.set_xlabel("rows trained")
    return fig


_PLOTS: list[tuple[str, str, Callable[[Any, History], Any]]] = [
    ("metrics", "Progressive metrics (each row predicted before it is trained on)", _metrics),
    ("throughput", "Throughput", _throughput),
    ("lr_scale", "Learning-rate scale (lowered by rollbacks, recovers)", _lr_scale),
    ("skips", "Skipped rows by reason", _skips),
    ("lag", "Source lag", _lag),
    ("checkpoints", "Checkpoint writes", _checkpoints),
]


def draw_plots(history: History, dpi: int = 90) -> list[Plot]:
    """Every plot of the report, rendered to PNG."""
    plt = _pyplot()
    out = []
    for name, title, draw in _PLOTS:
        fig = draw(plt, history)
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        plt.close(fig)
        out.append(Plot(name, title, buf.getvalue()))
    return out
