"""Command-line argument types: each turns one argument's text into a checked value, or
raises ``argparse.ArgumentTypeError`` (a one-line usage error, exit code 2) before any
model is opened or any sweep runs.

Numbers are ASCII digits only: ``str.isdigit`` accepts ``²`` and ``int`` accepts ``٣``,
and neither is what a user typing an index meant.
"""

from __future__ import annotations

import argparse
import math
import re

from headscope.engine.core.errors import OutputError
from headscope.engine.core.export import check_output_dir

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range
MAX_OFFSET = 2**24  # a rotary offset beyond this has no float32 angle precision left
MAX_TOP = 1_000_000
MAX_WORKERS = 4096

_INT = re.compile(r"[+-]?[0-9]+")


def _integer(text: str, what: str) -> int:
    stripped = text.strip()
    if not _INT.fullmatch(stripped) or len(stripped) > 4000:  # int() refuses longer ones
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})")
    return int(stripped)


def _bounded(text: str, what: str, low: int, high: int) -> int:
    value = _integer(text, what)
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{what} must be between {low} and {high}, not {value}")
    return value


def count(text: str) -> int:
    """``--top``: how many of something, 0 or more."""
    return _bounded(text, "a count", 0, MAX_TOP)


def index(text: str) -> int:
    """A layer or head index: 0 or more (the model bounds it further)."""
    return _bounded(text, "an index counting from 0", 0, 2**31 - 1)


def seed(text: str) -> int:
    """A random seed: 0 … 2⁶³−1."""
    return _bounded(text, "a seed", 0, MAX_SEED)


def offset(text: str) -> int:
    """A rotary query-key offset Δ (may be negative)."""
    return _bounded(text, "a rotary offset", -MAX_OFFSET, MAX_OFFSET)


def workers(text: str) -> int:
    """``--workers``: 1 or more (the machine bounds it further, saying so)."""
    return _bounded(text, "a number of workers", 1, MAX_WORKERS)


def sessions(text: str) -> int:
    """``serve --max-sessions``: 1 or more."""
    return _bounded(text, "a number of sessions", 1, 1024)


def port(text: str) -> int:
    """A TCP port, 1 … 65535."""
    return _bounded(text, "a TCP port", 1, 65535)


def finite_float(text: str) -> float:
    """A finite number (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def token_spec(text: str) -> str:
    """``--rows``/``--cols``: comma-separated ids (``3,14``), ranges (``0:20``) or token
    strings. Checked here: ranges must be non-empty (``10:2`` is an error, not an empty
    block), ids are ASCII numbers; anything else is a token string, looked up later."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"{text!r} names no rows or columns")
    for item in items:
        parts = [p.strip() for p in item.split(":", 1)]
        if not all(p.lstrip("-").isdigit() for p in parts):
            continue  # a token string (looked up in the vocabulary later)
        if not all(_INT.fullmatch(p) for p in parts):
            # '²', '³', '①': digits to str.isdigit, not numbers to int(): refuse them rather
            # than guess (such a token can be named by its id).
            raise argparse.ArgumentTypeError(
                f"{item!r} is not an ASCII number; give ids and ranges in 0-9 digits"
            )
        if len(parts) == 2:
            start, stop = int(parts[0]), int(parts[1])
            if start < 0 or stop <= start:
                raise argparse.ArgumentTypeError(
                    f"range {item!r} is empty or negative: write START:STOP with 0 <= START < STOP"
                )
    return text


def token_ids(text: str) -> str:
    """``forward --tokens``: comma-separated token ids, ASCII digits (the model bounds them)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} names no token ids")
    for item in items:
        if not (item.isascii() and item.isdigit()):
            raise argparse.ArgumentTypeError(f"{item!r} is not a token id (0-9 digits, e.g. 3,14,15)")
    return text


def output_dir(text: str) -> str:
    """``export --out``: a directory that can take the file, checked before the sweep."""
    try:
        check_output_dir(text)
    except OutputError as err:
        raise argparse.ArgumentTypeError(err.one_line()) from None
    return text


_HEAD = re.compile(r"^[Ll]?(\d+)\.[Hh]?(\d+)$")


def head_ref(text: str) -> tuple[int, int]:
    """``"L0.H1"`` or ``"0.1"`` → ``(0, 1)`` (a malformed value is a usage error)."""
    match = _HEAD.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a head: write L1.H2 or 1.2")
    return int(match.group(1)), int(match.group(2))
