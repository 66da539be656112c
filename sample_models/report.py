"""Print the engine's view of the shipped sample models as Markdown (for README.md).

    python -m headscope.sample_models.report [MODEL_DIR ...]

The numbers are the ones ``headscope heads`` / ``headscope composition`` show: engine
scores on the processed weights (``engine.circuits.spectral``, ``engine.forward.behaviour``), not the training code's diagnostics.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from headscope.engine.circuits.composition import composition_scores
from headscope.engine.circuits.spectral import spectral_scores
from headscope.engine.forward.behaviour import ablation_effects, behaviour_scores
from headscope.engine.model.loading import load_model

HERE = Path(__file__).resolve().parent
MODELS = ("attn-only-1l", "attn-only-2l", "gpt2-mini")


def head_table(path: Path) -> str:
    model = load_model(path)
    w = model.weights
    behaviour = behaviour_scores(w, seed=0)
    columns = {
        "prev-token": behaviour["prev_token"],
        "induction": behaviour["induction"],
        "duplicate": behaviour["duplicate_token"],
        "copying": spectral_scores(model.weights)["copying_score"],
        "ablation Δloss": ablation_effects(w, seed=0),
    }
    lines = ["| head | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            cells = " | ".join(f"{float(v[layer, head]):.2f}" for v in columns.values())
            lines.append(f"| L{layer}H{head} | {cells} |")
    if model.cfg.n_layers > 1:
        comp = composition_scores(model.weights, "k")
        flat = [(float(comp.scores[l1, h1, l2, h2]) - comp.baseline, l1, h1, l2, h2)
                for l1 in range(model.cfg.n_layers) for l2 in range(l1 + 1, model.cfg.n_layers)
                for h1 in range(model.cfg.n_heads) for h2 in range(model.cfg.n_heads)]
        flat.sort(reverse=True)
        lines += ["", f"Top K-composition edges (score − baseline {comp.baseline:.3f}):", ""]
        lines += [f"- L{l1}H{h1} → L{l2}H{h2}: {s:+.3f}" for s, l1, h1, l2, h2 in flat[:5]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])] or [
        HERE / m for m in MODELS
    ]
    torch.set_printoptions(precision=3)
    for path in paths:
        print(f"## {path.name}\n\n{head_table(path)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
