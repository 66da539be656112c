"""QK attribution: why head L.H scores key K from query Q on a prompt (docs/math.md, "QK
attribution").

The residual stream entering layer ``L`` is a sum of components (TransformerLens names):
``embed``, ``pos`` (learned positions), each earlier head's output less its constant part
``a{l}.h{h}``, ``a{l}.bias`` (``b_O`` and those constant parts), the MLP outputs ``m{l}``. With
the norm's scale frozen at its value on the run, the head's query and key are linear in the
components, plus a constant (``bias``: the norm's bias through ``W_Q``/``W_K`` and ``b_Q``/``b_K``);
RoPE rotates each part by its own position, so the score is a sum of one term per (query
component, key component).

One forward pass to layer ``L`` on the prompt's first ``Q + 1`` tokens (causal: the later ones
change nothing at ``Q`` and before) gives every key of the query row at once: each component is
projected onto the head's query and key directions as it is produced, ``[n_pos, 2·d_head]``, so
nothing ``d_model``-sized is kept per component.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from headscope.engine.core.attribution import QKAttribution, QKRemoval, top_sources
from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.core.results import readonly
from headscope.engine.core.validation import check_result_bytes
from headscope.engine.forward.patching import scores_without
from headscope.engine.forward.torch_weights import TorchWeights, torch_weights
from headscope.engine.forward.transformer import (
    attention,
    attention_input,
    attention_mask,
    embed,
    finish_block,
    norm_scale,
    read_next,
    rotate_queries_keys,
    token_ids,
)
from headscope.engine.model.weights import WeightSource

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["MAX_TERMS_BYTES", "component_names", "out_of_scope", "qk_attribution"]

# The most the terms of one query row may hold: at 7B (1056 components before the last
# layer) a 64-token row is 285 MB of float32.
MAX_TERMS_BYTES = 1 << 30


def out_of_scope(cfg: ModelConfig) -> str | None:
    """Why the score of this model's heads is not a sum of (query component, key component)
    terms, or None when it is. From the config alone."""
    extra = cfg.extra
    if cfg.post_ln:
        return "its norms follow the residual adds (post-LN): the stream entering a layer is not a sum of components"
    if not cfg.causal:
        return "it is an encoder (every position sees the whole input)"
    if extra.get("attn_softcap"):
        return f"its scores are soft-capped (±{extra['attn_softcap']:g} tanh): not a sum of terms"
    if extra.get("qk_norm"):
        return "it normalises queries and keys (q/k norm): the score is not bilinear in the stream"
    if extra.get("post_attn_norm") or not extra.get("pre_norm", True):
        return "it normalises the sublayers' outputs: their shares of the stream are not separable"
    if cfg.positional not in ("learned", "rotary", "none") or extra.get("alibi"):
        return f"its positions ({cfg.positional}) add a bias to the scores (ALiBi): not decomposed"
    if extra.get("use_logn_attn") or (extra.get("rope_type") or "default") == "dynamic":
        return "its query scaling depends on the sequence length (log-n / dynamic NTK): not decomposed"
    return None


def component_names(cfg: ModelConfig, layer: int) -> tuple[str, ...]:
    """The components of the stream entering ``layer``, in the order of the result's axes."""
    names = ["embed"] + (["pos"] if cfg.positional == "learned" else [])
    for l in range(layer):  # noqa: E741  (l: a layer, as in the names)
        names += [f"a{l}.h{h}" for h in range(cfg.n_heads)] + [f"a{l}.bias"]
        if not cfg.attn_only:
            names.append(f"m{l}")
    return (*names, "bias")


def qk_attribution(w: WeightSource, tokens: Sequence[int], layer: int, head: int, query: int,
                   keys: Sequence[int] | None = None, *, confirm: int = 0) -> QKAttribution:
    """Head ``layer``.``head``'s score from position ``query`` to each of ``keys`` (default:
    every key the query sees: ``0 .. query``, or the sliding window) on the prompt ``tokens``
    (ids), split into (query component, key component) terms. The same numbers on raw and
    processed weights. ``confirm = N``: the top N sources of each side at each key are also
    removed from that side exactly (``removals``: ``_removals``), at the cost of a second pass
    to the layer."""
    import torch

    tw = torch_weights(w)
    cfg, path = tw.cfg, tw.path
    cfg.check_head(layer, head, path)
    reason = out_of_scope(cfg)
    if reason is None and (tw.has("embed.ln.w") or tw.has("embed.W_token_type")):
        reason = "its embedding has a LayerNorm or token types: `embed` would not be one component"
    if reason is not None:
        raise InvalidRequestError(path, f"QK attribution of {cfg.architecture}: {reason}")
    toks = token_ids(list(tokens), cfg, path)
    if toks.shape[0] != 1:
        raise InvalidRequestError(path, "QK attribution runs one prompt, not a batch")
    n_tokens = toks.shape[1]
    if not 0 <= int(query) < n_tokens:
        raise IndexOutOfRangeError(path, f"query {query} out of range (the prompt has {n_tokens} tokens: 0..{n_tokens - 1})")
    query = int(query)
    key_ids = _check_keys(cfg, layer, query, keys, path)
    names = component_names(cfg, layer)
    check_result_bytes(4 * len(names) ** 2 * len(key_ids), f"QK attribution over {len(key_ids)} keys",
                       path, MAX_TERMS_BYTES)
    # LongRoPE picks its frequencies by the sequence's length: run the whole prompt there
    n = n_tokens if (cfg.extra.get("rope_type") == "longrope") else query + 1

    with torch.inference_mode():
        read_q, read_k = _reading(tw, layer, head).split(cfg.d_head, dim=1)  # [d_model, e] each
        q_parts, k_parts, x = _components(tw, toks[:, :n], layer, query, read_q, read_k)  # [C-1, e], [C-1, n, e]
        scale = norm_scale(x[0], cfg)[: query + 1]  # [Q+1, 1]: frozen
        bias_q, bias_k = _bias_parts(tw, layer, head)
        # each part of the query at Q and of the key at 0..Q, divided by its position's scale;
        # the bias; last the whole stream: the model's score, through the same reading
        stream_q, stream_k = x[0, query] @ read_q / scale[query], x[0, : query + 1] @ read_k / scale
        q_all = torch.cat([q_parts / scale[query], bias_q[None], (stream_q + bias_q)[None]])
        k_all = torch.cat([k_parts[:, : query + 1] / scale, bias_k.expand(1, query + 1, -1),
                           (stream_k + bias_k)[None]])
        q_rot, k_rot = rotate_queries_keys(tw, layer, q_all[None, :, None], k_all[None], seq_len=n)
        q_rot, k_rot = q_rot[0, :, 0], k_rot[0][:, key_ids]  # [C+1, e], [C+1, K, e]
        score = q_rot[-1] @ k_rot[-1].T / cfg.scale  # [K]
        q_rot, k_rot = q_rot[:-1], k_rot[:-1]
        # one GEMM, laid out key by key: the why view's key move reads one key's n² terms, a
        # contiguous slice (strided over the keys, its copy took 33 ms of 1056² at 7B; now ~1)
        by_key = torch.matmul(q_rot, k_rot.permute(1, 2, 0)).div_(cfg.scale)  # [K, C, C], contiguous
        terms = by_key.permute(1, 2, 0)
        # the totals from the summed other side, in float64: Σ_b q_a·k_b = q_a·(Σ_b k_b)
        q64, k64 = q_rot.double(), k_rot.double()
        query_totals = torch.einsum("ae,ke->ak", q64, k64.sum(0)) / cfg.scale
        key_totals = torch.einsum("e,bke->bk", q64.sum(0), k64) / cfg.scale

        removals: tuple[QKRemoval, ...] = ()
        if confirm:
            removals = _removals(tw, toks[:, :n], layer, head, query, key_ids, names,
                                 {"query": query_totals.numpy(), "key": key_totals.numpy()}, int(confirm))

    nonfinite = not (bool(torch.isfinite(score).all()) and bool(torch.isfinite(terms).all()))
    return QKAttribution(
        layer=int(layer), head=int(head), query=query, keys=tuple(key_ids), names=names,
        score=readonly(score, np.float32), terms=_read_only_view(by_key).transpose(1, 2, 0),
        query_totals=readonly(query_totals, np.float64), key_totals=readonly(key_totals, np.float64),
        nonfinite=nonfinite, path=path,
        note=f"layer 0 reads the embeddings only: {', '.join(names)}" if layer == 0 else "",
        removals=removals,
    )


def _removals(w: TorchWeights, toks: Tensor, layer: int, head: int, query: int, keys: list[int],
              names: tuple[str, ...], totals: dict[str, np.ndarray], top: int) -> tuple[QKRemoval, ...]:
    """The exact confirmation of the per-side totals (docs/math.md, "QK attribution"): each
    side's top ``top`` sources at any key (``core.attribution.top_sources``), each removed from that
    side's input to the head alone (``patching.scores_without``: a path patch whose sender is
    the component, zeroed), the norm's scale frozen and recomputed; the score's drop at every
    key. A second pass to ``layer`` keeps those components whole (``[n, d_model]`` each)."""
    import torch

    chosen = {side: sorted({int(i) for i in top_sources(totals[side], top).flat}) for side in ("query", "key")}
    wanted = set(chosen["query"]) | set(chosen["key"])
    kept: dict[int, Tensor] = {}
    at = 0

    def keep(c: Tensor) -> None:
        nonlocal at
        for i in range(c.shape[0]):
            if at + i in wanted:
                kept[at + i] = c[i].clone()  # not a view: it would keep the layer's heads alive
        at += c.shape[0]

    x = _walk(w, toks, layer, keep)[0]
    out = []
    for side in ("query", "key"):
        removed = torch.stack([torch.zeros_like(x), *(kept[i] for i in chosen[side])])  # row 0: nothing
        drops = []
        for freeze in (True, False):
            scores = scores_without(w, layer, head, x, query, removed, side[0], freeze_scale=freeze,
                                    seq_len=toks.shape[1])[:, keys]
            drops.append(readonly(scores[0] - scores[1:], np.float32))
        out.append(QKRemoval(side=side, sources=tuple(names[i] for i in chosen[side]),
                             frozen=drops[0], recomputed=drops[1]))
    return tuple(out)


def _read_only_view(t: Tensor) -> np.ndarray:
    """``t``'s float32 numbers as a read-only numpy array without a copy (the terms of a 7B row
    are 285 MB: ``readonly``'s private copy doubled them at the peak). Nothing else holds
    ``t``."""
    array = t.numpy()
    array.setflags(write=False)
    return array


def _check_keys(cfg: ModelConfig, layer: int, query: int, keys: Sequence[int] | None,
                path: str | None) -> list[int]:
    """The keys asked for (default: all the query sees), each one the query sees."""
    hidden = attention_mask(cfg, query + 1, layer)
    seen = list(range(query + 1)) if hidden is None else [int(k) for k in (~hidden[query]).nonzero()[:, 0]]
    allowed = f"{seen[0]}..{seen[-1]}"
    if keys is None:
        return seen
    for k in keys:
        if int(k) not in seen:
            why = "after the query (causal attention)" if int(k) > query else "out of range"
            raise IndexOutOfRangeError(path, f"key {k} is {why}: query {query} of layer {layer} sees keys {allowed}")
    return sorted({int(k) for k in keys})


def _reading(w: TorchWeights, layer: int, head: int) -> Tensor:
    """``P [d_model, 2·d_head]``: the query and key parts of a residual component ``c`` are
    ``(c @ P) / scale`` (first and second half). The norm's centring and gain are folded in:
    ``(c - mean c) ⊙ g @ W = c @ (g ⊙ W with its rows centred)`` (docs/math.md)."""
    w_qk = _gain(w, layer)[:, None] * _qk(w, layer, head, "W")
    if w.cfg.normalization in ("LN", "LNPre"):
        w_qk = w_qk - w_qk.mean(dim=0, keepdim=True)
    return w_qk


def _qk(w: TorchWeights, layer: int, head: int, which: str) -> Tensor:
    """``[W_Q[h] | W_K[h]]`` (``which="W"``, ``[d_model, 2e]``) or ``[b_Q[h] | b_K[h]]``
    (``"b"``); the key side is ``h``'s K/V head's (canonical K tensors hold one per query head)."""
    import torch

    pre = f"blocks.{layer}.attn"
    return torch.cat([w.get_head(f"{pre}.{which}_Q", head), w.get_head(f"{pre}.{which}_K", head)], dim=-1)


def _gain(w: TorchWeights, layer: int) -> Tensor:
    """The gain of ``layer``'s attention norm (ones once folded, or without a norm)."""
    import torch

    name = f"blocks.{layer}.ln1.w"
    if w.cfg.normalization in ("LN", "RMS") and w.has(name):
        return w.get(name)
    return torch.ones(w.cfg.d_model)


def _norm_bias(w: TorchWeights, layer: int) -> Tensor | None:
    """The bias of ``layer``'s attention norm (LayerNorm, unfolded), else None."""
    name = f"blocks.{layer}.ln1.b"
    return w.get(name) if w.cfg.normalization == "LN" and w.has(name) else None


def _bias_parts(w: TorchWeights, layer: int, head: int) -> tuple[Tensor, Tensor]:
    """The ``bias`` component's query and key parts: ``b·W_Q[h] + b_Q[h]``, ``b·W_K[h] + b_K[h]``
    (``b``: the norm's bias; processing has folded it into ``b_Q``, ``b_K``)."""
    b_qk = _qk(w, layer, head, "b")
    ln_b = _norm_bias(w, layer)
    if ln_b is not None:
        b_qk = b_qk + ln_b @ _qk(w, layer, head, "W")
    e = w.cfg.d_head
    return b_qk[:e], b_qk[e:]


def _constant_outputs(w: TorchWeights, layer: int) -> Tensor:
    """``[n_heads, d_model]``: what each head of ``layer`` writes whatever it attends to, its
    values' constant part through ``W_O``, ``(b·W_V[h] + b_V[h]) W_O[h]`` (``b``: the norm's
    bias). A pattern row sums to 1, so it passes the attention unchanged; processing folds it
    into ``b_O`` (``fold_value_biases``)."""
    import torch

    pre = f"blocks.{layer}.attn"
    b_v = w.get(f"{pre}.b_V")  # [h, e]
    ln_b = _norm_bias(w, layer)
    if ln_b is not None:
        b_v = b_v + torch.einsum("d,hde->he", ln_b, w.get(f"{pre}.W_V"))
    return torch.einsum("he,hem->hm", b_v, w.get(f"{pre}.W_O"))


def _components(w: TorchWeights, toks: Tensor, layer: int, query: int, read_q: Tensor, read_k: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
    """The forward pass to ``layer``: every residual component (``component_names`` order,
    without ``bias``) through the head's reading (``_reading``, before the scale), its query
    side at ``query`` ``[C - 1, d_head]`` and its key side at every position ``[C - 1, n,
    d_head]``; and the stream entering ``layer`` ``[1, n, d_model]``. The heads' key sides cost
    ``n·d_model²`` per layer on top of the pass (a 7B layer: ~8%)."""
    import torch

    e, n = w.cfg.d_head, toks.shape[1]
    q_parts: list[Tensor] = []
    k_parts: list[Tensor] = []

    def add(c: Tensor) -> None:  # c: [k, n, d_model], k components
        q_parts.append(c[:, query] @ read_q)
        k_parts.append((c @ read_k).reshape(-1, n, e))

    x = _walk(w, toks, layer, add)
    return torch.cat(q_parts), torch.cat(k_parts), x


def _walk(w: TorchWeights, toks: Tensor, layer: int, visit: Callable[[Tensor], None]) -> Tensor:
    """The forward pass to ``layer``, each residual component handed to ``visit`` as it is
    produced, in ``component_names`` order (without ``bias``), several at once ``[k, n,
    d_model]``; returns the stream entering ``layer`` ``[1, n, d_model]``."""
    cfg = w.cfg
    n = toks.shape[1]
    visit(w.embed_rows(toks[0])[None])
    if cfg.positional == "learned":
        visit(w.get("pos_embed.W_pos")[None, :n])
    x = embed(w, toks)
    for l in range(layer):  # noqa: E741
        read_next(w, l)
        a, _, result = attention(w, l, attention_input(w, l, x), (), "zero")
        # before the MLP: a 7B model's MLP weights evict the layer's W_O from the weight
        # cache (its layer budget is two layers' attention), which was then processed again
        constant = _constant_outputs(w, l)  # [h, d_model]
        attn_bias = w.get(f"blocks.{l}.attn.b_O") + constant.sum(dim=0)
        mlp_out: list[Tensor] = []
        x = finish_block(w, l, x, a, on_mlp=mlp_out.append)
        visit(result[0] - constant[:, None])  # each head less its constant part
        visit(attn_bias.expand(1, n, -1))  # a{l}.bias
        if mlp_out:
            visit(mlp_out[0])
    return x
