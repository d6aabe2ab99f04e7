from __future__ import annotations

import pyarrow as pa
import pytest

from streamfit.sources import MemorySource

pytestmark = pytest.mark.anyio


@pytest.fixture
def data(ids_table) -> list:
    t = ids_table(0, 10)
    empty = pa.RecordBatch.from_pylist([], schema=t.schema)
    # a table of 3 chunks, a lone batch, an empty batch (skipped, still counted in positions), a table
    return [pa.concat_tables([t.slice(0, 3), t.slice(3, 4), t.slice(7, 3)]),
            ids_table(10, 15).to_batches()[0], empty, ids_table(15, 20)]


async def test_reads_tables_batches_and_positions(data) -> None:
    async with MemorySource(data) as source:
        items = [item async for item in source]
    assert sum((i.batch.column("id").to_pylist() for i in items), []) == list(range(20))
    assert [i.position_at(0) for i in items] == [{"batch": b, "row": 0} for b in (0, 1, 2, 3, 5)]
    assert items[1].position_at(2) == {"batch": 1, "row": 2}


@pytest.mark.parametrize("cut", [0, 1, 3, 5, 7, 12, 15, 19, 20])
async def test_resume_from_any_row_gives_exactly_the_rest(data, collect_ids, cut: int) -> None:
    consumed: list[int] = []
    position = {"batch": 0, "row": 0}
    async with MemorySource(data) as source:
        async for item in source:
            take = min(cut - len(consumed), item.num_rows)
            consumed += item.batch.column("id").to_pylist()[:take]
            position = item.position_at(take)
            if len(consumed) == cut:
                break
    resumed = MemorySource(data)
    resumed.seek(position)
    async with resumed:
        assert consumed + await collect_ids(resumed) == list(range(20))


async def test_record_batch_reader_is_read_in_a_thread(ids_table, collect_ids) -> None:
    table = ids_table(0, 100)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=30))
    source = MemorySource(reader)
    source.seek({"batch": 1, "row": 5})
    async with source:
        assert await collect_ids(source) == list(range(35, 100))


async def test_lifecycle_errors(ids_table) -> None:
    source = MemorySource([ids_table(0, 3)])
    async with source:
        await source.__anext__()
        with pytest.raises(RuntimeError, match="before iteration"):
            source.seek({"batch": 0, "row": 0})
    with pytest.raises(RuntimeError, match="closed"):
        await source.__anext__()
    await source.aclose()  # idempotent
    with pytest.raises(ValueError, match="expected"):
        MemorySource([]).seek({"batch": -1})
    with pytest.raises(TypeError, match="RecordBatch"):
        MemorySource(42)  # type: ignore[arg-type]
    async with MemorySource(["nope"]) as bad:  # type: ignore[list-item]
        with pytest.raises(TypeError, match="got str"):
            await bad.__anext__()
