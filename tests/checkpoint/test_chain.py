"""Table chains in the store: a full then deltas of touched rows; resolution, integrity, retention."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamfit.checkpoint import CheckpointStore, RowDelta, TableArrays
from streamfit.exceptions import CheckpointError, CorruptCheckpointError

ROWS, DIM = 1000, 4


def _table(step: int) -> np.ndarray:
    """The table after ``step``: rows ``k * 7 + step`` (mod ROWS) for k < 10 were written at each step <= it."""
    t = np.zeros((ROWS, DIM), np.float32)
    for s in range(1, step + 1):
        t[_touched(s)] = s
    return t


def _touched(step: int) -> np.ndarray:
    return np.unique((np.arange(10) * 7 + step) % ROWS)


def _save(store: CheckpointStore, step: int, parent: int | None) -> None:
    table = _table(step)
    if parent is None:
        tables = TableArrays({"t": table}, None, {})
    else:
        rows = np.unique(np.concatenate([_touched(s) for s in range(parent + 1, step + 1)]))
        tables = TableArrays({"t": RowDelta(table.shape, rows, table[rows])}, parent, {})
    store.save(step, b"m", {"dense": np.full(3, step, np.float64)}, {"rows": step}, tables=tables)


def _chain(store: CheckpointStore, steps: int, full_every: int) -> None:
    parent, depth = None, 0
    for step in range(1, steps + 1):
        full = parent is None or depth + 1 >= full_every
        _save(store, step, None if full else parent)
        parent, depth = step, (0 if full else depth + 1)


def test_a_delta_holds_only_its_rows_and_resolves_to_the_whole_table(tmp_path):
    store = CheckpointStore(tmp_path, keep=10)
    _chain(store, 4, full_every=10)
    d = tmp_path / "ckpt-000000000004"
    assert (d / "delta.npz").stat().st_size < 0.05 * (tmp_path / "ckpt-000000000001" / "state.npz").stat().st_size
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["tables"]["kind"] == "delta" and manifest["tables"]["base"] == 1
    assert manifest["tables"]["depth"] == 3 and manifest["tables"]["rows"] == {"t": 10}
    ckpt = store.load_latest()
    assert ckpt.step == 4 and ckpt.meta == {"rows": 4}
    np.testing.assert_array_equal(ckpt.arrays["t"], _table(4))
    np.testing.assert_array_equal(ckpt.arrays["dense"], np.full(3, 4.0))


def test_a_corrupt_delta_falls_back_to_the_previous_complete_chain(tmp_path):
    store = CheckpointStore(tmp_path, keep=10)
    _chain(store, 5, full_every=10)
    blob = bytearray((tmp_path / "ckpt-000000000004" / "delta.npz").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (tmp_path / "ckpt-000000000004" / "delta.npz").write_bytes(bytes(blob))
    # 5 is intact but depends on 4: the newest complete chain ends at 3
    ckpt = store.load_latest()
    assert ckpt.step == 3
    np.testing.assert_array_equal(ckpt.arrays["t"], _table(3))
    with pytest.raises(CorruptCheckpointError, match="chain is broken at ckpt-000000000004"):
        store.load("ckpt-000000000005")
    recovered = store.recover()
    assert recovered.step == 3
    assert sorted(p.name for p in store.list_corrupt()) == ["ckpt-000000000004.corrupt", "ckpt-000000000005.corrupt"]
    _save(store, 4, 3)  # the chain goes on from 3
    np.testing.assert_array_equal(store.load_latest().arrays["t"], _table(4))


def test_a_truncated_delta_and_a_replaced_parent_are_caught(tmp_path):
    store = CheckpointStore(tmp_path, keep=10)
    _chain(store, 3, full_every=10)
    path = tmp_path / "ckpt-000000000003" / "delta.npz"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match="delta.npz is .* bytes"):
        store.load("ckpt-000000000003")
    # a parent with the same step but another manifest (another run): the chain does not stitch
    other = CheckpointStore(tmp_path / "other", keep=10)
    _chain(other, 3, full_every=10)
    parent = json.loads((tmp_path / "other" / "ckpt-000000000002" / "manifest.json").read_text())
    parent["meta"]["rows"] = 99
    from tests.checkpoint.helpers import sign
    sign(tmp_path / "other" / "ckpt-000000000002" / "manifest.json", parent)
    with pytest.raises(CorruptCheckpointError, match="not the checkpoint it was written after"):
        other.load("ckpt-000000000003")


def test_a_delta_must_follow_the_newest_checkpoint_of_its_chain(tmp_path):
    store = CheckpointStore(tmp_path, keep=10)
    with pytest.raises(CheckpointError, match="newest checkpoint .* is none"):
        _save(store, 1, 0)
    store.save(1, b"m", {"t": _table(1)})  # not a chain checkpoint
    with pytest.raises(CheckpointError, match="not a readable checkpoint of a table chain"):
        _save(store, 2, 1)
    _save(store, 3, None)
    with pytest.raises(CheckpointError, match="after step 1"):
        _save(store, 4, 1)


def test_retention_never_deletes_a_full_that_kept_deltas_depend_on(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    _chain(store, 7, full_every=4)  # fulls at 1 and 5; deltas 2-4 and 6-7
    assert [i.step for i in store.list()] == [5, 6, 7]  # 6 and 7 kept, and the full 5 they need
    np.testing.assert_array_equal(store.load_latest().arrays["t"], _table(7))
    _save(store, 8, None)  # a new full: the old chain goes
    _save(store, 9, 8)
    assert [i.step for i in store.list()] == [8, 9]


def test_the_model_skeleton_is_filled_from_the_resolved_tables(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    def model(table: np.ndarray) -> bytes:
        graph = helper.make_graph([helper.make_node("Gather", ["E", "ids"], ["Y"])], "g",
                                  [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["N"])],
                                  [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", DIM])],
                                  [numpy_helper.from_array(table, "E")])
        return helper.make_model(graph).SerializeToString()

    store = CheckpointStore(tmp_path, keep=10)
    skeleton = model(np.zeros((0, DIM), np.float32))
    store.save(1, skeleton, {}, tables=TableArrays({"w/E": _table(1)}, None, {"E": "w/E"}))
    rows = _touched(2)
    store.save(2, skeleton, {}, tables=TableArrays({"w/E": RowDelta((ROWS, DIM), rows, _table(2)[rows])}, 1,
                                                   {"E": "w/E"}))
    filled = onnx.load_from_string(store.load_latest().model_bytes)
    np.testing.assert_array_equal(numpy_helper.to_array(filled.graph.initializer[0]), _table(2))
    assert len((tmp_path / "ckpt-000000000002" / "model.onnx").read_bytes()) < 1000


def test_a_compacted_delta_is_written_as_a_full_from_the_chain_on_disk(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    _chain(store, 3, full_every=10)
    rows = _touched(4)
    store.save(4, b"m", {"dense": np.full(3, 4.0)}, {"rows": 4},
               tables=TableArrays({"t": RowDelta((ROWS, DIM), rows, _table(4)[rows])}, 3, {}, compact=True))
    manifest = json.loads((tmp_path / "ckpt-000000000004" / "manifest.json").read_text())
    assert manifest["tables"]["kind"] == "full" and not (tmp_path / "ckpt-000000000004" / "delta.npz").exists()
    assert [i.step for i in store.list()] == [4]  # a full: nothing older is needed any more
    np.testing.assert_array_equal(store.load_latest().arrays["t"], _table(4))
    with pytest.raises(CheckpointError, match="needs a parent"):
        TableArrays({"t": _table(1)}, None, {}, compact=True)
