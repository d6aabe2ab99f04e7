from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from streamfit.checkpoint import FORMAT_VERSION, CheckpointStore
from streamfit.exceptions import CorruptCheckpointError

from tests.checkpoint.helpers import assert_content, content, rehash, sign


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
        sign(d / "manifest.json", manifest)

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
    sign(d / "manifest.json", manifest)


def _edit_manifest_bytes(old: bytes, new: bytes) -> Callable[[Path], None]:
    """Change manifest.json's bytes without re-signing it (damage, or an edit by hand)."""

    def change(d: Path) -> None:
        raw = (d / "manifest.json").read_bytes()
        assert old in raw
        (d / "manifest.json").write_bytes(raw.replace(old, new, 1))

    return change


def _reformat_manifest(d: Path) -> None:
    """Same parsed content, other bytes: compact JSON in another key order."""
    manifest = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(dict(reversed(list(manifest.items())))))


def _drop_checksum(d: Path) -> None:
    manifest = json.loads((d / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _symlink_to_copy(name: str) -> Callable[[Path], None]:
    """Replace ``name`` by a symlink to an identical copy outside the checkpoint (must still be refused)."""

    def change(d: Path) -> None:
        target = Path(tempfile.mkdtemp(dir=d.parent.parent)) / name
        shutil.copyfile(d / name, target)
        (d / name).unlink()
        (d / name).symlink_to(target)

    return change


def _symlinked_directory(d: Path) -> None:
    target = Path(tempfile.mkdtemp(dir=d.parent.parent)) / d.name
    shutil.copytree(d, target)
    shutil.rmtree(d)
    d.symlink_to(target, target_is_directory=True)


def _fifo_model(d: Path) -> None:
    (d / "model.onnx").unlink()
    os.mkfifo(d / "model.onnx")


CORRUPTIONS = {
    "source position edited in the manifest": (
        _edit_manifest_bytes(b'"part-2.parquet"', b'"part-3.parquet"'), r"manifest\.json fails its SHA-256 check"),
    "row counter edited in the manifest": (
        _edit_manifest_bytes(b'"rows": 64', b'"rows": 65'), r"manifest\.json fails its SHA-256 check"),
    "manifest checksum edited": (
        lambda d: _edit_manifest_bytes(b'"manifest_sha256": "', b'"manifest_sha256": "0')(d), "expected 64 hex digits"),
    "manifest reformatted, same content": (_reformat_manifest, "not in its canonical form"),
    "manifest without its checksum": (_drop_checksum, "of format version 3 has no manifest_sha256"),
    "manifest.json is a symlink": (_symlink_to_copy("manifest.json"), r"manifest\.json is a symlink; refused"),
    "state.npz is a symlink": (_symlink_to_copy("state.npz"), r"state\.npz is a symlink; refused"),
    "model.onnx is a FIFO": (_fifo_model, r"model\.onnx is not a regular file"),
    "directory is a symlink": (_symlinked_directory, "is a symlink"),
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
    "newer format version": (_set_manifest(format_version=4), "unknown format version 4: written by a newer"),
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


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_recover_sets_a_corrupt_newest_aside_and_saves_go_on(store, case, caplog):
    """Issue 9, defect 1: a writer resuming past a corrupt checkpoint must not be blocked by it."""
    corrupt, reason = CORRUPTIONS[case]
    broken = store.root / "ckpt-000000000002"
    if corrupt is None:
        shutil.rmtree(broken)
        broken.write_bytes(b"")
    else:
        corrupt(broken)
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        assert_content(store.recover(), 1)
    aside = store.root / "ckpt-000000000002.corrupt"
    assert os.path.lexists(aside) and not os.path.lexists(broken)
    assert (store.root / "latest").read_text() == "ckpt-000000000001\n"
    assert any("ckpt-000000000002 set aside as ckpt-000000000002.corrupt" in r.getMessage() for r in caplog.records)
    if corrupt is not None:
        assert any(re.search(reason, r.getMessage()) for r in caplog.records if "set aside" in r.getMessage())
    store.save(2, *content(2))  # the step of the corrupt one: no longer blocked
    store.save(3, *content(3))
    assert [i.step for i in store.list()] == [1, 2, 3]
    assert_content(store.load_latest(), 3)
    assert os.path.lexists(aside)  # kept for a post-mortem: neither retention nor cleanup touches it


def test_recover_names_a_second_corrupt_copy_uniquely(store):
    _truncate_state(store.root / "ckpt-000000000002")
    assert_content(store.recover(), 1)
    store.save(2, *content(2))
    _flip_model_byte(store.root / "ckpt-000000000002")
    assert_content(store.recover(), 1)
    names = [p.name for p in store.list_corrupt()]
    assert names == ["ckpt-000000000002.corrupt", "ckpt-000000000002.corrupt.1"]
    assert store.recover().step == 1 and store.load_latest().step == 1  # nothing left to set aside


def test_recover_with_no_valid_checkpoint_refuses_and_renames_nothing(store):
    for step in (1, 2):
        _flip_model_byte(store.root / f"ckpt-{step:012d}")
    before = sorted(p.name for p in store.root.iterdir())
    with pytest.raises(CorruptCheckpointError, match="no valid checkpoint"):
        store.recover()
    assert sorted(p.name for p in store.root.iterdir()) == before


def test_recover_of_an_empty_store_is_none(tmp_path):
    assert CheckpointStore(tmp_path / "nothing").recover() is None


def test_version_1_checkpoints_are_read_with_a_warning(store, caplog):
    """Format 1 had no manifest checksum: still read (data files verified), and said so each time."""
    d = store.root / "ckpt-000000000002"
    manifest = json.loads((d / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    manifest["format_version"] = 1
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1))  # as version 1 wrote it
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        assert_content(store.load_latest(), 2)
    assert any("format version 1, whose manifest has no checksum" in r.getMessage() and str(d) in r.getMessage()
               for r in caplog.records)
    store.save(3, *content(3))  # written in the current version, signed
    assert json.loads((store.root / "ckpt-000000000003" / "manifest.json").read_text())["format_version"] == FORMAT_VERSION
    _flip_model_byte(d)  # a version-1 checkpoint's data files are still verified
    with pytest.raises(CorruptCheckpointError, match="model.onnx fails its SHA-256 check"):
        store.load(d)


def test_recover_repoints_a_latest_that_names_a_missing_directory(store):
    (store.root / "latest").write_text("ckpt-000000000005\n")
    assert_content(store.recover(), 2)
    assert (store.root / "latest").read_text() == "ckpt-000000000002\n"
    store.save(3, *content(3))
    assert [i.step for i in store.list()] == [1, 2, 3]
