"""Train the sample models on CPU, deterministically, and write them to disk.

    python -m headscope.sample_models.train --model attn-only-2l [--seed N] [--steps N] [--out DIR]
        [--save-steps 0,200,400,... [--save-dir DIR]]

Logs the loss and the previous-token / induction attention of the best head as training
goes: in the two-layer model the induction score jumps after a loss plateau (a phase
change), and training continues well past it. Writes the model (native layout or a Hugging
Face GPT-2 directory), ``metrics.json``, ``training_log.json`` and a model card.
``--save-steps`` also writes the weights after each listed number of optimizer steps (0: the
initialisation) as a series of native checkpoints ``step-000600/`` in float16, which
``headscope timeline`` reads; saving copies the weights and draws no random numbers, so the
run and its final weights are the same with or without it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from . import corpus
from .export import write_hf_gpt2, write_native
from .model import (
    ModelShape,
    TinyTransformer,
    ablation_losses,
    attention_scores,
    copying_scores,
    k_composition,
    loss_fn,
)

HERE = Path(__file__).resolve().parent
V = len(corpus.VOCAB)


@dataclass(frozen=True)
class TrainSpec:
    shape: ModelShape
    fmt: str  # "native" | "hf-gpt2"
    steps: int
    batch: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.05
    warmup: int = 200
    init_std: float = 0.1
    pure_repeat: float = 0.5  # share of sequences that are a random span repeated (corpus.py)
    log_every: int = 100
    seed: int = 0  # the seed the shipped model was trained with (--seed overrides it)
    description: str = ""


PRESETS: dict[str, TrainSpec] = {
    "attn-only-1l": TrainSpec(
        ModelShape(n_layers=1, n_heads=8, d_model=128, d_head=16, d_vocab=V, n_ctx=64,
                   layer_norm=True),
        fmt="native", steps=3000,
        description="one attention-only layer: copying heads, no induction possible",
    ),
    # Three heads, not eight: with eight, seven layer-1 heads become induction heads that
    # back each other up, and zero-ablating any one of them costs almost nothing (+0.04
    # nats); with two, the one layer-0 head that does previous-token attention smears over
    # t-1..t-3 (score ≈ 0.54). Three gives a sharp previous-token head and an induction head
    # that carries most of the circuit. Of seeds 0-3, seed 1's induction head carries the
    # most (zero-ablating it: +0.67 nats; the measurements are in sample_models/README.md).
    "attn-only-2l": TrainSpec(
        ModelShape(n_layers=2, n_heads=3, d_model=128, d_head=32, d_vocab=V, n_ctx=64,
                   layer_norm=True),
        fmt="native", steps=3000, seed=1,
        description="two attention-only layers: previous-token head → induction head",
    ),
    "gpt2-mini": TrainSpec(
        ModelShape(n_layers=2, n_heads=4, d_model=128, d_head=32, d_vocab=V, n_ctx=64,
                   d_mlp=512, layer_norm=True, tied_unembed=True),
        fmt="hf-gpt2", steps=4000, init_std=0.02,  # GPT-2's init: with 0.1 the MLPs
        # drown the embeddings at the start and no copying circuit formed in 4000 steps
        description="GPT-2 style (LayerNorm, gelu_new MLP, tied embeddings), Hugging Face format",
    ),
    # Tiny configurations for the smoke tests: seconds, not minutes.
    "tiny": TrainSpec(
        ModelShape(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=V, n_ctx=16),
        fmt="native", steps=5, batch=4, warmup=2, log_every=2, description="smoke test",
    ),
    "tiny-gpt2": TrainSpec(
        ModelShape(n_layers=1, n_heads=2, d_model=16, d_head=8, d_vocab=V, n_ctx=16,
                   d_mlp=32, layer_norm=True, tied_unembed=True),
        fmt="hf-gpt2", steps=5, batch=4, warmup=2, log_every=2, description="smoke test",
    ),
}


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def build(spec: TrainSpec, seed: int) -> TinyTransformer:
    model = TinyTransformer(spec.shape)
    model.init_weights(torch.Generator().manual_seed(seed), spec.init_std)
    return model


def snapshot(model: TinyTransformer) -> dict[str, float]:
    """Best-head diagnostics logged during training."""
    att = attention_scores(model, seed=1)
    last = model.shape.n_layers - 1
    return {
        "prev_token_max_l0": float(att["prev_token"][0].max()),
        "induction_max_last": float(att["induction"][last].max()),
    }


@torch.no_grad()
def repeated_loss(model: TinyTransformer, seed: int = 2, batch: int = 16) -> float:
    """Loss on the second half of repeated random tokens (low only with induction)."""
    from .model import repeated_random_tokens

    half = model.shape.n_ctx // 2
    tokens = repeated_random_tokens(model.shape.d_vocab, half, batch, seed)
    logits, _ = model(tokens)
    return float(loss_fn(logits[:, half - 1 :], tokens[:, half - 1 :]))


@dataclass(frozen=True)
class SaveSpec:
    """Intermediate checkpoints: after each of ``steps`` optimizer steps, into ``out``."""

    steps: tuple[int, ...]
    out: Path
    dtype: torch.dtype = torch.float16


def step_dir_name(step: int) -> str:
    """``step-000600``: zero-padded so that the names also sort in step order."""
    return f"step-{step:06d}"


def save_checkpoint(model: TinyTransformer, save: SaveSpec, step: int) -> Path:
    """Write the weights after ``step`` optimizer steps as a native checkpoint (a copy)."""
    path = save.out / step_dir_name(step)
    write_native(model, corpus.VOCAB, path, dtype=save.dtype)
    return path


def series_card(name: str, seed: int, save: SaveSpec) -> str:
    """The README of a checkpoint series written by ``--save-steps``."""
    steps = ",".join(str(s) for s in save.steps)
    where = "" if save.out == HERE / f"{name}-training" else f" --save-dir {save.out}"
    dtype = str(save.dtype).removeprefix("torch.")
    return "\n".join([
        f"# {save.out.name}", "",
        f"{len(save.steps)} checkpoints of the training run of `{name}` (seed {seed}), one "
        f"directory per step (`{step_dir_name(save.steps[0])}/` ... "
        f"`{step_dir_name(save.steps[-1])}/`: the weights after that many optimizer steps, "
        f"0 being the initialisation), each a native checkpoint stored in {dtype}. Written by",
        "", "```",
        f"python -m headscope.sample_models.train --model {name} --seed {seed} "
        f"--save-steps {steps}{where}",
        "```", "",
        "Saving copies the weights and draws no random numbers: the run, and its final weights, "
        "are those of the same command without `--save-steps`. `headscope timeline "
        f"{save.out.name}` shows every head's scores across the steps.", "",
    ])


def parse_save_steps(text: str, total: int) -> tuple[int, ...]:
    """``"0,200,400"`` → ``(0, 200, 400)``, each within ``0..total``, sorted, no repeats."""
    try:
        steps = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"--save-steps: {text!r} is not a comma-separated list of integers") from None
    bad = [s for s in steps if not 0 <= s <= total]
    if bad:
        raise ValueError(f"--save-steps: {bad[0]} is outside 0..{total} (the run's steps)")
    return tuple(steps)


def train(name: str, seed: int | None = None, steps: int | None = None, out: Path | None = None,
          quiet: bool = False, threads: int = 1, save: SaveSpec | None = None,
          **overrides: Any) -> dict:
    """Train preset ``name``, write it to ``out`` and return its metrics.

    Runs with ``threads`` torch threads (restored afterwards): on a shared 2-core machine
    one thread is several times faster than two, and results are reproducible only for a
    fixed thread count. ``overrides`` replace ``TrainSpec`` fields (lr, init_std, ...).
    ``seed`` defaults to the preset's, the one its shipped model was trained with.
    ``save`` writes intermediate checkpoints (native presets only) without changing the run.
    """
    spec = replace(PRESETS[name], **overrides)
    seed = spec.seed if seed is None else seed
    if steps is not None:
        spec = replace(spec, steps=steps, warmup=min(spec.warmup, max(1, steps // 5)))
    if save is not None and spec.fmt != "native":
        raise ValueError(f"--save-steps: {name} is not a native-layout preset")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(name, spec, seed, out or HERE / name, quiet, save)
    finally:
        torch.set_num_threads(previous)


def _train(name: str, spec: TrainSpec, seed: int, out: Path, quiet: bool,
           save: SaveSpec | None = None) -> dict:
    save_at = set(save.steps) if save is not None else set()
    torch.manual_seed(seed)
    model = build(spec, seed)
    data = corpus.Corpus(seed, pure_repeat=spec.pure_repeat)
    eval_corpus = corpus.Corpus(seed + 10_000, pure_repeat=spec.pure_repeat)
    eval_tokens = torch.from_numpy(eval_corpus.batch(64, spec.shape.n_ctx))
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.99),
                            weight_decay=spec.weight_decay)
    log: list[dict] = []
    recent: list[float] = []
    t0 = time.perf_counter()
    if 0 in save_at:
        save_checkpoint(model, save, 0)
    for step in range(spec.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        tokens = torch.from_numpy(data.batch(spec.batch, spec.shape.n_ctx))
        logits, _ = model(tokens)
        loss = loss_fn(logits, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(float(loss.detach()))
        if step + 1 in save_at:
            save_checkpoint(model, save, step + 1)
        if (step + 1) % spec.log_every == 0 or step + 1 == spec.steps:
            entry = {"step": step + 1, "loss": sum(recent) / len(recent),
                     "repeated_loss": repeated_loss(model), **snapshot(model),
                     "seconds": round(time.perf_counter() - t0, 1)}
            recent = []
            log.append(entry)
            if not quiet:
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in entry.items()), flush=True)
    model.eval()
    metrics = evaluate(model, eval_tokens)
    metrics.update(name=name, seed=seed, steps=spec.steps, batch=spec.batch,
                   train_loss_final=log[-1]["loss"], seconds=round(time.perf_counter() - t0, 1),
                   threads=torch.get_num_threads(), shape=asdict(spec.shape))
    if spec.fmt == "native":
        write_native(model, corpus.VOCAB, out)
    else:
        write_hf_gpt2(model, corpus.VOCAB, out, unk=corpus.UNK, bos=corpus.BOS)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "README.md").write_text(model_card(name, spec, metrics, log))
    if save is not None:
        (save.out / "README.md").write_text(series_card(name, seed, save))
    return metrics


@torch.no_grad()
def evaluate(model: TinyTransformer, eval_tokens: torch.Tensor) -> dict:
    logits, _ = model(eval_tokens)
    att = attention_scores(model, seed=1)
    m = {
        "eval_loss": float(loss_fn(logits, eval_tokens)),
        "repeated_loss": repeated_loss(model),
        "prev_token": att["prev_token"].tolist(),
        "induction": att["induction"].tolist(),
        "copying": copying_scores(model).tolist(),
        "ablation": ablation_losses(model).tolist(),
    }
    if model.shape.n_layers >= 2:
        m["k_composition_l0_l1"] = k_composition(model, 0, 1).tolist()
    return m


def _fmt_row(values: list[float]) -> str:
    return " | ".join(f"{v:.2f}" for v in values)


def model_card(name: str, spec: TrainSpec, m: dict, log: list[dict]) -> str:
    s = spec.shape
    fmt = ("headscope native (`model.safetensors`, `headscope.json`, `vocab.txt`)"
           if spec.fmt == "native" else
           "Hugging Face GPT-2 (`config.json`, `model.safetensors`, `tokenizer.json`)")
    lines = [
        f"# {name}", "", spec.description[0].upper() + spec.description[1:] + ".", "",
        f"- format: {fmt}",
        f"- shape: {s.n_layers} layer(s), {s.n_heads} heads, d_model {s.d_model}, d_head "
        f"{s.d_head}, d_mlp {s.d_mlp or 'none (attention-only)'}, n_ctx {s.n_ctx}, "
        f"d_vocab {s.d_vocab}, "
        f"LayerNorm {'yes' if s.layer_norm else 'no'}, "
        f"unembedding {'tied' if s.tied_unembed else 'untied with bias'}",
        f"- training: `python -m headscope.sample_models.train --model {name} --seed {m['seed']}`: "
        f"{m['steps']} steps × batch {m['batch']} × {s.n_ctx} tokens of `sample_models/corpus.py`, "
        f"AdamW lr {spec.lr} (warm-up {spec.warmup}, cosine), weight decay {spec.weight_decay}, "
        f"{m['threads']} torch thread(s), {m['seconds']} s on a shared 2-core machine",
        f"- final training loss {m['train_loss_final']:.3f}, held-out loss {m['eval_loss']:.3f}, "
        f"loss on repeated random tokens (second copy) {m['repeated_loss']:.3f} "
        f"(uniform guess: {math.log(s.d_vocab):.2f})",
        "",
        "Scores measured by the training code (`sample_models/model.py`; `headscope heads` "
        "gives the engine's own numbers), one row per layer, heads 0…"
        f"{s.n_heads - 1}:", "",
    ]
    for key, title in [("prev_token", "previous-token attention"), ("induction", "induction attention"),
                       ("copying", "copying score (full OV eigenvalues)"),
                       ("ablation", "loss increase on the second copy of repeated random "
                                    "tokens when zero-ablated")]:
        lines.append(f"{title}:")
        lines.append("")
        lines += [f"- L{layer}: {_fmt_row(row)}" for layer, row in enumerate(m[key])]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m headscope.sample_models.train", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(PRESETS), required=True)
    p.add_argument("--seed", type=int, default=None,
                   help="training seed (default: the preset's, which reproduces the shipped model)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (results are reproducible for a fixed value)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: preset)")
    p.add_argument("--init-std", type=float, default=None, help="init std (default: preset)")
    p.add_argument("--pure-repeat", type=float, default=None,
                   help="share of repeated-random-span sequences (default: preset)")
    p.add_argument("--layer-norm", action="store_true", help="add LayerNorm (experiments)")
    p.add_argument("--shape", nargs="*", default=[], metavar="FIELD=INT",
                   help="override ModelShape integer fields, e.g. n_heads=4 d_head=32")
    p.add_argument("--card-only", action="store_true",
                   help="rewrite the model card from the saved metrics.json, no training")
    p.add_argument("--save-steps", default=None, metavar="N,N,...",
                   help="also save the weights after these numbers of steps (0: the init), "
                        "float16, as DIR/step-000600/ ... (native presets only)")
    p.add_argument("--save-dir", type=Path, default=None,
                   help="where --save-steps writes (default: sample_models/<model>-training)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.card_only:
        out = args.out or HERE / args.model
        metrics = json.loads((out / "metrics.json").read_text())
        log = json.loads((out / "training_log.json").read_text())
        spec = replace(PRESETS[args.model], steps=metrics["steps"])
        (out / "README.md").write_text(model_card(args.model, spec, metrics, log))
        return 0
    overrides: dict = {k: v for k, v in (("lr", args.lr), ("init_std", args.init_std),
                                         ("pure_repeat", args.pure_repeat)) if v is not None}
    shape_changes: dict[str, Any] = {k: int(v) for k, v in (f.split("=", 1) for f in args.shape)}
    if args.layer_norm:
        shape_changes["layer_norm"] = True
    if shape_changes:
        overrides["shape"] = replace(PRESETS[args.model].shape, **shape_changes)
    save = None
    if args.save_steps is not None:
        total = args.steps if args.steps is not None else PRESETS[args.model].steps
        try:
            save_steps = parse_save_steps(args.save_steps, total)
        except ValueError as e:
            p.error(str(e))
        save = SaveSpec(save_steps, args.save_dir or HERE / f"{args.model}-training")
    metrics = train(args.model, args.seed, args.steps, args.out, args.quiet, args.threads,
                    save=save, **overrides)
    print(json.dumps({k: metrics[k] for k in ("name", "eval_loss", "repeated_loss", "seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
