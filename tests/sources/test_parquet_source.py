from __future__ import annotations

import os

import anyio
import pyarrow.parquet as pq
import pytest

from streamfit.exceptions import SourceError
from streamfit.sources import ParquetSource
from streamfit.sources.parquet import _FileScan

pytestmark = pytest.mark.anyio

# three files of 50 rows in 20-row groups; "sub/c" sorts after "b" and holds the last ids
FILES = {"b.parquet": (50, 100), "a.parquet": (0, 50), "sub/c.parquet": (100, 150)}


@pytest.fixture
def parquet_dir(tmp_path, ids_table):
    for name, (start, stop) in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(ids_table(start, stop), tmp_path / name, row_group_size=20)
    (tmp_path / "_SUCCESS").write_text("")  # ignored: underscore prefix
    (tmp_path / "notes.txt").write_text("")  # ignored: not a parquet name
    return tmp_path


async def test_directory_in_sorted_name_order_with_positions(parquet_dir) -> None:
    async with ParquetSource(parquet_dir, batch_size=8, columns=["id"]) as source:
        items = [item async for item in source]
    ids = sum((i.batch.column("id").to_pylist() for i in items), [])
    assert ids == list(range(150))
    assert items[0].batch.schema.names == ["id"]
    assert items[0].position_at(3) == {"file": "a.parquet", "row": 3}
    assert items[-1].position_at(items[-1].num_rows) == {"file": "sub/c.parquet", "row": 50}
    assert all(i.num_rows <= 8 for i in items)


@pytest.mark.parametrize("cut", [0, 5, 20, 37, 50, 61, 99, 100, 149, 150])
async def test_resume_mid_batch_and_mid_file_gives_exactly_the_rest(parquet_dir, collect_ids, cut) -> None:
    consumed: list[int] = []
    position = None
    async with ParquetSource(parquet_dir, batch_size=16) as source:
        async for item in source:
            take = min(cut - len(consumed), item.num_rows)
            consumed += item.batch.column("id").to_pylist()[:take]
            position = item.position_at(take)
            if len(consumed) == cut:
                break
    resumed = ParquetSource(parquet_dir, batch_size=16)
    resumed.seek(position)
    async with resumed:
        assert consumed + await collect_ids(resumed) == list(range(150))


def test_seek_skips_whole_row_groups(parquet_dir) -> None:
    scan = _FileScan(str(parquet_dir / "b.parquet"), 45, None, 1000, 4)
    assert scan.row == 40  # reading starts at the 3rd row group, not at row 0
    batch, start = scan.next()
    assert (start, batch.column("id").to_pylist()) == (45, [95, 96, 97, 98, 99])
    assert scan.next() is None


async def test_cancelled_reads_lose_no_row(parquet_dir, collect_ids_cancelling) -> None:
    async with ParquetSource(parquet_dir, batch_size=7) as source:
        assert await collect_ids_cancelling(source, 150) == list(range(150))


async def test_file_list_and_single_file(parquet_dir, collect_ids) -> None:
    files = [parquet_dir / "sub/c.parquet", parquet_dir / "a.parquet"]
    async with ParquetSource(files) as source:
        first = await source.__anext__()
        assert first.position_at(0) == {"file": "a.parquet", "row": 0}
        assert first.batch.column("id").to_pylist() + await collect_ids(source) == \
            list(range(50)) + list(range(100, 150))
    single = ParquetSource(str(parquet_dir / "b.parquet"))
    single.seek({"file": "b.parquet", "row": 48})
    async with single:
        assert await collect_ids(single) == [98, 99]


async def test_bad_files_yield_errors_and_the_stream_goes_on(parquet_dir, collect_ids) -> None:
    (parquet_dir / "aa.parquet").write_bytes(b"not parquet at all")
    async with ParquetSource(parquet_dir) as source:
        items = [item async for item in source]
    errors = [i for i in items if i.error is not None]
    assert [(e.error.reason, e.where) for e in errors] == [("undecodable", "aa.parquet")]
    ids = sum((i.batch.column("id").to_pylist() for i in items if i.batch is not None), [])
    assert ids == list(range(150))
    resumed = ParquetSource(parquet_dir)
    resumed.seek(errors[0].position_at(0))  # the position after the bad file
    async with resumed:
        assert await collect_ids(resumed) == list(range(50, 150))
    async with ParquetSource(parquet_dir / "a.parquet", columns=["nope"]) as source:
        item = await source.__anext__()
        assert (item.error.reason, item.error.column) == ("missing_column", "nope")


async def test_follow_picks_up_a_file_written_after_start(parquet_dir, ids_table, caplog) -> None:
    got: list[int] = []
    with anyio.fail_after(10):
        async with ParquetSource(parquet_dir, follow=True, poll_interval=0.02) as source:
            async for item in source:
                got += item.batch.column("id").to_pylist()
                if len(got) == 150:
                    # "b2" sorts before the files already read: ignored (logged); "z" is read
                    pq.write_table(ids_table(1000, 1010), parquet_dir / "b2.parquet")
                    tmp = parquet_dir / ".z.parquet"  # hidden while written, then renamed: atomic
                    await anyio.to_thread.run_sync(pq.write_table, ids_table(150, 160), tmp)
                    os.rename(tmp, parquet_dir / "z.parquet")
                if len(got) == 160:
                    break
    assert got == list(range(160))
    assert "ignoring b2.parquet" in caplog.text


async def test_follow_never_ends_until_cancelled(tmp_path) -> None:
    async with ParquetSource(tmp_path, follow=True, poll_interval=0.01) as source:
        with anyio.move_on_after(0.1) as scope:
            await source.__anext__()
        assert scope.cancelled_caught


async def test_errors_for_bad_arguments(tmp_path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        ParquetSource(tmp_path, batch_size=0)
    with pytest.raises(ValueError, match="directory"):
        ParquetSource([tmp_path / "a.parquet"], follow=True)
    with pytest.raises(ValueError, match="expected"):
        ParquetSource(tmp_path).seek({"row": 3})
    async with ParquetSource(tmp_path / "missing") as source:
        with pytest.raises(SourceError, match="not found"):
            await source.__anext__()
