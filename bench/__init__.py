"""headscope benchmarks: `python -m bench [--quick|--tiny]` (see bench/README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def ratio(a: Any, b: Any, digits: int = 2) -> str:
    """``a / b`` as ``"1.23×"``, or ``–`` where either is missing or ``b`` is not positive."""
    ok = isinstance(a, int | float) and isinstance(b, int | float) and b > 0
    return f"{a / b:.{digits}f}×" if ok else "–"


def publish(text: str, out: Path | None) -> int:
    """A bench's last step: its markdown on stdout, and in ``out`` if given; exit code 0."""
    print(text)
    if out:
        out.write_text(text)
    return 0
