"""Write reports to files, atomically.

A file appears complete or not at all (``core.files.write_atomic``, the one atomic write):
an interrupted export leaves no partial file behind.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from headscope.engine.core.errors import InvalidRequestError, OutputError
from headscope.engine.core.files import file_kind, os_reason, write_atomic

Format = Literal["json", "csv"]


def _umask() -> int:
    """The process umask, read without setting it (``os.umask`` sets it, racing threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def file_mode() -> int:
    """The permissions ``open(path, "w")`` would give a new file (0o644 under umask 022).

    ``tempfile.mkstemp`` creates 0o600 files and safetensors' writer does the same, which
    would leave exports and saved models unreadable to the rest of a shared box's group.
    """
    return 0o666 & ~_umask()


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so that readers never see a partial file (an
    existing file is replaced whole; ``core.files.write_atomic``), readable as ``open(path,
    "w")`` would leave it (``file_mode``). A failure (read-only directory, full disk, ``path``
    a directory) is an ``OutputError`` naming ``path``, and leaves nothing behind."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(path, f"cannot write here: {os_reason(e)}") from None
    try:
        write_atomic(path, text.encode("utf-8"), mode=file_mode())
    except OSError as e:
        raise OutputError(path, f"cannot write: {os_reason(e)}") from None
    return path


def jsonable(obj: Any) -> Any:
    """Results → strict JSON values: dataclasses to dicts, arrays to lists, complex numbers to
    ``[re, im]``, NaN/inf to ``None``; anything else unknown to its ``str``.

    The one conversion the CLI's ``--json``, the exports and the explorer's copy/save use.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if hasattr(obj, "tolist") and not isinstance(obj, str | bytes):  # numpy arrays and scalars
        return jsonable(obj.tolist())
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, complex):
        return [jsonable(obj.real), jsonable(obj.imag)]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    return str(obj)


def check_output_dir(out: str | os.PathLike[str]) -> Path:
    """Refuse an output directory that cannot take a file, before any work is done: a
    regular file or a device (``/dev/null``) in its place, a directory that is not
    writable, a filesystem with no space left, or no directory at all: ``--out`` names an
    existing directory (README, "Command line"), so a typo in it is an error rather than a
    new directory somewhere. Nothing is created."""
    out = Path(out)
    existing = out
    while True:
        try:
            st = existing.stat()
            break
        except FileNotFoundError:
            if existing.parent == existing:
                raise OutputError(out, "no such directory") from None
            existing = existing.parent
        except (OSError, ValueError) as e:
            reason = os_reason(e) if isinstance(e, OSError) else str(e)
            raise OutputError(out, f"cannot use as the output directory: {reason}") from None
    if not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
        where = "" if existing == out else f" ({existing} is {what})"
        raise OutputError(out, f"not a directory{where or f': it is {what}'}; --out names "
                               "the directory to write into")
    if existing != out:
        raise OutputError(out, "no such directory; --out names an existing directory "
                               "(create it first)")
    try:
        free = os.statvfs(existing)
    except OSError as e:
        raise OutputError(out, f"cannot write into {existing}: {os_reason(e)}") from None
    # access() also answers EROFS for a read-only mount (root passes permission bits).
    if free.f_flag & os.ST_RDONLY or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(out, f"cannot write into {existing}: permission denied (or read-only)")
    if free.f_bavail * free.f_frsize == 0:
        raise OutputError(out, f"cannot write into {existing}: no space left on the device")
    return out


def to_json(data: Any) -> str:
    return json.dumps(jsonable(data), indent=1, allow_nan=False) + "\n"


def to_csv(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if v is None else v for v in jsonable(list(row))])
    return buf.getvalue()


def tabulate(what: str, report: Any) -> tuple[list[str], list[list[Any]]]:
    """The CSV form of a report: heads → one row per head; composition → one row per
    head pair (source layer < target layer); circuit → one row per cell."""
    if what == "heads":
        header = list(report[0]) if report else ["layer", "head"]
        return header, [[r[k] for k in header] for r in report]
    if what == "composition":
        header = ["source_layer", "source_head", "target_layer", "target_head", "score", "above_baseline"]
        s, base = report["scores"], report["baseline"]
        rows = [
            [l1, h1, l2, h2, s[l1][h1][l2][h2], s[l1][h1][l2][h2] - base]
            for l1 in range(len(s))
            for h1 in range(len(s[l1]))
            for l2 in range(l1 + 1, len(s))
            for h2 in range(len(s[l1][h1][l2]))
        ]
        return header, rows
    if what == "circuit":
        header = ["row_id", "row_label", "col_id", "col_label", "value"]
        rows = [
            [rid, rl, cid, cl, report["values"][i][j]]
            for i, (rid, rl) in enumerate(zip(report["rows"], report["row_labels"], strict=True))
            for j, (cid, cl) in enumerate(zip(report["cols"], report["col_labels"], strict=True))
        ]
        return header, rows
    raise InvalidRequestError(None, f"cannot export {what!r}: choose heads, composition or circuit")


def export_report(what: str, report: Any, out: str | os.PathLike[str], fmt: Format, stem: str) -> Path:
    """Write ``report`` as ``<out>/<stem>.<fmt>`` atomically and return the path."""
    if fmt == "json":
        text = to_json(report)
    elif fmt == "csv":
        header, rows = tabulate(what, report)
        text = to_csv(rows, header)
    else:
        raise InvalidRequestError(None, f"unknown export format {fmt!r}: choose json or csv")
    return atomic_write_text(Path(out) / f"{stem}.{fmt}", text)
