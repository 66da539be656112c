"""Plain-data reports of a model: what the CLI prints, exports write and notebooks read.

Each function takes an opened :class:`engine.loading.Model` and returns JSON-ready Python
values (lists, floats, ints, strings; non-finite floats become ``None`` only at
serialisation time, see :func:`jsonable`). The maths lives in ``engine.circuits`` /
``engine.scores``; this module only selects, labels and shapes results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from .errors import IndexOutOfRangeError, InvalidRequestError, ResourceLimitError

if TYPE_CHECKING:
    from .loading import Model

HEAD_SCORE_KEYS = (
    "copying_score",
    "qk_positivity",
    "prev_token_score",
    "duplicate_token_score",
    "induction_score",
)
# Scores from the forward pass: NaN only when attention itself is not finite.
BEHAVIOUR_KEYS = ("prev_token_score", "duplicate_token_score", "induction_score")
DEFAULT_BLOCK = 24  # rows/cols of a circuit block when the caller names none
MAX_BLOCK_CELLS = 4_000_000  # 16 MB of float32: refuse bigger blocks (DESIGN.md §7)


def head_table(model: Model, *, seed: int = 0, ablation: bool = False) -> list[dict[str, Any]]:
    """One row per head with every weight-based and behavioural score.

    ``ablation`` adds ``ablation_effect``: the loss increase on the second copy of the same
    seeded repeated random tokens when the head is zero-ablated (``scores.ablation_effects``;
    a forward pass per head, so off by default).
    """
    from . import scores

    w = model.weights
    copying = scores.all_copying_scores(w)
    positivity = scores.all_qk_positivity(w)
    behaviour = scores.behaviour_scores(w, seed=seed)
    effects = scores.ablation_effects(w, seed=seed) if ablation else None
    nonfinite = set(scores.nonfinite_heads(w))
    rows = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            row = {
                "layer": layer,
                "head": head,
                "copying_score": float(copying[layer, head]),
                "qk_positivity": float(positivity[layer, head]),
                "prev_token_score": float(behaviour["prev_token"][layer, head]),
                "duplicate_token_score": float(behaviour["duplicate_token"][layer, head]),
                "induction_score": float(behaviour["induction"][layer, head]),
            }
            if effects is not None:
                row["ablation_effect"] = float(effects[layer, head])
            # NaN/inf weights: every score of the head is NaN (null in JSON). Finite weights
            # can still give non-finite attention (e.g. overflow): flagged the same way.
            row["nonfinite"] = (layer, head) in nonfinite or not all(
                math.isfinite(row[k]) for k in BEHAVIOUR_KEYS
            )
            rows.append(row)
    return rows


def sort_rows(rows: list[dict[str, Any]], key: str | None) -> list[dict[str, Any]]:
    """Sort descending by ``key`` (NaN last); ``None`` keeps layer/head order."""
    if key is None:
        return rows
    if rows and key not in rows[0]:
        scores = [k for k in rows[0] if k not in ("layer", "head", "nonfinite")]
        raise InvalidRequestError(None, f"unknown sort key {key!r}; choose from {', '.join(scores)}")

    def k(r: dict[str, Any]) -> tuple[bool, float]:
        v = r[key]
        bad = v is None or (isinstance(v, float) and math.isnan(v))
        return (bad, 0.0 if bad else -float(v))

    return sorted(rows, key=k)


def composition_report(
    model: Model, kind: Literal["q", "k", "v"], *, top: int = 10, seed: int = 0
) -> dict[str, Any]:
    """All ``kind``-composition scores ``[L][H][L][H]``, the baseline and the top edges."""
    from . import scores

    result = scores.composition_scores(model.weights, kind, seed=seed)
    s = result.scores
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    baseline = float(result.baseline)
    edges = []
    for l1 in range(n_layers):
        for h1 in range(n_heads):
            for l2 in range(l1 + 1, n_layers):
                for h2 in range(n_heads):
                    v = float(s[l1, h1, l2, h2])
                    edges.append(
                        {
                            "source": [l1, h1],
                            "target": [l2, h2],
                            "score": v,
                            "above_baseline": v - baseline,
                        }
                    )
    edges.sort(key=lambda e: -e["above_baseline"] if math.isfinite(e["score"]) else math.inf)
    return {
        "kind": kind,
        "baseline": baseline,
        "seed": seed,
        "scores": s.tolist(),
        "top_edges": edges[:top],
    }


def forward_report(model: Model, tokens: Sequence[int]) -> dict[str, Any]:
    """Logits ``[pos][vocab]`` and attention patterns ``[layer][head][query][key]``."""
    from . import forward

    check_tokens(model, tokens)
    result = forward.run(model.weights, list(tokens))
    return {
        "tokens": list(tokens),
        "token_strings": [model.tokenizer.decode_token(t) for t in tokens],
        "logits": result.logits[0].tolist(),
        "patterns": result.patterns[0].tolist(),
    }


def circuit_report(
    model: Model,
    layer: int,
    head: int,
    kind: Literal["qk", "ov"],
    *,
    basis: Literal["token", "position"] = "token",
    rows: Sequence[int] | None = None,
    cols: Sequence[int] | None = None,
    offset: int = 0,
) -> dict[str, Any]:
    """A ``rows × cols`` block of a head's circuit in the token or position basis.

    token basis: QK is ``W_E QK W_Eᵀ`` (query token × key token), OV is the full OV circuit
    ``W_E OV W_U`` (source token × output token). position basis (QK only): ``W_pos QK
    W_posᵀ`` for learned positions, or ``W_E W_Q R(Δ) W_Kᵀ W_Eᵀ`` at ``offset`` Δ for rotary.
    """
    from . import circuits

    cfg, w, where = model.cfg, model.weights, str(model.path)
    cfg.check_head(layer, head, where)
    if basis == "position" and kind != "qk":
        raise InvalidRequestError(where, "the position basis exists for the QK circuit only")
    if basis == "position" and cfg.positional != "learned":
        raise IndexOutOfRangeError(
            where,
            f"{cfg.positional} positions have no positional QK matrix; use the token basis "
            "with an offset for rotary models",
        )
    n = cfg.n_ctx if basis == "position" else cfg.d_vocab
    rows = list(range(min(n, DEFAULT_BLOCK))) if rows is None else [int(r) for r in rows]
    cols = list(range(min(n, DEFAULT_BLOCK))) if cols is None else [int(c) for c in cols]
    _check_ids(model, rows, n, basis)
    _check_ids(model, cols, n, basis)
    if len(rows) * len(cols) > MAX_BLOCK_CELLS:
        raise ResourceLimitError(
            where,
            f"a {len(rows)}×{len(cols)} block exceeds the limit of {MAX_BLOCK_CELLS:,} cells; "
            "ask for fewer rows/columns",
        )
    values = circuits.circuit_block(w, layer, head, kind, basis, rows, cols, offset)
    if basis == "position":
        labels_r, labels_c = [str(p) for p in rows], [str(p) for p in cols]
    else:
        labels_r = [model.tokenizer.decode_token(t) for t in rows]
        labels_c = [model.tokenizer.decode_token(t) for t in cols]
    return {
        "layer": layer,
        "head": head,
        "kind": kind,
        "basis": basis,
        "offset": offset if cfg.positional == "rotary" else None,
        "processed": not model.raw,
        "unembedding_tied": cfg.tied_unembed,
        "rows": rows,
        "cols": cols,
        "row_labels": labels_r,
        "col_labels": labels_c,
        "values": values.tolist(),
    }


def check_tokens(model: Model, tokens: Sequence[int]) -> None:
    if not tokens:
        from .errors import PromptError

        raise PromptError(str(model.path), "empty token list: give at least one token")
    _check_ids(model, tokens, model.cfg.d_vocab, "token")
    if len(tokens) > model.cfg.n_ctx:
        raise IndexOutOfRangeError(
            str(model.path), f"{len(tokens)} tokens exceed the context of {model.cfg.n_ctx}"
        )


def _check_ids(model: Model, ids: Sequence[int], n: int, what: str) -> None:
    for i in ids:
        if not 0 <= int(i) < n:
            raise IndexOutOfRangeError(str(model.path), f"{what} {i} out of range 0..{n - 1}")


def jsonable(value: Any) -> Any:
    """Replace non-finite floats by ``None`` so the output is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
