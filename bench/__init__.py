"""headscope benchmarks: `python -m bench [--quick|--tiny]` (see bench/README.md)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


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


def rss_mb() -> float:
    """This process's peak resident memory (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def since(t: float) -> float:
    """Seconds since ``time.perf_counter()`` read ``t``."""
    return time.perf_counter() - t


def disk_read_gb() -> float | None:
    """Bytes this process has had read from the storage layer (``/proc/self/io``
    ``read_bytes``: page-cache hits do not count), in GB; None off Linux."""
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["read_bytes"]) / 1e9
    except (OSError, KeyError, ValueError):
        return None


def run_json(args: Sequence[str], timeout: float) -> dict[str, Any]:
    """``python ARGS`` in a fresh process from the checkout's root; its last stdout line as
    JSON, or ``{"error": ...}`` (a timeout, or the last line of stderr)."""
    try:
        done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": ((done.stderr.strip().splitlines() or ["?"])[-1])[:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def round_robin(scenarios: Sequence[str], repeat: int,
                run: Callable[[str], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every scenario ``repeat`` times, in turn (a change in the box's load hits each alike),
    each result echoed to stderr as it comes (without its ``values``)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for scenario in scenarios:
            r = run(scenario)
            runs.setdefault(scenario, []).append(r)
            shown = {k: v for k, v in r.items() if k != "values"}
            print(scenario, json.dumps(shown), file=sys.stderr, flush=True)
    return runs
