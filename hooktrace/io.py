"""The bytes of hooktrace: atomic file writes, and trace files (SPEC §4) read and written.

Nothing else in hooktrace opens a file for writing or encodes a trace.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import IO, Callable, Union

Writer = Callable[[IO[bytes]], object]


def write_atomic(path: Union[str, os.PathLike[str]], data: Union[bytes, str, Writer]) -> None:
    """Write `data` (bytes, str as UTF-8, or a function that writes to a binary file) to `path`
    atomically: a temporary file in the same folder, flushed to disk, then renamed over `path`.

    On any failure (an exception from the writer, a full disk, a file-size limit) the temporary
    file is removed and whatever was at `path` before is untouched. An existing file keeps its
    permission bits; a new one gets the usual ones (0o666 less the umask). A symlink at `path` is
    followed (its target is replaced, the link stays). Paths that are not regular files
    (`/dev/stdout`, a FIFO) are written to directly: they cannot be replaced.
    """
    target = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        mode = None
    else:
        if not stat.S_ISREG(st.st_mode):
            with open(target, "wb") as fh:
                _write(fh, data)
            return
        mode = stat.S_IMODE(st.st_mode)
    folder, name = os.path.split(target)
    tmp, fd = _create_temp(folder, name)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write(fh, data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _write(fh: IO[bytes], data: Union[bytes, str, Writer]) -> None:
    if isinstance(data, str):
        fh.write(data.encode("utf-8"))
    elif isinstance(data, (bytes, bytearray, memoryview)):
        fh.write(data)
    else:
        data(fh)


def _create_temp(folder: str, name: str) -> tuple[str, int]:
    """A new file `.NAME.XXXXXXXX.tmp` beside the target, created with the umask's permissions."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(folder or ".", f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {folder or '.'}")


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable (POSIX); best effort."""
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
