"""The bytes of hooktrace: trace documents (docs/format.md) to and from JSON files, bounded gzip, and
atomic file writes; version 2's column layout is `io.columns`.

Nothing else in hooktrace encodes or decodes a trace or replaces a file. This package knows the
layout, not the fields' meaning: `validate` checks the values and builds the objects.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import os
import re
import secrets
import stat
import zlib
from typing import IO, Any, Callable, Iterator, Sequence, Union

import orjson

Writer = Callable[[IO[bytes]], object]
PathLike = Union[str, "os.PathLike[str]"]

GZIP_MAGIC = b"\x1f\x8b"
GZIP_LEVEL = 1  # `save("x.json.gz")`: the fastest level; trace JSON compresses well even so
# A `.json.gz` may inflate to at most max(INFLATE_FLOOR, INFLATE_RATIO x its own size), and never
# past INFLATE_CAP: far above what real traces compress by, far below a gzip bomb (benchmarks/README.md).
INFLATE_FLOOR = 64 << 20
INFLATE_RATIO = 100
INFLATE_CAP = 2 << 30
# A trace file, plain or compressed, is read only up to this size (far above a million events).
READ_CAP = INFLATE_CAP
_READ_CHUNK = 1 << 20
SHORT = 60  # characters of a value from a file echoed in an error message


class TraceFormatError(ValueError):
    """A file or dict that is not a hooktrace trace of a version this code reads."""


def short(value: Any) -> str:
    """`repr(value)` cut to SHORT characters, for error messages that echo what a file holds."""
    if isinstance(value, (str, bytes)) and len(value) > SHORT:
        value = value[:SHORT]
        return repr(value) + "..."
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= SHORT else text[:SHORT] + "..."


# -- JSON --------------------------------------------------------------------------------------------------
# A lone surrogate (a str from user code may hold "\ud800"; UTF-8 cannot) is written as its JSON
# escape and read back as the same code point. orjson does neither: the standard library does both.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def dumps(data: Any, newline: bool = False) -> bytes:
    """Compact JSON bytes (orjson), with a newline at the end if asked (no copy of the bytes). A
    string holding a lone surrogate gets its `\\uXXXX` escape (see `loads`)."""
    try:
        return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE if newline else None)
    except orjson.JSONEncodeError:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        if not _SURROGATE.search(text):
            raise
        escaped = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
        return (escaped + "\n" if newline else escaped).encode("utf-8")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(raw: Union[bytes, bytearray, memoryview, str]) -> Any:
    """JSON from bytes; a repeated key keeps its last value, whatever the document's size. A
    `\\uXXXX` escape of a lone surrogate (what `dumps` writes for one) reads back as that code
    point; orjson.JSONDecodeError for anything that is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        error = exc
    try:  # UTF-8 only, as orjson reads it
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
        if _SURROGATE_ESCAPE.search(text):
            return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        pass
    raise error


_NOT_REGULAR = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def _too_large(name: str, limit: int) -> TraceFormatError:
    return TraceFormatError(
        f"{name} is larger than {limit >> 20} MiB, more than a trace file hooktrace reads"
    )


def _check_regular(name: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        what = next((words for test, words in _NOT_REGULAR if test(mode)), "not a regular file")
        raise TraceFormatError(f"{name} is {what}, not a regular file")


def read_bytes(path: PathLike, limit: int = READ_CAP) -> Union[bytes, bytearray]:
    """The bytes of a regular file of at most `limit` bytes. TraceFormatError for anything else: a
    FIFO, a device (`/dev/zero`), a folder, a socket (opened without blocking, never read), or a
    larger file (refused by its size, or after `limit` bytes if it grows while being read)."""
    name = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    _check_regular(name, os.stat(name).st_mode)  # a socket cannot even be opened
    fd = os.open(name, flags)  # a FIFO without a writer would block a plain open()
    try:
        st = os.fstat(fd)
        _check_regular(name, st.st_mode)  # what was opened, whatever the path now names
        if st.st_size > limit:
            raise _too_large(name, limit)
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw: Union[bytes, bytearray] = fh.read(st.st_size + 1)  # read(n) allocates n bytes
            if len(raw) > st.st_size:  # it grows while being read: on, a chunk at a time
                raw = bytearray(raw)
                while len(raw) <= limit:
                    chunk = fh.read(min(_READ_CHUNK, limit + 1 - len(raw)))
                    if not chunk:
                        break
                    raw += chunk
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise _too_large(name, limit)
    return raw


def read_json(path: PathLike) -> Any:
    """The JSON document in a file, plain or gzip-compressed (recognised by content, not name)."""
    name = os.fspath(path)
    raw: Union[bytes, bytearray] = read_bytes(name)
    if raw[:2] == GZIP_MAGIC:
        raw = inflate(raw, name)
    try:
        return loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"{name} is not valid JSON: {exc}") from None


def inflate(raw: Union[bytes, bytearray], name: str = "input") -> bytearray:
    """gzip `raw`, inflated a chunk at a time and refused (TraceFormatError) past the bound above,
    so a gzip bomb costs no more memory than the bound."""
    bound = min(INFLATE_CAP, max(INFLATE_FLOOR, INFLATE_RATIO * len(raw)))
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw), mode="rb") as fh:
            while True:
                chunk = fh.read(_READ_CHUNK)
                if not chunk:
                    return out
                out += chunk
                if len(out) > bound:
                    raise TraceFormatError(
                        f"{name} inflates to more than {bound >> 20} MiB from {len(raw):,} compressed bytes; "
                        "hooktrace refuses it as a likely gzip bomb (a real trace compresses at most "
                        f"{INFLATE_RATIO}x): check where the file came from"
                    )
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{name} is not a readable gzip file: {exc}") from None


def is_gzip_name(path: PathLike) -> bool:
    """A name ending in `.gz`, in any case (`X.JSON.GZ`, `run.svg.gz`): what hooktrace writes compressed."""
    return os.fspath(path).lower().endswith(".gz")


def write_output(path: PathLike, data: Union[bytes, str]) -> None:
    """A rendering (str as UTF-8, or bytes) written atomically; gzip-compressed when `is_gzip_name`."""
    write_json(path, [data.encode("utf-8") if isinstance(data, str) else data])


def write_json(path: PathLike, chunks: Sequence[bytes]) -> None:
    """JSON bytes given in chunks (`dumps` and `columns_json` make them), atomically; gzip-compressed
    when `is_gzip_name`. The chunks are written one after the other, never joined."""
    if not is_gzip_name(path):
        write_atomic(path, lambda fh: fh.writelines(chunks))
        return

    def packed(fh: IO[bytes]) -> None:
        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=GZIP_LEVEL, mtime=0) as out:
            out.writelines(chunks)

    write_atomic(path, packed)


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
    tmp, fd = _create_temp(folder)
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


def _create_temp(folder: str) -> tuple[str, int]:
    """A new file `.hooktrace-XXXXXXXXXXXXXXXX.tmp` beside the target (its name's length fixed: a
    target name of the longest legal length, 255 bytes, still works), with the umask's permissions."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(folder or ".", f".hooktrace-{secrets.token_hex(8)}.tmp")
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


# -- memory ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def gc_paused(long_lived: bool = False) -> Iterator[None]:
    """Pause the cyclic GC: building or reading millions of small acyclic containers otherwise makes
    it rescan the whole heap again and again.

    `long_lived`: what the block made lives on (a loaded trace). When that is over 50,000 containers
    they go straight to the oldest generation (gc.freeze + gc.unfreeze: two list splices), sparing
    them two young-generation passes; not when the process froze objects itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if long_lived and gc.get_count()[0] > 50_000 and not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def write_error_words(exc: OSError, path: PathLike, absolute: bool = True) -> str:
    """Why a write failed, in words, with what to do (the CLI's and the rank workers' `cannot write`);
    a missing folder named by its absolute path (rank workers), or as `path` names it (the CLI)."""
    import errno

    text = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(text) if absolute else text) or "."
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOENT and not os.path.isdir(folder):
        return f"{reason} (the folder {folder} does not exist; create it first)"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{reason}; free some space or write elsewhere (nothing was overwritten)"
    if exc.errno == errno.EFBIG:
        return f"{reason} (a file-size limit, see ulimit -f); nothing was overwritten"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{reason}; choose a path you can write to"
    return f"{reason} (errno {exc.errno})" if exc.errno else reason
