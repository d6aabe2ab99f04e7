"""The layout of one checkpoint directory, its manifest, and every check a reader makes.

A checkpoint directory ``ckpt-<step:012d>`` holds ``model.onnx`` (opaque bytes), ``state.npz``
(named numpy arrays, never pickled) and ``manifest.json`` (versions, time, caller ``meta``, and the
SHA-256 and size of the two other files).  The manifest is written in one canonical JSON form and
carries the SHA-256 of that form (``manifest_sha256``), so a change of any byte of it is detected.
Anything that does not match is refused, and symlinks are never followed, so a torn, truncated or
damaged checkpoint is never mistaken for a good one.

A checkpoint of large tables may be one link of a chain (see :mod:`streamfit.checkpoint._chain`): its
manifest then has a ``tables`` section, and a delta also holds ``delta.npz`` (the rows written since its
parent), listed and checksummed in the manifest like the other files.

Format versions: 3 (this one) adds table chains; 2 added the manifest checksum.  Versions 2 and 3 read
alike; version-1 checkpoints (no manifest checksum) are still read, with a warning each time: their
data files are verified against the manifest, but the manifest itself cannot be; the next save writes
the current version.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping, TypeGuard

import numpy as np
from numpy.lib.npyio import NpzFile

from streamfit.checkpoint._chain import DELTA_ROWS, DELTA_VALUES, ArrayBlocks, ChainLink, RowDelta, fill_model
from streamfit.checkpoint._fs import NoFollowDir, Refused
from streamfit.exceptions import CheckpointError, CorruptCheckpointError

__all__ = ["Checkpoint", "FORMAT", "FORMAT_VERSION", "MODEL_FILE", "STATE_FILE", "MANIFEST_FILE", "encode_manifest"]

FORMAT = "streamfit-checkpoint"
FORMAT_VERSION = 3
#: The oldest version still read: version 1 has no manifest checksum (read with a warning).
OLDEST_READ_VERSION = 1
MANIFEST_SHA256 = "manifest_sha256"
MODEL_FILE = "model.onnx"
STATE_FILE = "state.npz"
MANIFEST_FILE = "manifest.json"
DELTA_FILE = "delta.npz"
DATA_FILES = (MODEL_FILE, STATE_FILE)
MAX_STEP = 10**12 - 1  # the directory name has 12 digits
_DIR_RE = re.compile(r"ckpt-([0-9]{12})")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: ``np.savez(file, *args, allow_pickle=..., **arrays)`` would swallow these names.
_RESERVED_ARRAY_NAMES = frozenset({"file", "allow_pickle"})

logger = logging.getLogger("streamfit.checkpoint")


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """One verified checkpoint: every file matched its checksum and no pickle was found.

    From :class:`~streamfit.checkpoint.CheckpointStore` a checkpoint of a chain comes *resolved*:
    ``arrays`` hold the whole tables (the full with every delta up to this one applied) and ``deltas`` is
    empty; ``model_bytes`` fills the skeleton model's tables on first access (not needed to resume).

    Attributes
    ----------
    path, step
        The checkpoint's directory and step.
    manifest, meta
        Its manifest (files, checksums, chain) and the JSON state saved with it.
    arrays
        ``{name: array}``: the state's arrays (whole tables, for a resolved chain checkpoint).
    skeleton
        The model file's bytes as stored (tables left empty in a chain checkpoint).
    link
        Its place in a chain, or None.
    deltas
        A delta's own rows, when read alone.
    """

    path: Path
    step: int
    manifest: dict[str, Any]
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    skeleton: bytes
    link: ChainLink | None = None
    #: this directory's own rows (a delta read alone, before its chain is resolved)
    deltas: dict[str, RowDelta] = field(default_factory=dict)

    @cached_property
    def model_bytes(self) -> bytes:
        """The model file's bytes; for a chain checkpoint, with its tables filled from ``arrays``."""
        if self.link is None or not self.link.model_fill:
            return self.skeleton
        if self.deltas:
            raise CheckpointError(f"{self.path} is a delta checkpoint read alone: load it through its "
                                  "CheckpointStore to resolve its chain")
        return fill_model(self.skeleton, self.link.model_fill, self.arrays)

    def __repr__(self) -> str:
        kind = "" if self.link is None else f", {self.link.kind} of chain {self.link.base}"
        return (
            f"Checkpoint(path={str(self.path)!r}, step={self.step}{kind}, "
            f"model=<{len(self.skeleton)} bytes>, arrays={sorted(self.arrays)})"
        )


def dir_name(step: int) -> str:
    return f"ckpt-{step:012d}"


def parse_dir_name(name: str) -> int | None:
    """The step of a checkpoint directory name, or ``None`` if ``name`` is not one."""
    m = _DIR_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise CheckpointError(f"Invalid checkpoint step: {step!r}, expected an int")
    if not 0 <= int(step) <= MAX_STEP:
        raise CheckpointError(f"Invalid checkpoint step: {step}, expected 0 <= step <= {MAX_STEP}")
    return int(step)


def check_model(model: object) -> memoryview:
    if not isinstance(model, (bytes, bytearray, memoryview)):
        raise CheckpointError(f"model must be bytes (the serialized ONNX model), got {type(model).__name__}")
    try:
        return memoryview(model).cast("B")
    except TypeError as exc:  # a non-contiguous memoryview
        raise CheckpointError(f"model must be contiguous bytes: {exc}") from exc


def check_arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validate the named arrays to store; refuse anything that would need pickle."""
    if not isinstance(arrays, Mapping):
        raise CheckpointError(f"arrays must be a mapping of name -> numpy array, got {type(arrays).__name__}")
    out: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"array name {name!r} is invalid, expected a non-empty str")
        if name in _RESERVED_ARRAY_NAMES:
            raise CheckpointError(f"array name {name!r} is reserved by np.savez, choose another name")
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise CheckpointError(
                f"array {name!r} is {type(value).__name__}, expected a numpy array "
                "(put plain numbers in meta instead)"
            )
        if value.dtype.hasobject:
            raise CheckpointError(
                f"array {name!r} has dtype {value.dtype}, which holds Python objects; "
                "checkpoints refuse pickle, store numeric/bool/str arrays only"
            )
        out[name] = value
    return out


def check_tables(arrays: Mapping[str, Any]) -> dict[str, "np.ndarray | ArrayBlocks"]:
    """:func:`check_arrays` for a full's tables, which may also be :class:`ArrayBlocks` (streamed)."""
    blocks = {k: v for k, v in arrays.items() if isinstance(v, ArrayBlocks)}
    plain = check_arrays({k: v for k, v in arrays.items() if k not in blocks})
    for name in blocks:
        if not isinstance(name, str) or not name or name in _RESERVED_ARRAY_NAMES:
            raise CheckpointError(f"array name {name!r} is invalid or reserved by np.savez")
    return {k: plain[k] if k in plain else blocks[k] for k in arrays}


def write_npz(f: Any, arrays: Mapping[str, "np.ndarray | ArrayBlocks"]) -> None:
    """Write ``arrays`` to the open binary file ``f`` as an uncompressed ``.npz`` (what ``np.savez`` writes,
    read by ``np.load``); an :class:`ArrayBlocks` member is streamed block by block, never held whole."""
    import zipfile

    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as out:
                if not isinstance(value, ArrayBlocks):
                    np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)
                    continue
                header = {"descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": False,
                          "shape": value.shape}
                np.lib.format.write_array_header_1_0(out, header)
                rows = 0
                for block in value.blocks():
                    if block.shape[1:] != value.shape[1:] or block.dtype != value.dtype:
                        raise CheckpointError(f"array {name!r}: a block of {block.dtype} {block.shape} in an "
                                              f"array of {value.dtype} {value.shape}")
                    out.write(np.ascontiguousarray(block).reshape(-1).view(np.uint8).data)
                    rows += block.shape[0]
                if rows != value.shape[0]:
                    raise CheckpointError(f"array {name!r}: its blocks held {rows} rows, expected {value.shape[0]}")


def json_copy(value: Any, where: str = "meta") -> Any:
    """A plain dict/list copy of ``value``; refuse what JSON would reject or silently change.

    Mappings become dicts and tuples lists; non-str keys and non-JSON values (numpy scalars,
    sets, objects) raise :class:`CheckpointError` naming where they are.  NaN/inf are kept
    (Python's ``json`` round-trips them) so a diverged metric never blocks a save.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointError(
                    f"{where} has key {key!r} of type {type(key).__name__}, expected str "
                    "(JSON would turn it into a string)"
                )
            out[key] = json_copy(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [json_copy(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise CheckpointError(
        f"{where} is {type(value).__name__} ({value!r:.60}), expected a JSON value "
        "(str, int, float, bool, None, list, or dict with str keys)"
    )


def array_entry(arr: "np.ndarray | ArrayBlocks") -> dict[str, Any]:
    """The manifest's description of one array: JSON-normalized dtype descr and shape."""
    descr = json.loads(json.dumps(np.lib.format.dtype_to_descr(arr.dtype)))
    return {"dtype": descr, "shape": list(arr.shape)}


def streamfit_version() -> str:
    pkg = sys.modules.get("streamfit")
    version = getattr(pkg, "__version__", None)
    return version if isinstance(version, str) else "0.0.0"


def build_manifest(
    step: int,
    meta: Mapping[str, Any],
    files: Mapping[str, Mapping[str, Any]],
    arrays: Mapping[str, "np.ndarray | ArrayBlocks"],
    link: ChainLink | None = None,
) -> dict[str, Any]:
    extra = {} if link is None else {"tables": link.to_json()}
    return {
        **extra,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "streamfit_version": streamfit_version(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
        "step": step,
        "files": {name: dict(entry) for name, entry in files.items()},
        "arrays": {name: array_entry(arr) for name, arr in arrays.items()},
        "meta": dict(meta),
    }


def _canonical(manifest: Mapping[str, Any]) -> bytes:
    """The one byte form of a manifest: sorted keys, one-space indent, ASCII only, a final newline."""
    return json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=True).encode("ascii") + b"\n"


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """``manifest`` with its checksum added, as the bytes of ``manifest.json``.

    The checksum is the SHA-256 of the canonical bytes of everything else; a reader re-encodes what it
    parsed, so a change that leaves the parsed content intact (spacing, key order, escapes) is caught too.

    >>> raw = encode_manifest({"step": 1, "meta": {"rows": 8}})
    >>> verify_manifest(raw, json.loads(raw)) is None
    True
    >>> changed = raw.replace(b'"rows": 8', b'"rows": 9')
    >>> verify_manifest(changed, json.loads(changed))
    'manifest.json fails its SHA-256 check (its content changed after it was written)'
    """
    body = {k: v for k, v in manifest.items() if k != MANIFEST_SHA256}
    return _canonical({**body, MANIFEST_SHA256: hashlib.sha256(_canonical(body)).hexdigest()})


def verify_manifest(raw: bytes, manifest: Any) -> str | None:
    """Why the bytes ``raw`` (parsed into ``manifest``) fail the manifest checksum, or ``None``."""
    if not isinstance(manifest, dict):
        return None  # the structural check names this
    want = manifest.get(MANIFEST_SHA256)
    if not isinstance(want, str) or not _SHA256_RE.fullmatch(want):
        return f"manifest.json has {MANIFEST_SHA256} {want!r:.80}, expected 64 hex digits"
    body = {k: v for k, v in manifest.items() if k != MANIFEST_SHA256}
    try:
        body_bytes, full_bytes = _canonical(body), _canonical(manifest)
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. a lone surrogate cannot be re-encoded
        return f"manifest.json cannot be re-encoded for its checksum ({exc})"
    if hashlib.sha256(body_bytes).hexdigest() != want:
        return "manifest.json fails its SHA-256 check (its content changed after it was written)"
    if full_bytes != raw:
        return "manifest.json is not in its canonical form (its bytes changed after it was written)"
    return None


def file_digest(path: Path) -> dict[str, Any]:
    """SHA-256 and size of a file, read back from disk in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):  # big reads: few GIL round trips while training runs
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "size": size}


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_manifest(manifest: Any, path: Path) -> str | None:
    """Reason why ``manifest`` is not a usable manifest (its structure), or ``None``."""
    if not isinstance(manifest, dict):
        return f"manifest.json holds a {type(manifest).__name__}, expected an object"
    if manifest.get("format") != FORMAT:
        return f"manifest.json has format {manifest.get('format')!r}, expected {FORMAT!r}"
    version = manifest.get("format_version")
    if not _is_int(version):
        return f"manifest.json has format_version {version!r}, expected an int"
    if version > FORMAT_VERSION:
        return (
            f"unknown format version {version}: written by a newer streamfit "
            f"({manifest.get('streamfit_version')}), this one reads version {FORMAT_VERSION}"
        )
    if version < OLDEST_READ_VERSION:
        return f"unknown format version {version}, expected {OLDEST_READ_VERSION}..{FORMAT_VERSION}"
    if version >= 2 and MANIFEST_SHA256 not in manifest:
        return f"manifest.json of format version {version} has no {MANIFEST_SHA256}"
    step = manifest.get("step")
    if not _is_int(step) or step < 0:
        return f"manifest.json has step {step!r}, expected an int >= 0"
    dir_step = parse_dir_name(path.name)
    if dir_step is not None and dir_step != step:
        return f"manifest.json says step {step} but the directory name says {dir_step}"
    if not isinstance(manifest.get("meta"), dict):
        return "manifest.json has no 'meta' object"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "manifest.json has no 'files' object"
    link = None
    if "tables" in manifest:
        if version < 3:
            return f"manifest.json of format version {version} has a 'tables' section (version 3 and later)"
        try:
            link = ChainLink.from_json(manifest["tables"], step)
        except ValueError as exc:
            return f"manifest.json: {exc}"
    expected = data_files(link)
    for name in files:
        if name not in expected:
            return f"manifest.json lists unexpected file {name!r} (a checkpoint holds only {', '.join(expected)})"
    for name in expected:
        entry = files.get(name)
        if entry is None:
            return f"manifest.json does not list {name}"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not _SHA256_RE.fullmatch(entry["sha256"])
            or not _is_int(entry.get("size"))
            or entry["size"] < 0
        ):
            return f"manifest.json entry for {name} is {entry!r}, expected {{'sha256': <64 hex>, 'size': <int>}}"
    arrays = manifest.get("arrays")
    if not isinstance(arrays, dict) or not all(
        isinstance(e, dict) and "dtype" in e and isinstance(e.get("shape"), list) for e in arrays.values()
    ):
        return "manifest.json has no valid 'arrays' object"
    return None


def data_files(link: ChainLink | None) -> tuple[str, ...]:
    """The data files a checkpoint holds besides its manifest."""
    return DATA_FILES + ((DELTA_FILE,) if link is not None and link.kind == "delta" else ())


def delta_listing(link: ChainLink) -> dict[str, Any]:
    """What ``delta.npz`` of a delta ``link`` must hold: per table its rows and their values."""
    out = {}
    for name, entry in link.tables.items():
        n = link.rows.get(name, 0)
        out[name + DELTA_ROWS] = {"dtype": "<i8", "shape": [n]}
        out[name + DELTA_VALUES] = {"dtype": entry["dtype"], "shape": [n, *entry["shape"][1:]]}
    return out


def _load_state(blob: bytes, listing: Mapping[str, Any], what: str = STATE_FILE
                ) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """Parse ``state.npz`` (or ``delta.npz``) bytes without pickle; return (arrays, None) or (None, reason)."""
    try:
        npz = np.load(io.BytesIO(blob), allow_pickle=False)
    except Exception as exc:  # ValueError for pickle, BadZipFile, EOFError...
        return None, f"{what} is not a readable .npz archive ({exc})"
    if not isinstance(npz, NpzFile):
        return None, f"{what} is a single .npy array, expected an .npz archive"
    arrays: dict[str, np.ndarray] = {}
    with npz:
        for key in npz.files:
            try:
                value = npz[key]
            except ValueError as exc:
                if "allow_pickle" in str(exc):
                    return None, f"{what} member {key!r} is a pickled object array; pickle is refused"
                return None, f"{what} member {key!r} is unreadable ({exc})"
            except Exception as exc:
                return None, f"{what} member {key!r} is unreadable ({exc})"
            if not isinstance(value, np.ndarray):
                return None, f"{what} member {key!r} is not a .npy array; refused"
            if value.dtype.hasobject:
                return None, f"{what} member {key!r} has object dtype; pickle is refused"
            arrays[key] = value
    if set(arrays) != set(listing):
        return None, (
            f"{what} holds arrays {sorted(arrays)} but manifest.json lists {sorted(listing)}"
        )
    for key, arr in arrays.items():
        got = array_entry(arr)
        want = {"dtype": listing[key].get("dtype"), "shape": listing[key].get("shape")}
        if got != want:
            return None, f"{what} array {key!r} is {got}, manifest.json says {want}"
    return arrays, None


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and fully verify the checkpoint directory at ``path``.

    Raises :class:`CorruptCheckpointError` naming the directory and the reason when the checkpoint
    is incomplete, fails a check, holds forbidden content or a symlink (never followed);
    :class:`CheckpointError` on other I/O errors (permissions, EIO), which say nothing about the
    checkpoint itself.
    """

    def corrupt(reason: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint {os.fspath(path)}: {reason}")

    files = _read_files(path, corrupt)
    manifest, link = files.manifest, files.link
    arrays, reason = _load_state(files.blobs[STATE_FILE], manifest["arrays"])
    if arrays is None:
        raise corrupt(reason or "unreadable state")
    deltas = _read_link(link, arrays, files.blobs, corrupt) if link is not None else {}
    if files.legacy:
        logger.warning(
            "checkpoint %s has format version %d, whose manifest has no checksum: its data files are verified, "
            "its manifest (counters, source position) cannot be; the next checkpoint is written in version %d",
            path, manifest["format_version"], FORMAT_VERSION,
        )
    return Checkpoint(
        path=path,
        step=manifest["step"],
        manifest=manifest,
        meta=manifest["meta"],
        arrays=arrays,
        skeleton=files.blobs[MODEL_FILE],
        link=link,
        deltas=deltas,
    )


@dataclass(frozen=True)
class _Files:
    """A checkpoint directory as read: its manifest (verified), its chain link, its data files (checked)."""

    manifest: dict[str, Any]
    legacy: bool  # a format version whose manifest has no checksum
    link: ChainLink | None
    blobs: dict[str, bytes]


def _read_files(path: Path, corrupt: Callable[[str], CorruptCheckpointError]) -> _Files:
    """The manifest (valid JSON, its checksum and fields checked) and every data file it lists, each of its
    size and SHA-256; nothing else in the directory, no symlink followed."""
    try:
        try:
            directory = NoFollowDir(path)
        except FileNotFoundError:
            raise corrupt("does not exist") from None
        with directory:
            names = directory.names()
            try:
                raw = directory.read(MANIFEST_FILE)
            except FileNotFoundError:
                raise corrupt(f"{MANIFEST_FILE} is missing") from None
            try:
                manifest = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise corrupt(f"{MANIFEST_FILE} is not valid JSON ({exc})") from None
            legacy = isinstance(manifest, dict) and MANIFEST_SHA256 not in manifest
            reason = None if legacy else verify_manifest(raw, manifest)
            reason = reason or _check_manifest(manifest, path)
            if reason:
                raise corrupt(reason)
            link = ChainLink.from_json(manifest["tables"], manifest["step"]) if "tables" in manifest else None
            expected = data_files(link)
            extra = sorted(set(names) - {MANIFEST_FILE, *expected})
            if extra:
                raise corrupt(f"unexpected file {extra[0]!r} in the directory")
            blobs: dict[str, bytes] = {}
            for name in expected:
                want = manifest["files"][name]
                try:
                    blob = directory.read(name)
                except FileNotFoundError:
                    raise corrupt(f"{name} is missing") from None
                if len(blob) != want["size"]:
                    raise corrupt(f"{name} is {len(blob)} bytes, manifest.json says {want['size']} (truncated?)")
                digest = hashlib.sha256(blob).hexdigest()
                if digest != want["sha256"]:
                    raise corrupt(
                        f"{name} fails its SHA-256 check (got {digest[:12]}..., expected {want['sha256'][:12]}...)"
                    )
                blobs[name] = blob
    except Refused as exc:
        raise corrupt(str(exc)) from None
    except FileNotFoundError as exc:  # the directory vanished while being read
        raise corrupt(f"{exc.filename or 'a file'} is missing") from exc
    except OSError as exc:
        raise CheckpointError(f"checkpoint {os.fspath(path)}: cannot read: {exc}") from exc
    return _Files(manifest, legacy, link, blobs)


def _read_link(link: ChainLink, arrays: Mapping[str, Any], blobs: Mapping[str, bytes],
               corrupt: Callable[[str], CorruptCheckpointError]) -> dict[str, RowDelta]:
    """A chain checkpoint's tables: a full's are in the state (checked there), a delta's rows are read."""
    deltas: dict[str, RowDelta] = {}
    if link.kind == "full":
        for name, entry in link.tables.items():
            if name not in arrays or array_entry(arrays[name]) != {"dtype": entry["dtype"], "shape": entry["shape"]}:
                raise corrupt(f"table {name!r} of the full checkpoint is missing from {STATE_FILE} or not {entry}")
        return deltas
    held, reason = _load_state(blobs[DELTA_FILE], delta_listing(link), DELTA_FILE)
    if held is None:
        raise corrupt(reason or f"unreadable {DELTA_FILE}")
    for name, entry in link.tables.items():
        rows = held[name + DELTA_ROWS]
        if rows.size and (rows[0] < 0 or rows[-1] >= entry["shape"][0] or np.any(np.diff(rows) <= 0)):
            raise corrupt(f"{DELTA_FILE} rows of {name!r} are not sorted distinct rows of {entry['shape'][0]}")
        deltas[name] = RowDelta(tuple(entry["shape"]), rows, held[name + DELTA_VALUES])
    return deltas
