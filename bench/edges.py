"""``python -m bench.edges``: edge attribution (EAP, EAP-IG) against one forward pass of both
prompts and against TransformerLens 4's edge attribution, in one run.

Writes (or reuses, ``--dir``) the random checkpoint of ``bench.checkpoints`` (GPT-2-small by
default) and times, in this one process, each warm (the weights read and processed by a
first call, as a sweep after others in the explorer would find them; the best of
``--repeat``):

- ``forward``: ``forward.transformer.run`` of the clean and the corrupt prompt, one batch
  (the floor: the issue asks for EAP ≤ 4× it);
- ``eap`` / ``eap-ig``: ``forward.edges.edge_scores`` (EAP-IG with ``--steps``, default 5);
- ``attribution``: ``forward.patching.attribute_heads`` of every head at site ``out`` (what
  ``headscope patch PATH --method attribution`` runs): the same two runs and one backward
  pass, the baseline of the 7B goals (EAP ≤ 1.5× it, EAP-IG with 5 steps ≤ 6×, ≤ 3 GB peak);
- ``tl``: TransformerLens 4's ``tools.analysis.attribution_patching.attribution_patch`` at
  edge granularity (its EAP: ``ig_steps=1``; its EAP-IG raises ``NotImplementedError``) on a
  ``TransformerBridge`` of the same checkpoint, same tokens, same metric. Its conventions
  differ (gradient on the corrupt run, denoising sign, its own node set), so only the times
  are compared, not the values.

``--processes`` runs each scenario in a fresh process instead (``--one SCENARIO PATH``), so
peak RSS is per scenario: its first (cold) call, which reads and processes the weights, and
the fastest of ``--repeat`` warm calls. ``--lock FILE`` holds ``flock FILE`` around each
scenario's process, not around the whole run (the shared lock of the 7B checkpoints). The 7B
goals: ``--shape llama-7b --dir DIR --processes --scenarios attribution,eap,eap-ig --lock
/work/wt/big.lock``.

The prompt: ``--tokens`` seeded random ids (clean), the corrupt one with every other id of the
second half redrawn (``bench.patching.prompts``); the metric is the logit difference of two
fixed tokens at the last position.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import publish, ratio, rss_mb, run_json
from .patching import ANSWER, WRONG, prompts

SCENARIOS = ("forward", "eap", "eap-ig", "tl")
LABELS = {"forward": "one forward pass, clean + corrupt", "eap": "headscope EAP", "eap-ig": "headscope EAP-IG",
          "tl": "TransformerLens 4 edge attribution (EAP)", "attribution": "attribution patching, every head"}


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` warm calls (after one cold call)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def headscope_calls(path: Path, n_tokens: int, steps: int, cache_bytes: int | None = None
                    ) -> dict[str, Callable[[], Any]]:
    from headscope.engine.forward import edges, patch_tasks, patching
    from headscope.engine.forward.transformer import run
    from headscope.engine.model.loading import load_model
    from headscope.engine.model.processing import ProcessedWeights

    model = load_model(path)
    clean, corrupt = prompts(model.cfg.d_vocab, n_tokens)
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    # a weight cache too small for the model: every pass reads and processes each layer again
    w = model.weights if cache_bytes is None else ProcessedWeights(model.raw_weights, cache_bytes=cache_bytes)
    return {
        "forward": lambda: run(w, [clean, corrupt]),
        "eap": lambda: edges.edge_scores(w, [clean], [corrupt], metric, method="eap"),
        "eap-ig": lambda: edges.edge_scores(w, [clean], [corrupt], metric, method="eap-ig", steps=steps),
        "attribution": lambda: patching.attribute_heads(w, [clean], [corrupt], metric),
    }


def one(scenario: str, path: Path, n_tokens: int, steps: int, repeat: int, cache_bytes: int | None = None
        ) -> dict[str, Any]:
    """One scenario in this process: its cold call, the fastest warm one, peak RSS."""
    call = (tl_call(path, n_tokens) if scenario == "tl"
            else headscope_calls(path, n_tokens, steps, cache_bytes)[scenario])
    t = time.perf_counter()
    call()
    cold = time.perf_counter() - t
    warm = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t)
    return {"cold": cold, "warm": min(warm) if warm else None, "rss_mb": rss_mb()}


def in_processes(path: Path, wanted: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each scenario in its own process (under ``flock args.lock`` if given), echoed to stderr."""
    found = {}
    for name in wanted:
        cmd = ["-m", "bench.edges", "--one", name, str(path), "--tokens", str(args.tokens),
               "--steps", str(args.steps), "--repeat", str(args.repeat)]
        if args.cache_bytes is not None:
            cmd += ["--cache-bytes", str(args.cache_bytes)]
        timeout = args.timeout
        if args.lock:  # the timeout counts from taking the lock, not from waiting for it
            cmd = ["-c", "import os, sys; os.execvp('flock', ['flock', sys.argv[1], 'timeout', sys.argv[2], "
                   "sys.executable, *sys.argv[3:]])", str(args.lock), str(int(args.timeout)), *cmd]
            timeout = 24 * 3600.0
        found[name] = run_json(cmd, timeout)
        print(name, json.dumps(found[name]), file=sys.stderr, flush=True)
    return found


def process_table(found: dict[str, dict[str, Any]], wanted: list[str], steps: int) -> str:
    """Cold and warm seconds, peak RSS and the ratios to attribution patching and to the
    forward pass (where run)."""
    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        return r["error"] if "error" in r else "–" if r[key] is None else format(r[key], fmt)

    bases = [b for b in ("attribution", "forward") if b in found and "error" not in found[b]]
    rows = ["| scenario | cold (s) | warm (s) | peak RSS (MB) | "
            + " | ".join(f"/ {LABELS[b]}, cold / warm" for b in bases) + " |",
            "|---|---|---|---|" + "---|" * len(bases)]
    for name in wanted:
        r = found[name]
        label = LABELS.get(name, name) + (f" ({steps} steps)" if name == "eap-ig" else "")
        ratios = [f"{ratio(r.get('cold'), found[b]['cold'])} / {ratio(r.get('warm'), found[b]['warm'])}"
                  for b in bases]
        rows.append(f"| {label} | {cell(r, 'cold', '.2f')} | {cell(r, 'warm', '.2f')} | {cell(r, 'rss_mb', '.0f')} | "
                    + " | ".join(ratios) + " |")
    return "\n".join(rows)


def tl_call(path: Path, n_tokens: int) -> Callable[[], Any]:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from tokenizers import Tokenizer, models
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import attribution_patching as ap
    from transformers import PreTrainedTokenizerFast

    word = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="<unk>")
    model = TransformerBridge.boot_transformers(str(path), tokenizer=tok, device="cpu")
    model.eval()
    clean, corrupt = prompts(model.cfg.d_vocab, n_tokens)
    clean_t, corrupt_t = torch.tensor([clean]), torch.tensor([corrupt])
    config = ap.EdgeAttributionConfig(granularity="edge")

    def metric(logits: Any) -> Any:
        return logits[..., -1, ANSWER].sum() - logits[..., -1, WRONG].sum()

    return lambda: ap.attribution_patch(model, clean_t, corrupt_t, metric, config)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.edges", description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, help="where the checkpoint is written / reused")
    p.add_argument("--shape", default="gpt2-small")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="forward, eap, eap-ig, tl (default all)")
    p.add_argument("--tokens", type=int, default=20, help="prompt length (default 20)")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG's steps (default 5)")
    p.add_argument("--repeat", type=int, default=3,
                   help="warm runs per scenario (the fastest is shown; 0 with --processes: the cold call only)")
    p.add_argument("--out", type=Path, help="also write the table here")
    p.add_argument("--processes", action="store_true", help="each scenario in a fresh process (peak RSS each)")
    p.add_argument("--lock", type=Path, help="with --processes: flock this file around each scenario")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds per scenario process (with --lock: once it holds the lock)")
    p.add_argument("--cache-bytes", type=int, default=None,
                   help="the weight cache's bound (default the model's: 1 GiB); small: layers stream as at 7B")
    p.add_argument("--one", nargs=2, metavar=("SCENARIO", "PATH"), help="run one scenario here, print JSON")
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]), args.tokens, args.steps, args.repeat, args.cache_bytes)))
        return 0

    from .checkpoints import SHAPES, write_checkpoint

    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    path = write_checkpoint(SHAPES[args.shape], root)
    wanted = args.scenarios.split(",")
    if args.processes:
        found = in_processes(path, wanted, args)
        head = (f"{args.shape}, {args.tokens} tokens, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
                f"Python {platform.python_version()}, one process per scenario, cold call then the best of "
                f"{args.repeat} warm call(s)"
                + (f", weight cache {args.cache_bytes >> 20} MB" if args.cache_bytes is not None else ""))
        return publish(head + "\n\n" + process_table(found, wanted, args.steps) + "\n", args.out)
    seconds: dict[str, float | str] = {}
    ours = headscope_calls(path, args.tokens, args.steps, args.cache_bytes)
    for name in wanted:
        try:
            call = tl_call(path, args.tokens) if name == "tl" else ours[name]
            seconds[name] = best_of(call, args.repeat)
        except Exception as err:  # a scenario that cannot run says why in its cell
            seconds[name] = f"error: {type(err).__name__}: {' '.join(str(err).split())[:120]}"
    forward = seconds.get("forward")
    rows = ["| scenario | warm (s) | / forward of both prompts | TransformerLens EAP / this |", "|---|---|---|---|"]
    labels = {**LABELS, "eap-ig": f"headscope EAP-IG ({args.steps} steps)"}
    for name in wanted:
        value = seconds[name]
        cell = f"{value:.3f}" if isinstance(value, float) else value
        vs_tl = ratio(seconds.get("tl"), value) if name in ("eap", "eap-ig") else ""
        rows.append(f"| {labels.get(name, name)} | {cell} | {ratio(value, forward)} | {vs_tl} |")
    head = (f"{args.shape}, {args.tokens} tokens, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
            f"Python {platform.python_version()}, best of {args.repeat} warm run(s), peak RSS {rss_mb():.0f} MB")
    return publish(head + "\n\n" + "\n".join(rows) + "\n", args.out)


if __name__ == "__main__":
    sys.exit(main())
