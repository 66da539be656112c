"""``python -m bench [--quick | --tiny]``: time headscope against baselines in one run.

For each checkpoint shape (written once into a temp dir, or ``--dir``), each implementation
(headscope, a dense baseline, TransformerLens) and each task (view / copying / composition)
runs in its own subprocess (``bench.run_one``); the table shows headscope's numbers next to
each baseline's, and the ratio baseline / headscope (> 1: headscope is faster / smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .checkpoints import SHAPES, checkpoint_bytes, write_checkpoint

IMPLS = ("headscope", "dense", "tl")
TASKS = ("view", "copying", "composition")
# TransformerLens on the big shapes: loading only (its sweeps there need ~10+ GB on a box
# other people share); the dense baseline is time-boxed and extrapolated instead.
TL_TASKS_BIG = ("view",)

METRICS = [  # (label, task, key)
    ("time to structure (s)", "view", "structure"),
    ("first head QK 64×64 after open (s)", "view", "first_qk"),
    ("first head OV 64×64 after open (s)", "view", "first_ov"),
    ("process start → first QK+OV (s)", "view", "first_view_total"),
    ("cached re-request (s)", "view", "cached"),
    ("peak RSS browsing 5 heads (MB)", "view", "rss_mb"),
    ("all copying scores: compute (s)", "copying", "compute"),
    ("all copying scores: process total (s)", "copying", "total"),
    ("all head scores via Engine (copying, QK positivity, behaviour) (s)", "copying",
     "all_head_scores"),
    ("all copying scores: peak RSS (MB)", "copying", "rss_mb"),
    ("all composition q+k+v: compute (s)", "composition", "compute"),
    ("all composition q+k+v: process total (s)", "composition", "total"),
    ("all composition: peak RSS (MB)", "composition", "rss_mb"),
]


def run_scenario(impl: str, task: str, path: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.run_one", impl, task, str(path)]
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def tl_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("transformer_lens") is not None
    except Exception:
        return False


def fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
    return str(value)


def cell(results: dict[str, Any], key: str) -> str:
    if "error" in results:
        return f"failed ({results['error']})"
    value = results.get(key)
    text = fmt(value)
    if value is not None and "extrapolated" in results and key == "compute":
        text += f" (extrapolated from {results['extrapolated']})"
    return text


def ratio(base: dict[str, Any], ours: dict[str, Any], key: str) -> str:
    b, o = base.get(key), ours.get(key)
    if not isinstance(b, int | float) or not isinstance(o, int | float) or o <= 0:
        return "–"
    return f"{b / o:.1f}×"


def table(shape_name: str, size: int, results: dict[tuple[str, str], dict[str, Any]],
          impls: list[str]) -> str:
    baselines = [i for i in impls if i != "headscope"]
    names = {"headscope": "headscope", "dense": "dense baseline", "tl": "TransformerLens"}
    head = ["metric", "headscope"]
    for b in baselines:
        head += [names[b], f"{names[b]} / headscope"]
    lines = [f"### {shape_name} ({size / 2**30:.2f} GiB on disk)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, task, key in METRICS:
        ours = results.get(("headscope", task), {})
        if not ours and not any(results.get((b, task)) for b in baselines):
            continue
        row = [label, cell(ours, key) if ours else "–"]
        for b in baselines:
            base = results.get((b, task))
            row += [cell(base, key) if base else "not run", ratio(base or {}, ours, key)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    except OSError:
        mem = float("nan")
    import torch

    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python "
            f"{platform.python_version()}, torch {torch.__version__}, {platform.system()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="GPT-2-small shapes only")
    size.add_argument("--tiny", action="store_true", help="toy shapes (smoke test)")
    ap.add_argument("--shapes", help="comma-separated shape names (see bench/checkpoints.py)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="headscope,dense,tl")
    ap.add_argument("--tasks", default=",".join(TASKS), help="view,copying,composition")
    ap.add_argument("--dir", type=Path, help="where checkpoints are written (reused if present)")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per scenario")
    args = ap.parse_args(argv)

    if args.shapes:
        shapes = args.shapes.split(",")
    elif args.tiny:
        shapes = ["tiny-gpt2", "tiny-neox", "tiny-llama"]
    elif args.quick:
        shapes = ["gpt2-small"]
    else:
        shapes = ["gpt2-small", "pythia-1b", "llama-1b-gqa"]
    impls = [i for i in args.impls.split(",") if i]
    tasks = [t for t in args.tasks.split(",") if t]
    notes = []
    if "tl" in impls and not tl_available():
        impls.remove("tl")
        notes.append("TransformerLens is not installed: `pip install transformer_lens` for its column.")

    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    sections = []
    for name in shapes:
        shape = SHAPES[name]
        t = time.perf_counter()
        path = write_checkpoint(shape, root)
        print(f"# {name}: checkpoint ready in {time.perf_counter() - t:.1f} s at {path}",
              file=sys.stderr)
        results: dict[tuple[str, str], dict[str, Any]] = {}
        big = checkpoint_bytes(path) > 1 << 30
        for impl in impls:
            for task in tasks:
                if impl == "tl" and big and task not in TL_TASKS_BIG:
                    continue
                results[(impl, task)] = run_scenario(impl, task, path, args.timeout)
                print(f"#   {impl:9s} {task:11s} {json.dumps(results[(impl, task)])}",
                      file=sys.stderr)
        sections.append(table(name, checkpoint_bytes(path), results, impls))

    header = [f"Run {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}.", *notes]
    report = "\n\n".join(["\n".join(header), *sections]) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
