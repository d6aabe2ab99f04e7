"""Seeded mutations of a real checkpoint through the reader: refused with CorruptCheckpointError, never crash, never accepted.

The checkpoint comes from a real training run (its manifest holds the source position, counters, the
estimator's state tree), so the flips land in the kind of bytes production checkpoints hold.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import anyio
import numpy as np
import pytest

from streamfit import OnnxRegressor
from streamfit.checkpoint import CheckpointStore
from streamfit.checkpoint._format import read_checkpoint
from streamfit.daemon import Runner
from streamfit.exceptions import CorruptCheckpointError
from tests.checkpoint.helpers import rehash
from tests.daemon.helpers import write_model, write_stream

SEED = 9
FLIPS = 420  # per file
TRUNCATIONS = 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A store with two checkpoints of a real run (steps 4 and 8)."""
    root = tmp_path_factory.mktemp("fuzz")
    data, _ = write_stream(root, files=2, rows=256)
    est = OnnxRegressor(str(write_model(root)), optimizer="adam", learning_rate="constant", eta0=0.01, batch_size=64,
                        threads=1)
    anyio.run(Runner(est, f"parquet:{data}", checkpoint_dir=root / "ck", every_batches=4, batch_size=64).run)
    assert [i.step for i in CheckpointStore(root / "ck").list()] == [4, 8]
    return root / "ck"


def _mutations(blob: bytes, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = []
    for pos in rng.integers(0, len(blob), FLIPS):
        bit = int(rng.integers(0, 8))
        b = bytearray(blob)
        b[pos] ^= 1 << bit
        out.append((f"bit {bit} of byte {pos}", bytes(b)))
    for n in [0, 1, len(blob) - 1, *rng.integers(2, len(blob) - 1, TRUNCATIONS - 3)]:
        out.append((f"truncated to {n} bytes", blob[:n]))
    return out


@pytest.mark.parametrize("name", ["manifest.json", "state.npz"])
def test_every_mutation_is_refused(run_dir, tmp_path, name):
    newest = CheckpointStore(run_dir).list()[-1].path
    d = tmp_path / newest.name
    shutil.copytree(newest, d)
    original = (d / name).read_bytes()
    reference = read_checkpoint(d)
    rng = np.random.default_rng(SEED)
    accepted = []
    for what, blob in _mutations(original, rng):
        (d / name).write_bytes(blob)
        try:
            ckpt = read_checkpoint(d)
        except CorruptCheckpointError as exc:
            assert str(d) in str(exc)
        else:  # any other exception fails the test by itself
            accepted.append((what, ckpt.meta == reference.meta))
    assert accepted == []
    (d / name).write_bytes(original)
    assert read_checkpoint(d).meta == reference.meta


def test_store_skips_to_the_previous_checkpoint_and_recover_sets_aside(run_dir, tmp_path):
    root = tmp_path / "ck"
    shutil.copytree(run_dir, root)
    store = CheckpointStore(root)
    newest = store.list()[-1].path
    rng = np.random.default_rng(SEED + 1)
    for i, name in enumerate(["manifest.json", "state.npz"] * 10):
        blob = bytearray((newest / name).read_bytes())
        blob[int(rng.integers(0, len(blob)))] ^= 1 << int(rng.integers(0, 8))
        original = (newest / name).read_bytes()
        (newest / name).write_bytes(bytes(blob))
        assert store.load_latest().step == 4
        (newest / name).write_bytes(original)
    (newest / "manifest.json").write_bytes(b"{")
    assert store.recover().step == 4
    assert (root / f"{newest.name}.corrupt").is_dir() and store.list()[-1].step == 4


def test_parser_behind_the_checksums_never_crashes(run_dir, tmp_path, caplog):
    """Flips re-signed so that they reach the npz parser and the structural checks: refused or read, no crash."""
    newest = CheckpointStore(run_dir).list()[-1].path
    d = tmp_path / newest.name
    shutil.copytree(newest, d)
    original_state = (d / "state.npz").read_bytes()
    original_manifest = (d / "manifest.json").read_bytes()
    rng = np.random.default_rng(SEED + 2)
    outcomes = {"refused": 0, "read": 0}
    with caplog.at_level(logging.ERROR):
        for _what, blob in _mutations(original_state, rng)[:200]:
            (d / "state.npz").write_bytes(blob)
            (d / "manifest.json").write_bytes(original_manifest)
            rehash(d)  # the checksums match the damaged bytes: the parser itself must cope
            try:
                read_checkpoint(d)
                outcomes["read"] += 1  # a flip inside array data: plain numbers, still no pickle
            except CorruptCheckpointError:
                outcomes["refused"] += 1
        # version-1 manifests have no checksum: flips reach the structural checks directly
        manifest = json.loads(original_manifest)
        del manifest["manifest_sha256"]
        manifest["format_version"] = 1
        (d / "state.npz").write_bytes(original_state)
        v1 = json.dumps(manifest, indent=1).encode()
        for _what, blob in _mutations(v1, rng)[:200]:
            (d / "manifest.json").write_bytes(blob)
            try:
                read_checkpoint(d)
                outcomes["read"] += 1
            except CorruptCheckpointError:
                outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and sum(outcomes.values()) == 400
