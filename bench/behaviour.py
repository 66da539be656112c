"""``python -m bench.behaviour``: the behavioural sweeps, fast vs straightforward, per process.

Writes (or reuses, ``--dir``) the random GPT-2-small checkpoint of ``bench.checkpoints`` and
runs each scenario in a fresh subprocess (``--one SCENARIO PATH``), so peak RSS
(``ru_maxrss``) is per scenario. Scenarios, each on ``engine.model.loading.load_model`` (processed
weights, cold: the first pass also pays for processing the weights it reads):

- ``behaviour``: ``behaviour.behaviour_scores`` (per-layer reduction, no unembedding);
- ``behaviour-ref``: the straightforward way, ``forward.run`` with every pattern stacked and
  logits, then the same measure on the stacked tensor (what ``behaviour_scores`` did before);
- ``ablation``: ``behaviour.ablation_effects`` (cached residuals, heads of a layer batched);
- ``ablation-ref``: one full ``forward.run`` per head (what it did before), time-boxed by
  ``--budget`` seconds and extrapolated linearly over the heads (marked in the table);
- ``ablation-one`` / ``ablation-one-ref``: one head's effect (what an ``AblationRequest`` asks),
  at the middle layer: ``behaviour.ablation_effect`` vs two full passes.

Values of the fast and the reference scenario are compared (max |difference|) in the table.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from . import publish, round_robin, rss_mb, run_json  # noqa: E402

SCENARIOS = ("behaviour", "behaviour-ref", "ablation", "ablation-ref", "ablation-one", "ablation-one-ref")
SEED = 0
WARM = ("behaviour", "behaviour-ref", "ablation-one", "ablation-one-ref")  # cheap: timed twice


# -- one scenario, in this process -------------------------------------------------------------


def reference_loss(logits: Any, tokens: Any) -> float:
    import torch

    half = tokens.shape[1] // 2
    return float(torch.nn.functional.cross_entropy(logits[:, half:-1].flatten(0, 1),
                                                   tokens[:, half + 1 :].flatten()))


def one(scenario: str, path: Path, budget: float, seq_len: int | None, batch: int) -> dict[str, Any]:
    import torch

    from headscope.engine.forward import behaviour
    from headscope.engine.forward.transformer import run
    from headscope.engine.model.loading import load_model

    w = load_model(path).weights
    cfg = w.cfg
    out: dict[str, Any] = {"open_s": time.perf_counter() - T0, "rss_open_mb": rss_mb()}
    tokens = behaviour.repeated_tokens(cfg.d_vocab, cfg.n_ctx, SEED, seq_len, batch)
    out["tokens"] = list(tokens.shape)
    t = time.perf_counter()
    if scenario == "behaviour":
        found = behaviour.behaviour_scores(w, SEED, seq_len=seq_len, batch=batch)
        values = torch.stack([found[k] for k in ("prev_token", "duplicate_token", "induction")])
    elif scenario == "behaviour-ref":
        patterns = run(w, tokens).patterns
        values = torch.stack([behaviour.detect(patterns, det) for det in behaviour.detection_patterns(tokens).values()])
    elif scenario == "ablation":
        values = behaviour.ablation_effects(w, SEED, seq_len=seq_len, batch=batch)
    elif scenario == "ablation-ref":
        values = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
        base = reference_loss(run(w, tokens).logits, tokens)
        out["clean_pass_s"] = time.perf_counter() - t
        t_heads, done = time.perf_counter(), 0
        for layer in range(cfg.n_layers):
            for head in range(cfg.n_heads):
                if done and time.perf_counter() - t > budget:
                    break
                logits = run(w, tokens, ablate=[(layer, head)]).logits
                values[layer, head] = reference_loss(logits, tokens) - base
                done += 1
        per_head = (time.perf_counter() - t_heads) / done
        out["heads_done"] = done
        out["extrapolated"] = done < cfg.n_layers * cfg.n_heads
        out["seconds"] = out["clean_pass_s"] + per_head * cfg.n_layers * cfg.n_heads
    elif scenario == "ablation-one":
        values = torch.tensor(behaviour.ablation_effect(w, cfg.n_layers // 2, 0, SEED, seq_len=seq_len, batch=batch))
    elif scenario == "ablation-one-ref":
        base = reference_loss(run(w, tokens).logits, tokens)
        ablated = reference_loss(run(w, tokens, ablate=[(cfg.n_layers // 2, 0)]).logits, tokens)
        values = torch.tensor(ablated - base)
    else:
        raise SystemExit(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
    out.setdefault("seconds", time.perf_counter() - t)
    if scenario in WARM:  # again, with the weights processed and cached: the sweep alone
        t = time.perf_counter()
        one_again(scenario, w, tokens, seq_len, batch)
        out["warm_seconds"] = time.perf_counter() - t
    out["rss_mb"] = rss_mb()
    out["values"] = values.tolist()
    return out


def one_again(scenario: str, w: Any, tokens: Any, seq_len: int | None, batch: int) -> None:
    from headscope.engine.forward import behaviour
    from headscope.engine.forward.transformer import run

    layer = w.cfg.n_layers // 2
    if scenario == "behaviour":
        behaviour.behaviour_scores(w, SEED, seq_len=seq_len, batch=batch)
    elif scenario == "behaviour-ref":
        patterns = run(w, tokens).patterns
        [behaviour.detect(patterns, det) for det in behaviour.detection_patterns(tokens).values()]
    elif scenario == "ablation-one":
        behaviour.ablation_effect(w, layer, 0, SEED, seq_len=seq_len, batch=batch)
    elif scenario == "ablation-one-ref":
        reference_loss(run(w, tokens).logits, tokens)
        reference_loss(run(w, tokens, ablate=[(layer, 0)]).logits, tokens)


# -- the table ---------------------------------------------------------------------------------


def run_scenario(scenario: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = ["-m", "bench.behaviour", "--one", scenario, str(path),
           "--budget", str(args.budget), "--batch", str(args.batch)]
    if args.seq_len is not None:
        cmd += ["--seq-len", str(args.seq_len)]
    return run_json(cmd, args.timeout)


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of repeated runs (the one least slowed by other load), with the
    highest peak RSS seen in any of them."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = dict(min(ok, key=lambda r: r["seconds"]))
    for key in ("warm_seconds",):
        if key in out:
            out[key] = min(r[key] for r in ok)
    out["rss_mb"] = max(r["rss_mb"] for r in ok)
    out["runs"] = len(ok)
    return out


def max_diff(a: Any, b: Any) -> float:
    import torch

    x, y = torch.tensor(a), torch.tensor(b)
    both = ~(torch.isnan(x) | torch.isnan(y))
    return float((x[both] - y[both]).abs().max()) if bool(both.any()) else float("nan")


def table(results: dict[str, dict[str, Any]]) -> str:
    def cell(r: dict[str, Any], key: str, fmt: str) -> str:
        if "error" in r:
            return r["error"]
        if key not in r:
            return "–"
        text = format(r[key], fmt)
        if key == "seconds" and r.get("extrapolated"):
            text += f" (extrapolated from {r['heads_done']} heads)"
        return text

    lines = ["| sweep | metric | fast | straightforward | straightforward / fast |", "|---|---|---|---|---|"]
    for name, label in (("behaviour", "behaviour_scores"), ("ablation", "ablation_effects (all heads)"),
                        ("ablation-one", "ablation_effect (one head, middle layer)")):
        fast, ref = results.get(name, {"error": "not run"}), results.get(name + "-ref", {"error": "not run"})
        for key, metric, fmt in (("seconds", "compute, cold (s)", ".2f"),
                                 ("warm_seconds", "compute, weights already processed (s)", ".2f"),
                                 ("rss_mb", "peak RSS (MB)", ".0f"),
                                 ("rss_open_mb", "RSS after open (MB)", ".0f")):
            if not any(key in r or "error" in r for r in (fast, ref)):
                continue  # e.g. no warm timing for the long sweeps
            ok = key in fast and key in ref
            ratio = f"{ref[key] / fast[key]:.1f}×" if ok else "–"
            lines.append(f"| {label} | {metric} | {cell(fast, key, fmt)} | {cell(ref, key, fmt)} | {ratio} |")
        if "error" not in fast and "error" not in ref:
            lines.append(f"| {label} | max abs difference of the values | {max_diff(fast['values'], ref['values']):.1e} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.behaviour", description=__doc__.splitlines()[0])
    p.add_argument("--one", nargs=2, metavar=("SCENARIO", "PATH"), help="run one scenario here, print JSON")
    p.add_argument("--dir", type=Path, help="where the checkpoint is written / reused")
    p.add_argument("--shape", default="gpt2-small")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--budget", type=float, default=120.0, help="seconds before ablation-ref extrapolates")
    p.add_argument("--seq-len", type=int, default=None, help="T (default: the scores' default)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario (min time is shown)")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]), args.budget, args.seq_len, args.batch)))
        return 0

    from .checkpoints import SHAPES, write_checkpoint

    root = args.dir or Path(tempfile.mkdtemp(prefix="headscope-bench-"))
    path = write_checkpoint(SHAPES[args.shape], root)
    runs = round_robin(args.scenarios.split(","), args.repeat, lambda s: run_scenario(s, path, args))
    results = {name: best(rs) for name, rs in runs.items()}
    head = (f"{args.shape}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
            f"Python {platform.python_version()}, best of {args.repeat} run(s) per scenario")
    text = f"{head}\n\n{table(results)}\n"
    return publish(text, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
