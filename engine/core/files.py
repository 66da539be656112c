"""Reading the small files around a checkpoint (config.json, the shard index,
``headscope.json``, tokenizer files) without hanging or exhausting memory.

Every JSON or text file the loader reads goes through ``read_bytes``: only regular files are
read (a FIFO would block forever, a symlink to ``/dev/zero`` would never end), and at most
``limit`` bytes of them. ``loads_json`` refuses duplicate keys (which value wins is
ambiguous) and JSON that nests far more objects and arrays than such a file has: Python
objects cost ~30× the bytes of ``[{},{},...]``, so that input is refused before parsing.

Failures are the caller's typed error (``ConfigError``, ``CorruptFileError``, ...) naming
the file, one line.

Every file headscope writes whole (results-store parts, exports, saved models) goes through
``write_atomic`` (``atomic_file`` for a writer that wants a path): a temporary file in the
target's directory, flushed, fsynced and renamed over the target (``os.replace`` is atomic on
POSIX within a filesystem), so a reader sees the old file or the new one, never half of one,
and an interrupted write leaves no partial file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import HeadscopeError

ErrorType = type[HeadscopeError]

# Every temporary file ``write_atomic`` creates starts with this (the results store removes
# its own leftovers by it).
TMP_PREFIX = ".tmp-"

# A JSON file describing a model holds at most one object or array per this many bytes (a
# safetensors header entry is >= 50 bytes for its three containers; configs are sparser).
MIN_BYTES_PER_CONTAINER = 16
# A config or index JSON file (config.json, headscope.json, tokenizer_config.json, the shard
# index) is KBs: refuse absurd ones.
MAX_CONFIG_BYTES = 16_000_000
_SLACK_CONTAINERS = 1024


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def os_reason(err: OSError) -> str:
    """A short reason for an ``OSError`` (``permission denied``, ``no space left``...)."""
    if isinstance(err, PermissionError):
        return "permission denied"
    if err.errno == errno.ENOSPC:
        return "no space left on the device"
    return (err.strerror or type(err).__name__).lower()


def open_regular(path: str | os.PathLike[str], error: ErrorType, what: str) -> int:
    """An O_RDONLY descriptor of ``path``, refused unless it is a regular file.

    The file is opened with ``O_NONBLOCK``, so a FIFO cannot block the open, and checked
    with ``fstat`` on the descriptor (a symlink to a device is caught too).
    """
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise error(path, f"{what} is {file_kind(before.st_mode)}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise error(path, f"cannot read {what}: {os_reason(e)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # swapped between stat and open
        os.close(fd)
        raise error(path, f"{what} is {file_kind(mode)}, not a regular file")
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int, error: ErrorType, what: str) -> bytes:
    """All bytes of the regular file ``path``, refusing more than ``limit`` of them."""
    fd = open_regular(path, error, what)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as e:
        raise error(path, f"cannot read {what}: {os_reason(e)}") from None
    finally:
        os.close(fd)
    if got > limit:
        raise error(path, f"{what} is over the {limit:,}-byte limit")
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], limit: int, error: ErrorType, what: str) -> str:
    """``read_bytes`` decoded as UTF-8."""
    raw = read_bytes(path, limit, error, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(path, f"cannot read {what}: not UTF-8 ({e.reason} at byte {e.start})") from None


def check_nesting(raw: str | bytes, path: str | os.PathLike[str] | None, error: ErrorType,
                  what: str) -> None:
    """Refuse JSON with far more objects/arrays than bytes allow (before parsing it)."""
    if isinstance(raw, str):
        containers = raw.count("{") + raw.count("[")
    else:
        containers = raw.count(b"{") + raw.count(b"[")
    if containers * MIN_BYTES_PER_CONTAINER > len(raw) + _SLACK_CONTAINERS * MIN_BYTES_PER_CONTAINER:
        raise error(
            path,
            f"{what} nests {containers:,} JSON objects/arrays in {len(raw):,} bytes, far more "
            f"than a {what} holds: refusing to parse it",
        )


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` that refuses a key given twice (``ValueError``):
    which value would win is ambiguous."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def loads_json(raw: str | bytes, path: str | os.PathLike[str] | None, error: ErrorType,
               what: str) -> Any:
    """``json.loads`` with duplicate keys refused and the nesting bound checked first."""
    check_nesting(raw, path, error, what)
    try:
        return json.loads(raw, object_pairs_hook=no_duplicate_keys)
    except (ValueError, RecursionError) as e:
        message = str(e) or type(e).__name__
        raise error(path, f"{what} is not valid JSON: {message[:160]}") from None


def read_json_object(path: Path, limit: int, error: ErrorType, what: str) -> dict[str, Any]:
    """A JSON file that must hold one object."""
    obj = loads_json(read_bytes(path, limit, error, what), path, error, what)
    if not isinstance(obj, dict):
        raise error(path, f"{what} is not a JSON object")
    return obj


@contextlib.contextmanager
def atomic_file(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary file beside ``path`` to write (by its path), renamed over ``path`` when the
    block ends: given ``mode`` (None: ``tempfile.mkstemp``'s owner-only 0o600), fsynced, then
    ``os.replace``d, so readers see the old file or the new one, never half of one. On any
    failure the temporary file is removed and the error propagates unchanged (an ``OSError``
    for the caller to name)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.", suffix=".tmp")
    try:
        os.close(fd)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)  # the writer's data, whoever wrote it
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically (``atomic_file``)."""
    with atomic_file(path, mode) as tmp, open(tmp, "wb") as f:
        f.write(data)
