from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import threading

import numpy as np
import pytest

import streamfit

from streamfit.checkpoint import FORMAT_VERSION, CheckpointStore, publish
from streamfit.exceptions import CheckpointError

from tests.checkpoint.helpers import assert_content, content


def test_round_trip_is_bit_exact(tmp_path):
    nan_payload = np.array([0x7FF8DEADBEEF0001], dtype=np.uint64).view(np.float64)
    arrays = {
        "f32": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32),
        "f64_nan": np.concatenate([nan_payload, [np.inf, -0.0, 1e-310]]),
        "f16": np.array([1.5, -2.0], dtype=np.float16),
        "big_endian": np.arange(3, dtype=">f4"),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "u8": np.arange(256, dtype=np.uint8),
        "bool": np.array([True, False]),
        "c128": np.array([1 + 2j]),
        "scalar": np.array(7, dtype=np.int32),
        "np_scalar": np.float32(0.25),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "strided": np.arange(20, dtype=np.int16)[::3],
        "text": np.array(["a", "héllo"]),
        "records": np.array([(1.0, 2)], dtype=[("a", "<f4"), ("b", "<i8")]),
    }
    meta = {"rows": 123, "loss": 0.5, "diverged": float("nan"), "ok": True, "none": None,
            "positions": {"p0": [1, 2], "p1": (3, 4)}, "name": "ünï"}
    store = CheckpointStore(tmp_path / "ckpts")
    path = store.save(42, b"\x00model\xff", arrays, meta)

    assert path == tmp_path / "ckpts" / "ckpt-000000000042"
    assert sorted(os.listdir(path)) == ["manifest.json", "model.onnx", "state.npz"]
    ckpt = store.load_latest()
    assert ckpt is not None and ckpt.path == path and ckpt.step == 42
    assert ckpt.model_bytes == b"\x00model\xff"
    assert sorted(ckpt.arrays) == sorted(arrays)
    for name, arr in arrays.items():
        arr = np.asarray(arr)
        got = ckpt.arrays[name]
        assert (got.dtype, got.shape) == (arr.dtype, arr.shape), name
        assert got.tobytes() == arr.tobytes(), name
    assert ckpt.meta["positions"] == {"p0": [1, 2], "p1": [3, 4]}  # tuples come back as lists
    assert np.isnan(ckpt.meta.pop("diverged")) and np.isnan(meta.pop("diverged"))
    assert {k: v for k, v in ckpt.meta.items() if k != "positions"} == {
        k: v for k, v in meta.items() if k != "positions"
    }


def test_manifest_contents(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(7, *content(7))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "streamfit-checkpoint"
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["streamfit_version"] == getattr(streamfit, "__version__", "0.0.0")
    created = dt.datetime.fromisoformat(manifest["created_at"])
    assert created.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) < 60
    assert manifest["step"] == 7 and manifest["meta"] == content(7)[2]
    for name in ("model.onnx", "state.npz"):
        blob = (path / name).read_bytes()
        assert manifest["files"][name] == {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    assert manifest["arrays"]["adam/m"] == {"dtype": "<f4", "shape": [5, 3]}
    assert store.load(path).manifest == manifest
    assert store.load("ckpt-000000000007").step == 7


def test_retention_and_latest_pointer(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (1, 5, 9, 12):
        store.save(step, *content(step))
        assert (tmp_path / "latest").read_text() == f"ckpt-{step:012d}\n"
    assert [i.step for i in store.list()] == [9, 12]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".lock", "ckpt-000000000009", "ckpt-000000000012", "latest",
    ]
    assert_content(store.load_latest(), 12)


def test_empty_store(tmp_path):
    store = CheckpointStore(tmp_path / "missing")
    assert store.list() == []
    assert store.load_latest() is None


def test_steps_must_increase_and_discard_after(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    for step in (10, 20, 30):
        store.save(step, *content(step))
    with pytest.raises(CheckpointError, match="steps must increase"):
        store.save(30, *content(30))
    with pytest.raises(CheckpointError, match="discard_after"):
        store.save(25, *content(25))

    dropped = store.discard_after(20)
    assert [p.name for p in dropped] == ["ckpt-000000000030"]
    assert (tmp_path / "latest").read_text() == "ckpt-000000000020\n"
    store.save(25, *content(25))
    assert [i.step for i in store.list()] == [10, 20, 25]
    assert_content(store.load_latest(), 25)

    store.discard_after(0)
    assert store.list() == [] and store.load_latest() is None
    store.save(1, *content(1))
    assert [i.step for i in store.list()] == [1]


@pytest.mark.parametrize(
    ("arrays", "meta", "match"),
    [
        ({"o": np.array([{"a": 1}], dtype=object)}, {}, "refuse pickle"),
        ({"r": np.zeros(1, dtype=[("x", "O")])}, {}, "refuse pickle"),
        ({"l": [1, 2]}, {}, "expected a numpy array"),
        ({"file": np.zeros(1)}, {}, "reserved"),
        ({"": np.zeros(1)}, {}, "non-empty str"),
        ({}, {"pos": {0: 12}}, r"meta\['pos'\] has key 0 of type int"),
        ({}, {"loss": np.float32(1.0)}, r"meta\['loss'\] is float32"),
        ({}, {"s": {1, 2}}, "expected a JSON value"),
    ],
)
def test_refused_inputs_write_nothing(tmp_path, arrays, meta, match):
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError, match=match):
        store.save(1, b"m", arrays, meta)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("step", [-1, 10**12, 1.0, True, "3"])
def test_invalid_step(tmp_path, step):
    with pytest.raises(CheckpointError, match="Invalid checkpoint step"):
        CheckpointStore(tmp_path).save(step, b"m", {})


def test_invalid_arguments(tmp_path):
    with pytest.raises(CheckpointError, match="Invalid keep: 0"):
        CheckpointStore(tmp_path, keep=0)
    with pytest.raises(CheckpointError, match="model must be bytes"):
        CheckpointStore(tmp_path).save(1, "not bytes", {})  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="meta must be a mapping"):
        CheckpointStore(tmp_path).save(1, b"m", {}, [1])  # type: ignore[arg-type]


def test_publish_replaces_atomically(tmp_path):
    target = tmp_path / "serving" / "model.onnx"
    target.parent.mkdir()
    assert publish(b"first", target) == target
    publish(bytearray(b"second"), target)
    assert target.read_bytes() == b"second"
    assert os.listdir(target.parent) == ["model.onnx"]
    with pytest.raises(CheckpointError, match="cannot publish"):
        publish(b"x", tmp_path / "no-such-dir" / "model.onnx")


def test_reader_never_sees_a_torn_checkpoint_while_writer_runs(tmp_path):
    """A serving process polling load_latest() while training saves with keep=1 (retention deletes
    the checkpoint the reader may be reading): always a complete checkpoint, never an error.

    The reader reads until it has seen 8 checkpoints go by (not for a fixed time: under CPU load, and with
    the reader's loop holding the GIL, the writer commits only a few checkpoints a second)."""
    writer_store, reader_store = CheckpointStore(tmp_path, keep=1), CheckpointStore(tmp_path)
    writer_store.save(1, *content(1))
    stop = threading.Event()
    errors: list[BaseException] = []
    max_step = 2000  # ends the test (failing below) if the reader somehow never sees the writer's steps

    def write() -> None:
        try:
            step = 2
            while not stop.is_set() and step <= max_step:
                writer_store.save(step, *content(step))
                step += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        seen = set()
        while len(seen) < 8 and thread.is_alive():
            ckpt = reader_store.load_latest()
            assert ckpt is not None
            assert_content(ckpt, ckpt.step)
            seen.add(ckpt.step)
    finally:
        stop.set()
        thread.join(60)
    assert not errors
    assert len(seen) >= 8, f"the reader saw only steps {sorted(seen)} while the writer saved up to {max_step}"


def test_reader_racing_retention_logs_no_warning(tmp_path, caplog):
    """A writer that commits and retires the checkpoint ``latest`` named between a reader's scan and its read is
    no damage: the reader returns the new checkpoint without warning that ``latest`` names a missing directory
    (it used to, at every such race, in a serving process polling beside training)."""
    writer_store, reader_store = CheckpointStore(tmp_path, keep=1), CheckpointStore(tmp_path)
    writer_store.save(1, *content(1))
    scan = reader_store._scan
    raced = []

    def scan_then_writer_commits():  # the race, made certain: the writer saves step 2 right after the scan
        result = scan()
        if not raced:
            raced.append(result)
            writer_store.save(2, *content(2))  # keep=1: ckpt-1, which latest named at the scan, is gone
        return result

    reader_store._scan = scan_then_writer_commits  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="streamfit.checkpoint"):
        ckpt = reader_store.load_latest()
    assert raced and raced[0].pointer == "ckpt-000000000001"
    assert_content(ckpt, 2)
    assert [r.getMessage() for r in caplog.records] == []
