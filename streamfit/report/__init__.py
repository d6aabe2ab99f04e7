"""``streamfit report``: a run's metrics history drawn as one self-contained HTML page (and PNG files).

The page holds plots against the rows trained (progressive loss and metrics with checkpoints, rollbacks,
quarantines and resumes marked; rows/s; the learning-rate scale; skips by reason; the source's lag;
checkpoint write times and sizes), the run's configuration and its checkpoint chain.  Plots need
matplotlib (extra ``[report]``); the trackers (:mod:`streamfit.report.trackers`) replay the same history.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from streamfit.history import read_history

__all__ = ["ReportResult", "write_report"]


@dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote: the page, and each plot's name (and PNG file with ``png_dir``).

    Attributes
    ----------
    path
        The HTML page.
    plots
        Each plot's name.
    png_files
        The PNG files, with ``png_dir``.
    """

    path: Path
    plots: tuple[str, ...]
    png_files: tuple[Path, ...] = ()


def write_report(checkpoint_dir: str | os.PathLike[str], output: str | os.PathLike[str],
                 png_dir: str | os.PathLike[str] | None = None) -> ReportResult:
    """Write the report of the run kept in ``checkpoint_dir`` to ``output`` (HTML); ``png_dir``: the plots
    as files too.  ``ValueError`` if the directory holds no history.

    Parameters
    ----------
    checkpoint_dir
        The run's checkpoint directory (its history is read).
    output
        The HTML file to write.
    png_dir
        Also write each plot as a PNG there; None: only the page.
    """
    from streamfit.report._page import checkpoint_chain, render_page
    from streamfit.report._plots import draw_plots

    root = Path(checkpoint_dir)
    history = read_history(root)
    if not history.intervals and not history.runs:
        raise ValueError(f"{root} holds no metrics history (history/history-*.jsonl): runs with a checkpoint "
                         "directory keep one")
    plots = draw_plots(history)
    page = render_page(root, history, plots, checkpoint_chain(root))
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    files: list[Path] = []
    if png_dir is not None:
        d = Path(png_dir)
        d.mkdir(parents=True, exist_ok=True)
        for plot in plots:
            path = d / f"{plot.name}.png"
            path.write_bytes(plot.png)
            files.append(path)
    return ReportResult(out, tuple(p.name for p in plots), tuple(files))
