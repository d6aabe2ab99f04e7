"""The package's rooms (ARCHITECTURE.md's table, held in tools/shape.py): no module imports a room above its own,
and no import circle between modules, function-level imports included (``if TYPE_CHECKING:`` ones not)."""

from __future__ import annotations

import importlib.util
import pathlib

_PATH = pathlib.Path(__file__).resolve().parent.parent / "tools" / "shape.py"
_spec = importlib.util.spec_from_file_location("streamfit_shape", _PATH)
assert _spec is not None and _spec.loader is not None
shape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape)


def test_every_module_has_a_room() -> None:
    assert [m for m in shape.modules() if shape.room_of(m) is None] == []


def test_no_module_reaches_up_a_room() -> None:
    assert shape.reach_ups(shape.imports()) == []


def test_no_import_circles() -> None:
    assert shape.cycles(shape.imports()) == []


def test_the_check_sees_a_reach_up_and_a_circle() -> None:
    # the rule can fail: an engine module importing the stream, and two modules importing each other
    edges = {"streamfit._engine.trainer": {"streamfit._stream.loop"}, "streamfit._stream.loop": set()}
    assert shape.reach_ups(edges) == ["streamfit._engine.trainer (engine) imports streamfit._stream.loop (stream)"]
    assert shape.cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
