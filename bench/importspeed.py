"""``python -m bench.importspeed [--dir DIR]``: whole processes, headscope's weight-only
commands next to TransformerLens, on the GPT-2-small shape, in one run.

Each command runs as its own process, timed from outside (process start to exit, imports
included), as a user would run it:

- ``headscope heads PATH --no-behaviour --json --no-cache`` (copying score and QK positivity of every
  head; torch is never imported) vs TransformerLens: ``TransformerBridge.boot_transformers``
  + ``enable_compatibility_mode()`` (the same processing), then ``Σ Re λ / Σ |λ|`` of
  ``(W_E OV W_U).eigenvalues`` and ``(W_E QK W_Eᵀ).eigenvalues``;
- ``headscope composition PATH --kind k --json --no-cache`` vs ``all_composition_scores("K")``.

headscope's modules are byte-compiled first (``compileall``), as ``pip install`` leaves an
installed package and TransformerLens' site-packages already are: a box that sets
``PYTHONDONTWRITEBYTECODE`` (this one does) would otherwise recompile an editable checkout's
sources in every process (~0.05–0.3 s), which is not what a user's installed copy pays.

The numbers of both are compared (max |difference|, goal ≤ 1e-4). Without TransformerLens
installed (``pip install -e '.[bench]'``) only headscope's column is filled. ``--tiny`` runs
the toy shape (the smoke test).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import publish

ROOT = Path(__file__).resolve().parent.parent

# What the ``headscope`` console script runs: ``main()`` reads ``sys.argv`` itself, and so
# runs as from a shell (it keeps freed memory and skips the interpreter's teardown: tui/cli/
# main.py). ``main(sys.argv[1:])`` is the Python API's call and does neither; after a
# TransformerLens process, whose gigabytes the host takes back, it ran composition in 0.78-1.15 s
# against 0.70-0.85 s this way (four runs each, alternating, session 18).
HEADSCOPE = (
    "from headscope.tui.cli.main import main\n"
    "raise SystemExit(main())\n"
)

TL = '''
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from tokenizers import Tokenizer, models
from transformer_lens.model_bridge import TransformerBridge
from transformers import PreTrainedTokenizerFast
task, path = sys.argv[1], sys.argv[2]
word = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
tok = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="<unk>")
model = TransformerBridge.boot_transformers(path, tokenizer=tok, device="cpu")
model.enable_compatibility_mode(disable_warnings=True)
with torch.inference_mode():
    if task == "heads":
        def score(fm):
            eig = fm.eigenvalues
            return (eig.real.sum(-1) / eig.abs().sum(-1)).tolist()
        out = {"copying_score": score(model.W_E @ model.OV @ model.W_U),
               "qk_positivity": score(model.W_E @ model.QK @ model.W_E.T)}
    else:
        out = {"scores": model.all_composition_scores("K").tolist()}
print(json.dumps(out))
'''


def byte_compile() -> None:
    """headscope's sources compiled to ``__pycache__`` (where pip's install puts them)."""
    import compileall

    for package in ("engine", "tui", "themes"):
        compileall.compile_dir(ROOT / package, quiet=1)


def timed(cmd: list[str], timeout: float) -> tuple[float, Any]:
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return float("nan"), {"error": f"timeout after {timeout:.0f} s"}
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        return seconds, {"error": ((done.stderr.strip().splitlines() or ["?"])[-1])[:160]}
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])


def headscope_heads(path: Path, timeout: float) -> tuple[float, Any]:
    # --no-cache: the computation, not a read-back of the results store (both commands store)
    return timed([sys.executable, "-c", HEADSCOPE, "heads", str(path), "--no-behaviour", "--json",
                  "--no-cache"], timeout)


def headscope_composition(path: Path, timeout: float) -> tuple[float, Any]:
    return timed([sys.executable, "-c", HEADSCOPE, "composition", str(path), "--kind", "k", "--json",
                  "--no-cache"], timeout)


def tl(task: str, path: Path, timeout: float) -> tuple[float, Any]:
    return timed([sys.executable, "-c", TL, task, str(path)], timeout)


def heads_difference(ours: list[dict[str, Any]], theirs: dict[str, Any]) -> float:
    worst = 0.0
    for name in ("copying_score", "qk_positivity"):
        a = np.array([[r[name] for r in ours if r["layer"] == la] for la in range(len(theirs[name]))])
        worst = max(worst, float(np.nanmax(np.abs(a - np.array(theirs[name])))))
    return worst


def composition_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    a, b = np.array(ours["scores"], dtype=float), np.array(theirs["scores"], dtype=float)
    n = a.shape[0]
    earlier = np.arange(n)[:, None, None, None] < np.arange(n)[None, None, :, None]
    earlier = np.broadcast_to(earlier, a.shape)
    return float(np.nanmax(np.abs(a[earlier] - b[earlier])))


def tl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_lens") is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.importspeed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where the checkpoint is written (reused if present)")
    ap.add_argument("--tiny", action="store_true", help="the toy shape (smoke test)")
    ap.add_argument("--no-tl", action="store_true", help="skip TransformerLens")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each command, alternating headscope and TransformerLens; the median is shown")
    args = ap.parse_args(argv)

    from .checkpoints import SHAPES, write_checkpoint

    shape = "tiny-gpt2" if args.tiny else "gpt2-small"
    path = write_checkpoint(SHAPES[shape], args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-")))
    with_tl = not args.no_tl and tl_available()
    byte_compile()
    rows = []
    for label, ours_fn, task, diff in (
        ("`heads --no-behaviour` (copying, QK positivity)", headscope_heads, "heads", heads_difference),
        ("`composition --kind k`", headscope_composition, "composition", composition_difference),
    ):
        ours_runs, tl_runs = [], []
        for _ in range(max(1, args.repeat)):  # alternating: a slow spell of other load hits both
            s_ours, ours = ours_fn(path, args.timeout)
            ours_runs.append(s_ours)
            if with_tl:
                s_tl, theirs = tl(task, path, args.timeout)
                tl_runs.append(s_tl)
            print(f"# {task}: headscope {s_ours:.2f} s, TransformerLens {tl_runs[-1] if tl_runs else None} s",
                  file=sys.stderr)
        s_ours = statistics.median(ours_runs)
        s_tl, theirs = (statistics.median(tl_runs), theirs) if with_tl else (None, None)
        ok = isinstance(theirs, dict) and "error" not in theirs and not (isinstance(ours, dict) and "error" in ours)
        rows.append((label, s_ours, s_tl, f"{s_tl / s_ours:.1f}×" if ok and s_tl else "–",
                     f"{diff(ours, theirs):.1e}" if ok else (theirs or {}).get("error", "–")))
    lines = [f"Run {time.strftime('%Y-%m-%d %H:%M %Z')}, {shape}, whole processes, median of "
             f"{max(1, args.repeat)}.", "",
             "| command | headscope (s) | TransformerLens (s) | TransformerLens / headscope | max |Δ score| |",
             "|---|---|---|---|---|"]
    lines += [f"| {a} | {b:.2f} | {'–' if c is None else f'{c:.2f}'} | {d} | {e} |" for a, b, c, d, e in rows]
    text = "\n".join(lines) + "\n"
    return publish(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
