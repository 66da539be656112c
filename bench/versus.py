"""``python -m bench.versus --base DIR``: this checkout against another one, in the same run.

For a change that must not move a number or slow anything down (a refactor), this runs the
same whole-process commands with both checkouts, alternating before and after on the same
checkpoints, and reports after / before for time and peak RSS, plus the largest difference
between the numbers the two print. ``DIR`` is another checkout of headscope (e.g. a
``git worktree`` of the commit before the change) with its own ``.venv`` (``make test``
there, or a venv with the package installed editable).

    python -m bench.versus --base ../base                       # gpt2-small + the bundled models
    python -m bench.versus --base ../base --shapes tiny-gpt2 --repeat 1   # what the smoke test runs

Scenarios (each a fresh process, so imports are cold as for a user):
- the CLI: ``info``, ``heads --no-behaviour``, ``heads``, ``composition --kind k``, ``circuit``
  on each checkpoint, ``--no-cache`` (the results store would turn the second run into a read);
- ``bench.run_one headscope view|copying|composition`` (the Engine: first view, sweeps).

Times are the minimum over ``--repeat`` runs of each (the least disturbed by other load).
A ratio > 1 is slower / larger after the change. Numbers are compared leaf by leaf in the
JSON the CLI prints (after the change must equal before to ``--tolerance``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoints import SHAPES, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ("attn-only-2l", "gpt2-mini")


@dataclass
class Side:
    name: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    @property
    def cli(self) -> Path:
        return self.root / ".venv" / "bin" / "headscope"


@dataclass
class Measure:
    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    output: str | None = None
    error: str | None = None


def run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> tuple[float, float, str, str, int]:
    """Wall time, peak RSS (MB) of the child, stdout, stderr, exit code."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, env=env)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            raise
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (seconds, usage.ru_maxrss / 1024, out.read().decode(errors="replace"),
                err.read().decode(errors="replace"), proc.returncode)


def numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON value, by its path."""
    found: dict[str, float] = {}
    if isinstance(value, bool) or value is None:
        return found
    if isinstance(value, int | float):
        found[prefix] = float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            found.update(numbers(item, f"{prefix}.{key}"))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.update(numbers(item, f"{prefix}[{i}]"))
    return found


def largest_difference(before: str, after: str) -> tuple[float, str]:
    """The largest |after − before| over the numbers both print (NaN = NaN), and where."""
    a, b = numbers(json.loads(before)), numbers(json.loads(after))
    if a.keys() != b.keys():
        missing = sorted(a.keys() ^ b.keys())[:3]
        return math.inf, f"different keys: {missing}"
    worst, where = 0.0, ""
    for key, x in a.items():
        y = b[key]
        if math.isnan(x) and math.isnan(y):
            continue
        diff = abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf
        if diff > worst:
            worst, where = diff, key
    return worst, where


def scenarios(paths: list[Path], engine: bool) -> list[tuple[str, list[str], bool]]:
    """(label, arguments after the program, whether the output is JSON to compare)."""
    out: list[tuple[str, list[str], bool]] = []
    for path in paths:
        p = str(path)
        out += [
            (f"info {path.name}", ["cli", "info", p, "--json"], True),
            (f"heads --no-behaviour {path.name}", ["cli", "heads", p, "--no-behaviour", "--no-cache", "--json"], True),
            (f"heads {path.name}", ["cli", "heads", p, "--no-cache", "--json"], True),
            (f"composition k {path.name}", ["cli", "composition", p, "--kind", "k", "--no-cache", "--json"], True),
            (f"circuit ov L0.H0 {path.name}", ["cli", "circuit", p, "0", "0", "--kind", "ov", "--json"], True),
        ]
        if engine:
            out += [(f"Engine {task} {path.name}", ["py", "-m", "bench.run_one", "headscope", task, p], False)
                    for task in ("view", "copying", "composition")]
    return out


def command(side: Side, args: list[str]) -> list[str]:
    head, rest = args[0], args[1:]
    return [str(side.cli), *rest] if head == "cli" else [str(side.python), *rest]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the checkout before the change")
    p.add_argument("--shapes", default="gpt2-small", help="bench.checkpoints shapes ('' for none)")
    p.add_argument("--bundled", default=",".join(BUNDLED), help="sample_models to include")
    p.add_argument("--dir", type=Path, default=None, help="where the checkpoints are (reused)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--tolerance", type=float, default=1e-6)
    p.add_argument("--no-engine", action="store_true", help="skip the bench.run_one scenarios")
    p.add_argument("--only", default="", help="comma-separated substrings of scenario labels")
    args = p.parse_args(argv)

    sides = [Side("before", args.base.resolve()), Side("after", ROOT)]
    for side in sides:
        if not side.cli.exists():
            p.error(f"{side.root}: no .venv/bin/headscope (run `make test` there first)")
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="headscope-versus-"))
    paths = [write_checkpoint(SHAPES[s], workdir) for s in args.shapes.split(",") if s]
    paths += [ROOT / "sample_models" / name for name in args.bundled.split(",") if name]
    chosen = [s for s in scenarios(paths, not args.no_engine)
              if not args.only or any(o in s[0] for o in args.only.split(","))]
    env = dict(os.environ, HEADSCOPE_CACHE_DIR=str(workdir / "store"))

    rows = []
    for label, cmd_args, is_json in chosen:
        measures = {side.name: Measure() for side in sides}
        for _ in range(args.repeat):
            for side in sides:  # alternate, so slow spells of other load hit both
                m = measures[side.name]
                if m.error:
                    continue
                seconds, rss, out, err, code = run(command(side, cmd_args), side.root, args.timeout, env)
                if code != 0:
                    m.error = (err.strip().splitlines() or [f"exit {code}"])[-1][:100]
                    continue
                m.seconds.append(seconds)
                m.rss_mb.append(rss)
                m.output = out
        rows.append((label, is_json, measures))
        print(f"{label}: done", file=sys.stderr, flush=True)

    lines = ["| scenario | before (s) | after (s) | after / before | RSS before (MB) | RSS after (MB) "
             "| RSS after / before | largest number difference |", "|---|---|---|---|---|---|---|---|"]
    failed = False
    for label, is_json, m in rows:
        b, a = m["before"], m["after"]
        if b.error or a.error:
            lines.append(f"| {label} | {b.error or ''} | {a.error or ''} | | | | | |")
            failed = failed or bool(a.error and not b.error)
            continue
        tb, ta = min(b.seconds), min(a.seconds)
        rb, ra = max(b.rss_mb), max(a.rss_mb)
        diff = ""
        if is_json and b.output and a.output:
            worst, where = largest_difference(b.output, a.output)
            diff = f"{worst:.2g} ({where})" if worst else "0"
            failed = failed or worst > args.tolerance
        lines.append(f"| {label} | {tb:.3g} | {ta:.3g} | {ta / tb:.2f}× | {rb:.0f} | {ra:.0f} "
                     f"| {ra / rb:.2f}× | {diff} |")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
