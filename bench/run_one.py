"""One benchmark scenario in a fresh process: ``python -m bench.run_one IMPL TASK PATH``.

Prints one JSON object: timings in seconds (from process start where it says ``total``) and
``rss_mb``, this process's peak resident memory. A fresh process per scenario makes import
costs and peak memory per scenario, not cumulative.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

BLOCK = list(range(64))  # a heatmap of 64×64 tokens: what one screen shows
BROWSE = [(0, 1), (1, 0), (1, 1), (2, 3)]  # a few more heads after the first
BUDGET = 60.0  # seconds a slow dense sweep may run before its total is extrapolated


def since(t: float) -> float:
    return time.perf_counter() - t


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- headscope -------------------------------------------------------------------------------


def headscope(task: str, path: Path) -> dict[str, Any]:
    import asyncio

    from headscope.engine.core.requests import CircuitRequest, CompositionRequest, ScoreTableRequest
    from headscope.engine.service.engine import Engine

    out: dict[str, Any] = {}
    eng = Engine(path)
    out["structure"] = since(T0)

    async def main() -> None:
        t = time.perf_counter()
        await eng.ready()
        out["open"] = since(t)
        if task == "view":
            heads = [(0, 0), *[(min(la, eng.n_layers - 1), min(h, eng.n_heads - 1)) for la, h in BROWSE]]
            t = time.perf_counter()
            await eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "token", BLOCK, BLOCK, limit=eng.max_block_bytes))
            out["first_qk"] = since(t)
            t = time.perf_counter()
            await eng.get(CircuitRequest.of(eng.structure, 0, 0, "ov", "token", BLOCK, BLOCK, limit=eng.max_block_bytes))
            out["first_ov"] = since(t)
            out["first_view_total"] = since(T0)
            t = time.perf_counter()
            await eng.get(CircuitRequest.of(eng.structure, 0, 0, "qk", "token", BLOCK, BLOCK, limit=eng.max_block_bytes))
            await eng.get(CircuitRequest.of(eng.structure, 0, 0, "ov", "token", BLOCK, BLOCK, limit=eng.max_block_bytes))
            out["cached"] = since(t) / 2
            for layer, head in heads[1:]:
                eng.focus(layer, head)
                await eng.get(CircuitRequest.of(eng.structure, layer, head, "qk", "token", BLOCK, BLOCK, limit=eng.max_block_bytes))
                await eng.get(CircuitRequest.of(eng.structure, layer, head, "ov", "token", BLOCK, BLOCK, limit=eng.max_block_bytes))
        elif task == "copying":
            from headscope.engine.circuits import spectral
            from headscope.engine.circuits.spectral import kept_spectral_middles
            from headscope.engine.model.loading import load_model

            weights = load_model(path).weights  # shares nothing with the engine: cold

            def copying() -> None:  # the copying half of spectral.spectral_scores
                middle = {"copying_score": kept_spectral_middles(weights)["copying_score"]}
                for layer in range(weights.cfg.n_layers):
                    spectral.layer_spectral_scores(weights, layer, middle)

            t = time.perf_counter()
            await asyncio.to_thread(copying)
            out["compute"] = since(t)
            t = time.perf_counter()
            await eng.get(ScoreTableRequest())  # copying + QK positivity + behaviour, via the engine
            out["all_head_scores"] = since(t)
        elif task == "composition":
            t = time.perf_counter()
            for kind in "qkv":
                await eng.get(CompositionRequest.of(eng.structure, kind))
            out["compute"] = since(t)
        await eng.aclose()

    asyncio.run(main())
    return out


# -- dense baseline --------------------------------------------------------------------------


def dense(task: str, path: Path) -> dict[str, Any]:
    """Straightforward dense algebra on full stacked (raw) weights: d_model × d_model OV/QK
    matrices materialised per head, dense eigenvalues, dense products per pair."""
    import torch

    from headscope.engine.model.loading import load_model, read_structure

    out: dict[str, Any] = {}
    read_structure(path)
    out["structure"] = since(T0)
    t = time.perf_counter()
    from headscope.engine.forward.torch_weights import torch_weights

    w = torch_weights(load_model(path, raw=True).weights)  # the dense baseline is torch
    cfg = w.cfg
    stack = {n: torch.stack([w.get(f"blocks.{la}.attn.{n}") for la in range(cfg.n_layers)])
             for n in ("W_Q", "W_K", "W_V", "W_O")}  # [L, H, ...] every head, in memory
    w_e, w_u = w.get("embed.W_E"), w.get("unembed.W_U")
    out["open"] = since(t)
    with torch.inference_mode():
        if task == "view":
            t = time.perf_counter()
            qk = stack["W_Q"][0, 0] @ stack["W_K"][0, 0].T  # [d_model, d_model]
            _ = w_e[BLOCK] @ qk @ w_e[BLOCK].T
            out["first_qk"] = since(t)
            t = time.perf_counter()
            ov = stack["W_V"][0, 0] @ stack["W_O"][0, 0]
            _ = w_e[BLOCK] @ ov @ w_u[:, BLOCK]
            out["first_ov"] = since(t)
            out["first_view_total"] = since(T0)
        elif task == "copying":
            t = time.perf_counter()
            middle = w_u @ w_e  # the full OV W_E OV W_U has the eigenvalues of OV (W_U W_E)
            heads = [(la, h) for la in range(cfg.n_layers) for h in range(cfg.n_heads)]

            def one(lh: tuple[int, int]) -> None:
                la, h = lh
                eig = torch.linalg.eigvals(stack["W_V"][la, h] @ stack["W_O"][la, h] @ middle)
                _ = (eig.real.sum() / eig.abs().sum()).item()

            out.update(_budgeted(one, heads, t))
        elif task == "composition":
            t = time.perf_counter()
            qk = stack["W_Q"] @ stack["W_K"].transpose(-1, -2)  # [L, H, d, d]
            ov = stack["W_V"] @ stack["W_O"]
            pairs = [(l1, h1, l2, h2, kind) for kind in "qkv"
                     for l1 in range(cfg.n_layers) for h1 in range(cfg.n_heads)
                     for l2 in range(l1 + 1, cfg.n_layers) for h2 in range(cfg.n_heads)]

            def one(p: tuple[int, int, int, int, str]) -> None:
                l1, h1, l2, h2, kind = p
                right = {"q": qk[l2, h2], "k": qk[l2, h2].T, "v": ov[l2, h2]}[kind]
                _ = (ov[l1, h1] @ right).norm() / (ov[l1, h1].norm() * right.norm())

            out.update(_budgeted(one, pairs, t))
    return out


def _budgeted(fn: Callable[[Any], None], items: list[Any], t: float) -> dict[str, Any]:
    """Run ``fn`` over ``items``; past BUDGET seconds, extrapolate the total linearly."""
    done = 0
    for item in items:
        fn(item)
        done += 1
        if since(t) > BUDGET:
            break
    spent = since(t)
    result: dict[str, Any] = {"compute": spent * len(items) / done}
    if done < len(items):
        result["extrapolated"] = f"{done}/{len(items)}"
    return result


# -- TransformerLens -------------------------------------------------------------------------


def transformer_lens(task: str, path: Path) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from tokenizers import Tokenizer, models
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerFast

    out: dict[str, Any] = {}
    out["import"] = since(T0)
    # TL wants a tokenizer object (loading ours would need a tokenizer_config); any will do.
    word = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="<unk>")
    t = time.perf_counter()
    model = TransformerBridge.boot_transformers(str(path), tokenizer=tok, device="cpu")
    model.enable_compatibility_mode(disable_warnings=True)
    out["open"] = since(t)
    out["structure"] = since(T0)  # TL shows nothing before the model is loaded
    with torch.inference_mode():
        if task == "view":
            t = time.perf_counter()
            fm = model.QK[0, 0]
            _ = (model.W_E[BLOCK] @ fm.A) @ (fm.B @ model.W_E[BLOCK].T)
            out["first_qk"] = since(t)
            t = time.perf_counter()
            fm = model.OV[0, 0]
            _ = (model.W_E[BLOCK] @ fm.A) @ (fm.B @ model.W_U[:, BLOCK])
            out["first_ov"] = since(t)
            out["first_view_total"] = since(T0)
        elif task == "copying":
            t = time.perf_counter()
            full = model.W_E @ model.OV @ model.W_U
            eig = full.eigenvalues
            _ = (eig.sum(-1) / eig.abs().sum(-1)).real
            out["compute"] = since(t)
        elif task == "composition":
            t = time.perf_counter()
            for mode in "QKV":
                model.all_composition_scores(mode)
            out["compute"] = since(t)
    return out


IMPLS = {"headscope": headscope, "dense": dense, "tl": transformer_lens}


def main() -> None:
    impl, task, path = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    out = IMPLS[impl](task, path)
    out["total"] = since(T0)
    out["rss_mb"] = rss_mb()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
