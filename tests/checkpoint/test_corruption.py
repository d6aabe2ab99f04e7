from __future__ import annotations

import io
import json
import logging
import re
import shutil
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from streamfit.checkpoint import CheckpointStore
from streamfit.exceptions import CorruptCheckpointError

from tests.checkpoint.helpers import assert_content, content, rehash


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path, keep=3)
    for step in (1, 2):
        store.save(step, *content(step))
    return store


def _truncate_state(d: Path) -> None:
    blob = (d / "state.npz").read_bytes()
    (d / "state.npz").write_bytes(blob[: len(blob) // 2])


def _flip_model_byte(d: Path) -> None:
    blob = bytearray((d / "model.onnx").read_bytes())
    blob[17] ^= 0x01
    (d / "model.onnx").write_bytes(bytes(blob))


def _set_manifest(**changes: object) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        manifest = json.loads((d / "manifest.json").read_text())
        manifest.update(changes)
        (d / "manifest.json").write_text(json.dumps(manifest))

    return change


def _pickled_state(d: Path) -> None:
    """A real pickle inside state.npz; checksums and listing fixed so only the pickle check can catch it."""
    with open(d / "state.npz", "wb") as f:
        np.savez(f, allow_pickle=True, w=np.array([{"evil": 1}, None], dtype=object))
    rehash(d, arrays_listing={"w": {"dtype": "|O", "shape": [2]}})


def _listed_pkl_file(d: Path) -> None:
    (d / "extra.pkl").write_bytes(b"\x80\x04K\x01.")  # pickle of 1
    rehash(d, extra_files=("extra.pkl",))


def _non_npy_member(d: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("w.pkl", b"\x80\x04K\x01.")
    (d / "state.npz").write_bytes(buf.getvalue())
    rehash(d, arrays_listing={"w.pkl": {"dtype": "<f8", "shape": []}})


def _single_npy(d: Path) -> None:
    with open(d / "state.npz", "wb") as f:
        np.save(f, np.zeros(3))
    rehash(d)


def _array_listing_mismatch(d: Path) -> None:
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["arrays"]["adam/m"]["shape"] = [3, 5]
    (d / "manifest.json").write_text(json.dumps(manifest))


CORRUPTIONS = {
    "truncated state.npz": (_truncate_state, r"state\.npz is \d+ bytes, manifest\.json says \d+"),
    "flipped byte in model.onnx": (_flip_model_byte, r"model\.onnx fails its SHA-256 check"),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
    "deleted model.onnx": (lambda d: (d / "model.onnx").unlink(), r"model\.onnx is missing"),
    "deleted state.npz": (lambda d: (d / "state.npz").unlink(), r"state\.npz is missing"),
    "garbage manifest": (lambda d: (d / "manifest.json").write_bytes(b"\x00{garbage"), "not valid JSON"),
    "truncated manifest": (
        lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:50]),
        "not valid JSON",
    ),
    "manifest is a list": (lambda d: (d / "manifest.json").write_text("[]"), "holds a list"),
    "newer format version": (_set_manifest(format_version=2), "unknown format version 2: written by a newer"),
    "older format version": (_set_manifest(format_version=0), "unknown format version 0"),
    "other format": (_set_manifest(format="other"), "has format 'other'"),
    "step mismatch": (_set_manifest(step=3), "says step 3 but the directory name says 2"),
    "pickled object array": (_pickled_state, "pickled object array; pickle is refused"),
    "manifest lists a .pkl file": (_listed_pkl_file, "unexpected file 'extra.pkl'"),
    "unlisted extra file": (lambda d: (d / "notes.txt").write_text("x"), "unexpected file 'notes.txt'"),
    "npz member that is not .npy": (_non_npy_member, "member 'w.pkl' is not a .npy array"),
    "single .npy instead of .npz": (_single_npy, "single .npy array"),
    "array listing mismatch": (_array_listing_mismatch, "array 'adam/m' is"),
    "directory replaced by a file": (None, "is not a directory"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_latest_falls_back_to_previous(store, case, caplog):
    corrupt, reason = CORRUPTIONS[case]
    broken = store.root / "ckpt-000000000002"
    if corrupt is None:
        shutil.rmtree(broken)
        broken.write_bytes(b"")
    else:
        corrupt(broken)

    with pytest.raises(CorruptCheckpointError, match=reason) as info:
        store.load(broken)
    assert str(broken) in str(info.value)

    assert (store.root / "latest").read_text() == "ckpt-000000000002\n"  # latest names the broken one
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        ckpt = store.load_latest()
    assert_content(ckpt, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if corrupt is None:  # not a directory: not even listed as a checkpoint
        assert warnings == [f"latest names {broken.name}, which is missing or not a directory; "
                            "falling back to an older checkpoint"]
    else:
        assert any(str(broken) in w and re.search(reason, w) for w in warnings), warnings


def test_every_checkpoint_corrupt_raises(store):
    for step in (1, 2):
        _flip_model_byte(store.root / f"ckpt-{step:012d}")
    with pytest.raises(CorruptCheckpointError, match="no valid checkpoint") as info:
        store.load_latest()
    assert "ckpt-000000000001" in str(info.value) and "ckpt-000000000002" in str(info.value)


def test_latest_naming_missing_directory_falls_back(store, caplog):
    (store.root / "latest").write_text("ckpt-000000000005\n")
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        assert_content(store.load_latest(), 2)
    assert "latest names ckpt-000000000005, which is missing" in caplog.text
    (store.root / "latest").write_text("ckpt-12\n")
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        assert_content(store.load_latest(), 2)
    assert "holds 'ckpt-12', expected a checkpoint directory name" in caplog.text


def test_garbage_latest_pointer_uses_newest_directory(store, caplog):
    (store.root / "latest").write_bytes(b"\xff\xfe../../etc/passwd")
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        assert_content(store.load_latest(), 2)
    assert "latest is unreadable" in caplog.text
    (store.root / "latest").unlink()
    assert_content(store.load_latest(), 2)


def test_stale_tmp_and_uncommitted_dirs_are_ignored_then_cleaned(store):
    root = store.root
    stale = root / ".tmp-99999-deadbeef-ckpt-000000000003"
    stale.mkdir()
    (stale / "model.onnx").write_bytes(b"half")
    (root / ".tmp-99999-cafebabe-latest").write_text("ckpt-000000000003\n")
    # a complete directory renamed into place whose writer died before updating latest
    uncommitted = root / "ckpt-000000000003"
    uncommitted.mkdir()
    (uncommitted / "manifest.json").write_text("{}")

    assert [i.step for i in store.list()] == [1, 2]
    assert_content(store.load_latest(), 2)
    assert stale.exists() and uncommitted.exists()  # readers never delete

    store.save(3, *content(3))
    assert sorted(p.name for p in root.iterdir()) == [
        ".lock", "ckpt-000000000001", "ckpt-000000000002", "ckpt-000000000003", "latest",
    ]
    assert_content(store.load_latest(), 3)
