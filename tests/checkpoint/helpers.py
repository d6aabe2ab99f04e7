"""Shared helpers for checkpoint tests: deterministic content per step, manifest rewriting."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np


def content(step: int) -> tuple[bytes, dict[str, np.ndarray], dict[str, Any]]:
    """Model bytes, arrays and meta that are a pure function of ``step`` (so a reader can check them)."""
    model = b"onnx-model-%d;" % step * 64
    arrays = {
        "w": np.arange(2000, dtype=np.float64) * step,
        "adam/m": np.full((5, 3), step, dtype=np.float32),
        "count": np.array(step, dtype=np.int64),
    }
    meta = {"step": step, "rows": step * 32, "position": {"file": f"part-{step}.parquet", "row": step}}
    return model, arrays, meta


def assert_content(ckpt: Any, step: int) -> None:
    model, arrays, meta = content(step)
    assert ckpt.step == step
    assert ckpt.model_bytes == model
    assert ckpt.meta == meta
    assert sorted(ckpt.arrays) == sorted(arrays)
    for name, arr in arrays.items():
        assert ckpt.arrays[name].dtype == arr.dtype
        assert ckpt.arrays[name].tobytes() == arr.tobytes()


def rehash(ckpt_dir: Path, *, arrays_listing: dict[str, Any] | None = None, extra_files: tuple[str, ...] = ()) -> None:
    """Rewrite (and re-sign) manifest.json so its checksums match the files on disk again (to isolate other checks)."""
    manifest_path = ckpt_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for name in [*manifest["files"], *extra_files]:
        blob = (ckpt_dir / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    if arrays_listing is not None:
        manifest["arrays"] = arrays_listing
    sign(manifest_path, manifest)


def sign(manifest_path: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` with a valid checksum, so a test reaches the checks behind it."""
    from streamfit.checkpoint._format import encode_manifest

    manifest_path.write_bytes(encode_manifest(manifest))
