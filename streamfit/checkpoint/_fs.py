"""Durable file-system primitives: fsynced writes, directory fsync, atomic single-file replace.

A rename is only durable once the directory holding it is fsynced, and a file's bytes only once the
file is; every helper here does both so that a crash leaves either the old or the new content.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Union

from streamfit.exceptions import CheckpointError

__all__ = [
    "publish", "fsync_dir", "write_durably", "atomic_write", "tmp_name", "pause_point",
    "Refused", "NoFollowDir",
]

StrPath = Union[str, "os.PathLike[str]"]

#: Test hook: ``"<point>:<marker file>"`` makes the process write the point name to the marker
#: file and sleep when it reaches that named point, so a test can SIGKILL it exactly there.
PAUSE_ENV = "STREAMFIT_CHECKPOINT_TEST_PAUSE"


def pause_point(point: str) -> None:
    """Pause at ``point`` if the test hook in ``$STREAMFIT_CHECKPOINT_TEST_PAUSE`` asks for it."""
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    name, _, marker = spec.partition(":")
    if name != point:
        return
    Path(marker + ".part").write_text(point)
    os.replace(marker + ".part", marker)  # the test sees the marker only once it is complete
    time.sleep(600)  # the test kills us here


def tmp_name(purpose: str) -> str:
    """Name of a temporary entry: hidden, ``.tmp-`` prefixed, unique per process and call."""
    return f".tmp-{os.getpid()}-{secrets.token_hex(4)}-{purpose}"


def fsync_dir(path: StrPath) -> None:
    """Fsync a directory so that entries created, renamed or removed in it survive a crash."""
    if os.name == "nt":  # directories cannot be opened (nor fsynced) on Windows
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: StrPath, data: bytes | bytearray | memoryview) -> None:
    """Create ``path`` (which must not exist), write ``data`` and fsync the file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path: StrPath, data: bytes | bytearray | memoryview, *, pause: str = "") -> Path:
    """Replace ``path`` with ``data`` atomically: temp file + fsync, ``os.replace``, dir fsync."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    try:
        write_durably(tmp, data)
        if pause:
            pause_point(pause)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def publish(model_bytes: bytes | bytearray | memoryview, path: StrPath) -> Path:
    """Atomically expose ``model_bytes`` at ``path`` (e.g. the latest model for a serving process).

    A reader opening ``path`` sees either the previous complete file or the new one, never a
    partial write; after return the new content survives a crash.  Returns ``path`` as a ``Path``.

    Parameters
    ----------
    model_bytes
        The file's content.
    path
        Where it goes.
    """
    try:
        return atomic_write(path, model_bytes)
    except OSError as exc:
        raise CheckpointError(f"cannot publish model to {os.fspath(path)!r}: {exc}") from exc


class Refused(Exception):
    """An entry a checkpoint reader will not open: a symlink, or not a regular file / directory."""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FD = os.open in os.supports_dir_fd and bool(_NOFOLLOW)


class NoFollowDir:
    """A directory opened for reading without following symlinks, itself or its members.

    Members are opened relative to the directory's descriptor with ``O_NOFOLLOW`` (so a symlink
    swapped in after a check is still refused) and read only if they are regular files; a FIFO or
    device is never opened for blocking reads.  Raises :class:`Refused` with the reason.
    """

    def __init__(self, path: StrPath) -> None:
        self.path = Path(path)
        st = os.lstat(self.path)
        if stat.S_ISLNK(st.st_mode):
            raise Refused("is a symlink (checkpoint directories are never followed)")
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("is not a directory")
        self._fd: int | None = None
        if _DIR_FD:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced by a symlink or a file meanwhile
                    raise Refused("is a symlink or not a directory") from exc
                raise

    def __enter__(self) -> "NoFollowDir":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def names(self) -> list[str]:
        return os.listdir(self._fd if self._fd is not None else self.path)

    def read(self, name: str) -> bytes:
        """The bytes of regular file ``name``; :class:`Refused` for a symlink or a non-regular file."""
        flags = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        if self._fd is not None:
            try:
                fd = os.open(name, flags | os.O_CLOEXEC, dir_fd=self._fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Refused(f"{name} is a symlink; refused (never followed)") from exc
                raise
        else:  # no O_NOFOLLOW / dir_fd (Windows): check, then open
            if os.path.islink(self.path / name):
                raise Refused(f"{name} is a symlink; refused (never followed)")
            fd = os.open(self.path / name, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Refused(f"{name} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as f:
            return f.read()
