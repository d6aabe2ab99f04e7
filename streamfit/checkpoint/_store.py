"""A directory of checkpoints written atomically, with a ``latest`` pointer and retention.

The ``latest`` pointer is the commit record: a checkpoint directory only counts once ``latest``
names it (or a later one).  So a crash at any instant leaves the previous checkpoints and pointer
intact; at worst a ``.tmp-*`` entry or an uncommitted directory remains, which readers ignore and
the next :meth:`CheckpointStore.save` removes.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from streamfit.checkpoint._chain import (
    DELTA_ROWS, DELTA_VALUES, ArrayBlocks, ChainLink, RowDelta, TableArrays, apply_delta,
)
from streamfit.checkpoint._format import (
    DELTA_FILE,
    MANIFEST_FILE,
    MANIFEST_SHA256,
    MODEL_FILE,
    STATE_FILE,
    Checkpoint,
    build_manifest,
    check_arrays,
    check_model,
    check_tables,
    write_npz,
    array_entry,
    check_step,
    dir_name,
    encode_manifest,
    file_digest,
    json_copy,
    parse_dir_name,
    read_checkpoint,
    verify_manifest,
)

from streamfit.checkpoint._fs import StrPath, atomic_write, fsync_dir, pause_point, tmp_name, write_durably
from streamfit.exceptions import CheckpointError, CorruptCheckpointError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CheckpointInfo", "CheckpointStore"]

logger = logging.getLogger("streamfit.checkpoint")

LATEST_FILE = "latest"
LOCK_FILE = ".lock"
_NO_CHECKPOINT = "none"  # pointer content after discard_after() removed every checkpoint


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint directory, as listed (not yet verified: use :meth:`CheckpointStore.load`).

    Attributes
    ----------
    step, path
        The checkpoint's step and directory.
    """

    step: int
    path: Path


@dataclass(frozen=True)
class _Scan:
    committed: list[CheckpointInfo]
    uncommitted: list[CheckpointInfo]
    pointer: str | None  # directory name the pointer holds, "none", or None when missing/garbage
    problem: str | None  # why the pointer was ignored


class CheckpointStore:
    """Checkpoints of one training run under ``root``: atomic ``save``, verified ``load``, last ``keep`` kept.

    Each checkpoint is a directory ``ckpt-<step:012d>`` holding ``model.onnx``, ``state.npz`` and
    ``manifest.json``; ``latest`` names the newest.  The store does not know the training engine: it
    stores the model bytes, named arrays and JSON ``meta`` it is given.  One writer per root (saves
    are serialized by a lock file); any number of readers.

    Parameters
    ----------
    root
        Directory holding the checkpoints; created on the first save.
    keep
        How many checkpoints to keep; older ones are deleted once a new one is durable.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> root = tempfile.mkdtemp()
    >>> store = CheckpointStore(root, keep=2)
    >>> for step in (10, 20, 30):
    ...     _ = store.save(step, b"onnx-bytes", {"m": np.full(3, step, np.float32)}, {"rows": step * 8})
    >>> [info.step for info in store.list()]
    [20, 30]
    >>> ckpt = store.load_latest()
    >>> ckpt.step, ckpt.meta, ckpt.model_bytes, ckpt.arrays["m"]
    (30, {'rows': 240}, b'onnx-bytes', array([30., 30., 30.], dtype=float32))
    """

    def __init__(self, root: StrPath, keep: int = 3) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise CheckpointError(f"Invalid keep: {keep!r}, expected an int >= 1")
        self.root = Path(root)
        self.keep = keep
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CheckpointStore({str(self.root)!r}, keep={self.keep})"

    # ----------------------------------------------------------------------------------- writing

    def save(
        self,
        step: int,
        model: bytes,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any] | None = None,
        *,
        tables: TableArrays | None = None,
    ) -> Path:
        """Write checkpoint ``step`` durably and atomically, make it ``latest``, apply retention.

        ``arrays`` must be snapshots (copies) the caller no longer mutates; object dtypes are
        refused.  ``meta`` must be JSON (str keys; tuples come back as lists).  ``step`` must be
        greater than every committed checkpoint's step; after a rollback, :meth:`discard_after`
        first.  ``tables`` (large arrays) makes it a link of a chain: a full, or a delta of the rows
        written since ``tables.parent``, which must be the newest committed checkpoint, itself of a
        chain (see :mod:`streamfit.checkpoint._chain`).  Returns the checkpoint directory.

        Parameters
        ----------
        step
            The checkpoint's step (the trainer's step count); greater than every committed one.
        model
            The model file's bytes (ONNX).
        arrays
            ``{name: array}``: the state's arrays (copies the caller no longer mutates).
        meta
            JSON-able state (the estimator's state tree, the source position, counters...).
        tables
            The large arrays (:class:`TableArrays`): a full or a delta of a chain; None: no chain.
        """
        if tables is not None and not isinstance(tables, TableArrays):
            raise CheckpointError(f"tables must be a TableArrays, got {type(tables).__name__}")
        try:
            return self._save(step, model, arrays, meta, tables)
        finally:
            if tables is not None:
                tables.release()  # a streamed snapshot is read once: done, or abandoned by a failed write

    def _save(self, step: int, model: bytes, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None,
              tables: TableArrays | None) -> Path:
        step = check_step(step)
        model_view = check_model(model)
        snap: dict[str, Any] = check_arrays(arrays)
        if tables is not None and not tables.is_delta:
            clash = sorted(set(tables.arrays) & set(snap))
            if clash:
                raise CheckpointError(f"arrays {clash} are given both as arrays and as tables")
            snap = {**snap, **check_tables(tables.arrays)}
        if meta is None:
            meta = {}
        if not isinstance(meta, Mapping):
            raise CheckpointError(f"meta must be a mapping, got {type(meta).__name__}")
        meta_copy = json_copy(meta)
        name = dir_name(step)
        with self._writing():
            try:
                self._remove_leftovers()
                committed = self._scan().committed
            except OSError as exc:
                raise CheckpointError(f"cannot prepare checkpoint directory {self.root}: {exc}") from exc
            if committed and step <= committed[-1].step:
                raise CheckpointError(
                    f"cannot save step {step}: checkpoint {committed[-1].path.name} (step "
                    f"{committed[-1].step}) already exists and steps must increase; after a "
                    "rollback call discard_after(step) first"
                )
            link = None if tables is None else self._link(step, tables, committed)
            if tables is not None and tables.compact:  # the parent's chain + these rows, written as a full
                tables, link = self._compacted(step, tables)
                snap = {**snap, **check_arrays(tables.arrays)}
            final = self.root / name
            tmp = self.root / tmp_name(name)
            try:
                self._write_files(tmp, step, model_view, snap, meta_copy, link,
                                  tables.arrays if tables is not None and link is not None and link.kind == "delta"
                                  else None)
                pause_point("files_written")
                os.rename(tmp, final)
            except BaseException as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(exc, OSError):
                    raise CheckpointError(f"cannot write checkpoint step {step} under {self.root}: {exc}") from exc
                raise
            try:
                fsync_dir(self.root)
                pause_point("renamed")
                self._write_pointer(name)
            except OSError as exc:
                raise CheckpointError(f"checkpoint {final} written but not committed: {exc}") from exc
            pause_point("latest_updated")
            if link is not None and link.kind == "delta":
                pause_point("delta_committed")
            self._apply_retention()
        return final

    def _link(self, step: int, tables: TableArrays, committed: builtins.list[CheckpointInfo]) -> ChainLink:
        """The chain link a checkpoint of ``tables`` will be: a full, or a delta after the newest checkpoint."""
        fill = dict(tables.model_fill)
        if not tables.is_delta:
            listing = {n: array_entry(a if isinstance(a, (np.ndarray, ArrayBlocks)) else np.asarray(a))
                       for n, a in tables.arrays.items()}
            return ChainLink("full", step, 0, None, None, listing, fill, {})
        newest = committed[-1] if committed else None
        if newest is None or newest.step != tables.parent:
            raise CheckpointError(
                f"cannot save delta checkpoint {step} after step {tables.parent}: the newest checkpoint under "
                f"{self.root} is {newest.path.name if newest else 'none'} (a delta holds the rows written since "
                "the checkpoint before it; write a full one instead)")
        parent, sha = self._read_link(newest.path)
        if parent is None or sha is None:
            raise CheckpointError(f"cannot save delta checkpoint {step}: {newest.path.name} is not a readable "
                                  "checkpoint of a table chain (write a full one instead)")
        listing = {}
        for n, d in tables.arrays.items():
            assert isinstance(d, RowDelta)
            listing[n] = {"dtype": array_entry(d.values)["dtype"], "shape": list(d.shape)}
        if listing != {k: dict(v) for k, v in parent.tables.items()}:
            raise CheckpointError(f"cannot save delta checkpoint {step}: its tables {listing} are not those of "
                                  f"{newest.path.name} ({dict(parent.tables)})")
        rows = {n: int(d.rows.size) for n, d in tables.arrays.items()}  # type: ignore[union-attr]
        return ChainLink("delta", parent.base, parent.depth + 1, newest.step, sha, listing, fill, rows)

    def _compacted(self, step: int, tables: TableArrays) -> tuple[TableArrays, ChainLink]:
        """``tables`` (a delta after the newest checkpoint) as a full: its parent resolved from disk, rows applied."""
        assert tables.parent is not None
        try:
            parent = self._resolve(self.root / dir_name(tables.parent))
        except CorruptCheckpointError as exc:
            raise CheckpointError(f"cannot write checkpoint {step} as a full: its parent's chain is damaged "
                                  f"({exc})") from None
        whole = {}
        for name, delta in tables.arrays.items():
            assert isinstance(delta, RowDelta)
            apply_delta(parent.arrays[name], delta, name)
            whole[name] = parent.arrays[name]
        full = TableArrays(whole, None, tables.model_fill)
        return full, self._link(step, full, [])

    @staticmethod
    def _read_link(path: Path) -> tuple[ChainLink | None, str | None]:
        """The chain link and manifest checksum of checkpoint ``path`` from its manifest alone (cheap)."""
        try:
            raw = (path / MANIFEST_FILE).read_bytes()
            manifest = json.loads(raw)
            if verify_manifest(raw, manifest) is not None or "tables" not in manifest:
                return None, None
            return ChainLink.from_json(manifest["tables"], manifest["step"]), manifest[MANIFEST_SHA256]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None, None

    @staticmethod
    def _write_files(
        tmp: Path, step: int, model: memoryview, arrays: dict[str, Any], meta: dict[str, Any],
        link: ChainLink | None = None, deltas: Mapping[str, Any] | None = None,
    ) -> None:
        """Fill the new directory ``tmp``: model, state (and the delta), then manifest; fsync all of it."""
        os.mkdir(tmp)
        write_durably(tmp / MODEL_FILE, model)
        pause_point("model_written")
        with open(tmp / STATE_FILE, "xb") as f:
            write_npz(f, arrays)  # large tables streamed block by block from their snapshot
            f.flush()
            os.fsync(f.fileno())
        files = {MODEL_FILE: file_digest(tmp / MODEL_FILE), STATE_FILE: file_digest(tmp / STATE_FILE)}
        if deltas is not None:
            members = {}
            for n, d in deltas.items():
                members[n + DELTA_ROWS], members[n + DELTA_VALUES] = d.rows, d.values
            with open(tmp / DELTA_FILE, "xb") as f:
                np.savez(f, **members)
                pause_point("delta_written")
                f.flush()
                os.fsync(f.fileno())
            files[DELTA_FILE] = file_digest(tmp / DELTA_FILE)
        manifest = build_manifest(step, meta, files, arrays, link)
        write_durably(tmp / MANIFEST_FILE, encode_manifest(manifest))
        fsync_dir(tmp)

    def discard_after(self, step: int) -> builtins.list[Path]:
        """Delete every checkpoint with a step greater than ``step`` (after a rollback); return them.

        ``latest`` is moved back first, so a crash midway never resurrects a discarded checkpoint.

        Parameters
        ----------
        step
            The last step to keep.
        """
        step = check_step(step)
        with self._writing():
            try:
                scan = self._scan()
                kept = [i for i in scan.committed if i.step <= step]
                dropped = [i for i in scan.committed if i.step > step]
                if dropped:
                    self._write_pointer(kept[-1].path.name if kept else None)
                    self._delete([i.path for i in dropped + scan.uncommitted])
            except OSError as exc:
                raise CheckpointError(f"cannot discard checkpoints after step {step} in {self.root}: {exc}") from exc
        return [i.path for i in dropped]

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Serialize writers: a thread lock, and an exclusive ``flock`` on ``root/.lock``."""
        with self._lock:
            try:
                if not self.root.is_dir():
                    self.root.mkdir(parents=True, exist_ok=True)
                    fsync_dir(self.root.parent)
                fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise CheckpointError(f"cannot open checkpoint directory {self.root}: {exc}") from exc
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _write_pointer(self, name: str | None) -> None:
        text = (name if name is not None else _NO_CHECKPOINT) + "\n"
        atomic_write(self.root / LATEST_FILE, text.encode(), pause="latest_tmp_written")

    def _remove_leftovers(self) -> None:
        """Remove what crashed writers left: ``.tmp-*`` entries and uncommitted directories.

        Only called with the writer lock held, so no other writer is using them.
        """
        stale = [self.root / n for n in os.listdir(self.root) if n.startswith(".tmp-")]
        for path in stale:
            logger.info("removing leftover of an interrupted checkpoint write: %s", path)
            _remove(path)
        uncommitted = self._scan().uncommitted
        for info in uncommitted:
            logger.warning("removing uncommitted checkpoint %s (a writer crashed before updating latest)", info.path)
        self._delete([i.path for i in uncommitted])

    def _apply_retention(self) -> None:
        """Delete all but the newest ``keep`` checkpoints, and never a checkpoint their chains depend on."""
        committed = self._scan().committed
        live = {i.step for i in committed[-self.keep:]}
        by_step = {i.step: i for i in committed}
        for info in committed[-self.keep:]:
            link, _ = self._read_link(info.path)
            while link is not None and link.parent is not None and link.parent in by_step:
                live.add(link.parent)
                link, _ = self._read_link(by_step[link.parent].path)
        old = [i for i in committed if i.step not in live]
        try:
            self._delete([i.path for i in old])
        except OSError as exc:  # the new checkpoint is durable; an old one lingering is harmless
            logger.warning("retention: cannot delete old checkpoints under %s: %s", self.root, exc)

    def _delete(self, paths: list[Path]) -> None:
        """Delete checkpoint directories: rename all to ``.tmp-*`` (atomic), fsync root, then rmtree."""
        if not paths:
            return
        trash = []
        for path in paths:
            target = self.root / tmp_name("discard")
            os.rename(path, target)
            trash.append(target)
            pause_point("retention")
        fsync_dir(self.root)
        for target in trash:
            _remove(target)

    def recover(self) -> Checkpoint | None:
        """The newest valid checkpoint, for a writer about to continue the run; ``None`` if there is none.

        Like :meth:`load_latest`, but with the writer lock held and for a run that will save again:
        every corrupt checkpoint newer than the one returned is logged with the reason and renamed
        aside to ``ckpt-<step>.corrupt`` (``.corrupt.1``, ... if taken), which no reader or save looks
        at again, and ``latest`` is repointed to the checkpoint returned; so a later save of a
        smaller step than the corrupt one is not refused.  Raises :class:`CorruptCheckpointError`
        (renaming nothing) if checkpoints exist but none is valid.
        """
        with self._writing():
            try:
                return self._recover()
            except OSError as exc:
                raise CheckpointError(f"cannot set corrupt checkpoints aside under {self.root}: {exc}") from exc

    def _recover(self) -> Checkpoint | None:
        scan = self._scan()
        if scan.problem:
            logger.warning("%s; using the newest valid checkpoint directory", scan.problem)
        bad: builtins.list[tuple[Path, str]] = []
        found: Checkpoint | None = None
        for info in reversed(scan.committed):
            try:
                found = self._resolve(info.path)
                break
            except CorruptCheckpointError as exc:
                bad.append((info.path, str(exc)))
        if found is None:
            if bad:
                raise CorruptCheckpointError(
                    f"no valid checkpoint under {self.root}: " + "; ".join(reason for _, reason in bad))
            if scan.pointer not in (None, _NO_CHECKPOINT):
                raise CorruptCheckpointError(
                    f"no valid checkpoint under {self.root}: latest names missing {scan.pointer}")
            return None
        # entries with a checkpoint's name that are not directories (a file, a symlink) would block a save too
        limit = found.step
        for name in sorted(os.listdir(self.root)):
            step = parse_dir_name(name)
            path = self.root / name
            if step is not None and step > limit and (path.is_symlink() or not path.is_dir()):
                if all(p != path for p, _ in bad):
                    bad.append((path, f"{path} is {'a symlink' if path.is_symlink() else 'not a directory'}"))
        for path, reason in bad:
            aside = self._aside_name(path.name)
            os.rename(path, aside)
            logger.warning("corrupt checkpoint %s set aside as %s: %s", path.name, aside.name, reason)
        if bad:
            fsync_dir(self.root)
        if scan.pointer != found.path.name:
            self._write_pointer(found.path.name)
            logger.info("latest now names %s, the newest valid checkpoint", found.path.name)
        return found

    def _aside_name(self, name: str) -> Path:
        """``name.corrupt``, or ``name.corrupt.<n>`` with the first free ``n``."""
        candidate = self.root / f"{name}.corrupt"
        n = 0
        while os.path.lexists(candidate):
            n += 1
            candidate = self.root / f"{name}.corrupt.{n}"
        return candidate

    # ----------------------------------------------------------------------------------- reading

    def _read_pointer(self) -> tuple[str | None, str | None]:
        try:
            text = (self.root / LATEST_FILE).read_text(encoding="ascii").strip()
        except FileNotFoundError:  # normal until the first commit (or a crash just before it)
            return None, None
        except (OSError, UnicodeDecodeError) as exc:
            return None, f"{self.root / LATEST_FILE} is unreadable ({exc})"
        if text == _NO_CHECKPOINT or parse_dir_name(text) is not None:
            return text, None
        return None, f"{self.root / LATEST_FILE} holds {text[:40]!r}, expected a checkpoint directory name"

    def _scan(self) -> _Scan:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return _Scan([], [], None, None)
        except OSError as exc:  # not a directory, no permission: say which directory
            raise CheckpointError(f"cannot list checkpoint directory {self.root}: {exc}") from exc
        infos = sorted(
            (CheckpointInfo(step, self.root / n) for n in names if (step := parse_dir_name(n)) is not None),
            key=lambda i: i.step,
        )
        infos = [i for i in infos if i.path.is_dir()]
        pointer, problem = self._read_pointer()
        if pointer is None:  # no usable commit record: every complete directory counts
            return _Scan(infos, [], None, problem if infos else None)
        limit = -1 if pointer == _NO_CHECKPOINT else parse_dir_name(pointer)
        assert limit is not None
        return _Scan(
            [i for i in infos if i.step <= limit], [i for i in infos if i.step > limit], pointer, None
        )

    def list(self) -> builtins.list[CheckpointInfo]:
        """Committed checkpoints, oldest first (directory names only; nothing is verified)."""
        return self._scan().committed

    def list_corrupt(self) -> builtins.list[Path]:
        """Checkpoint directories :meth:`recover` set aside as corrupt (``ckpt-*.corrupt*``), by name."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return [self.root / n for n in sorted(names)
                if ".corrupt" in n and parse_dir_name(n.split(".corrupt", 1)[0]) is not None]

    def load(self, path: StrPath) -> Checkpoint:
        """Read and verify one checkpoint: a directory path, or a directory name under ``root``.

        Raises :class:`CorruptCheckpointError` with the reason if it is incomplete or fails a check.

        Parameters
        ----------
        path
            A checkpoint directory, or its name under ``root``.
        """
        p = Path(path)
        if not p.is_absolute() and len(p.parts) == 1:
            p = self.root / p
        return self._resolve(p)

    @staticmethod
    def _resolve(path: Path) -> Checkpoint:
        """Read and verify checkpoint ``path`` and, for a delta, its whole chain: the full's tables with every
        delta up to this one applied in order.  A damaged or missing link is :class:`CorruptCheckpointError`."""
        head = read_checkpoint(path)
        if head.link is None or head.link.kind == "full":
            return head
        chain = [head]
        while (link := chain[-1].link) is not None and link.kind == "delta":
            assert link.parent is not None
            parent_path = path.parent / dir_name(link.parent)
            try:
                parent = read_checkpoint(parent_path)
            except CorruptCheckpointError as exc:
                raise CorruptCheckpointError(f"{path}: its chain is broken at {parent_path.name}: {exc}") from None
            if parent.manifest.get(MANIFEST_SHA256) != link.parent_manifest_sha256 or parent.link is None \
                    or parent.link.base != link.base:
                raise CorruptCheckpointError(f"{path}: its chain is broken: {parent_path.name} is not the "
                                             "checkpoint it was written after (manifest checksum differs)")
            chain.append(parent)
        full = chain[-1]
        assert full.link is not None
        tables = {name: full.arrays[name] for name in full.link.tables}
        for ckpt in reversed(chain[:-1]):
            for name, delta in ckpt.deltas.items():
                apply_delta(tables[name], delta, name)
        return Checkpoint(path=head.path, step=head.step, manifest=head.manifest, meta=head.meta,
                          arrays={**head.arrays, **tables}, skeleton=head.skeleton, link=head.link)

    def chain_of(self, path: StrPath) -> tuple[Path, tuple[dict[str, RowDelta], ...]]:
        """For chain checkpoint ``path``: its full checkpoint's directory and, oldest first, the rows of each
        delta after it up to ``path`` (each delta verified; the full's tables are not read).

        Parameters
        ----------
        path
            A chain checkpoint's directory, or its name under ``root``.
        """
        p = Path(path)
        if not p.is_absolute() and len(p.parts) == 1:
            p = self.root / p
        deltas: builtins.list[dict[str, RowDelta]] = []
        link, _ = self._read_link(p)
        if link is None:
            raise CorruptCheckpointError(f"checkpoint {p}: not a readable checkpoint of a table chain")
        while link.kind == "delta":
            deltas.append(read_checkpoint(p).deltas)
            assert link.parent is not None
            p = p.parent / dir_name(link.parent)
            link, _ = self._read_link(p)
            if link is None:
                raise CorruptCheckpointError(f"checkpoint {p}: its chain is broken there")
        return p, tuple(reversed(deltas))

    def load_latest(self) -> Checkpoint | None:
        """The newest valid committed checkpoint, or ``None`` if there is none.

        A corrupt one (checksum or size mismatch, missing file, bad manifest, unknown version, pickle)
        is logged as a warning naming the directory and the reason, and the previous one is tried.
        Raises :class:`CorruptCheckpointError` if checkpoints exist but none is valid, rather than
        letting training silently restart from scratch.
        """
        scan = self._scan()
        if scan.problem:
            logger.warning("%s; using the newest valid checkpoint directory", scan.problem)
        for _attempt in range(5):
            # a writer that committed again and retired the pointer's checkpoint since our scan is no damage
            if scan.pointer not in (None, _NO_CHECKPOINT) and not (self.root / scan.pointer).is_dir() \
                    and self._read_pointer()[0] == scan.pointer:
                logger.warning(
                    "latest names %s, which is missing or not a directory; falling back to an older checkpoint",
                    scan.pointer,
                )
            reasons = []
            for info in reversed(scan.committed):
                try:
                    return self._resolve(info.path)
                except CorruptCheckpointError as exc:
                    if not info.path.exists():  # deleted by the writer's retention while we read it
                        logger.debug("checkpoint %s vanished while being read", info.path)
                        continue
                    logger.warning("skipping corrupt checkpoint %s: %s", info.path, exc)
                    reasons.append(str(exc))
            rescan = self._scan()
            if (rescan.pointer, rescan.committed) == (scan.pointer, scan.committed):
                break
            scan = rescan  # a writer committed or deleted meanwhile: look again
        if reasons:
            raise CorruptCheckpointError(f"no valid checkpoint under {self.root}: " + "; ".join(reasons))
        if scan.pointer not in (None, _NO_CHECKPOINT):
            raise CorruptCheckpointError(f"no valid checkpoint under {self.root}: latest names missing {scan.pointer}")
        return None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
