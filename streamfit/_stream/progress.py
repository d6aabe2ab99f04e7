"""Optional tqdm progress bar: rows, rows/s and the recent progressive loss."""

from __future__ import annotations

from typing import Any


class Progress:
    """A tqdm bar when ``enabled`` (``total`` rows if known, else open-ended); a no-op otherwise."""

    def __init__(self, enabled: bool, total: int | None = None, **tqdm_kwargs: Any) -> None:
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            kwargs = {"desc": "streamfit", "unit": "rows", "unit_scale": True, "dynamic_ncols": True}
            kwargs.update(tqdm_kwargs)
            self._bar = tqdm(total=total, **kwargs)

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def update(self, n_rows: int, loss: float | None) -> None:
        if self._bar is None:
            return
        if loss is not None:
            self._bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
        self._bar.update(n_rows)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
