"""The reference forward pass: logits and attention patterns from any ``WeightSource``.

One small function per piece of the architecture, reading like the formulas (row vectors,
``x @ W``, TransformerLens names). It covers every supported family:

- embeddings: ``W_E[tokens]`` (+ learned ``W_pos``) (+ BERT's token-type row 0 and LayerNorm);
- rotary position embeddings (NeoX / Hugging Face ``rotate_half`` convention) on the first
  ``cfg.rotary_dim`` dimensions of each query and key;
- pre-norm blocks (LN, LNPre, RMS, RMSPre), sequential or parallel (GPT-NeoX) attention + MLP;
- post-LN blocks (BERT): ``x = LN(x + attn(x))``, ``x = LN(x + mlp(x))``, no causal mask, and
  the masked-LM head ``LN(act(x W + b)) W_U + b_U`` when the checkpoint has one;
- gated MLPs ``act(x W_gate) * (x W_in) + b_in`` (TransformerLens' ``GatedMLP``: the bias is
  added after the gate; Hugging Face gated MLPs have none) and the activations transformers uses.

Grouped-query attention needs nothing special: canonical K/V tensors are already expanded to
one per query head (``projections`` computes each stored K/V head once and copies it). Non-finite weights give non-finite outputs, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import ConfigError, IndexOutOfRangeError, PromptError
from headscope.engine.forward.blocked_mlp import blocked_mlp, uses_blocks
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.rotary import (
    is_local_layer,
    layer_config,
    rotary_inv_freq,
    rotary_scale,
)
from headscope.engine.model.weights import WeightSource, stored_kv, will_need

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "ForwardResult",
    "activation",
    "attention_mask",
    "attention_pattern",
    "blocks",
    "blocks_together",
    "log_probs",
    "projections",
    "qk_norm",
    "queries_keys_values",
    "rotary",
    "rotary_scale",
    "rotate_queries_keys",
    "run",
    "run_ablations",
    "token_ids",
    "torch_rotary_inv_freq",
]

# (layer, residual stream entering the block [b, p, d_model], its pattern [b, h, q, k])
BlockCallback = Callable[[int, "Tensor", "Tensor"], None]
# ``on_block(stream_index, layer, x_in, pattern)`` of ``blocks_together``
StreamsCallback = Callable[[int, int, "Tensor", "Tensor"], None]


@dataclass(frozen=True)
class ForwardResult:
    logits: Tensor  # [batch, pos, d_vocab]
    patterns: Tensor  # [batch, n_layers, n_heads, q_pos, k_pos]
    # [batch, n_layers, n_heads, pos, d_model], if asked: what each head adds to the residual
    # stream (through a post-attention norm's frozen scale where there is one)
    head_outputs: Tensor | None = None
    # [batch, pos, 1]: what the final norm divides the residual stream by (for direct logit
    # attribution), if asked. None for post-LN models, whose logits are not linear in a head.
    final_scale: Tensor | None = None


def run(
    weights: WeightSource,
    tokens: Tensor | Sequence[int] | Sequence[Sequence[int]],
    *,
    ablate: Iterable[tuple[int, int]] = (),
    ablation: str = "zero",
    return_head_outputs: bool = False,
) -> ForwardResult:
    """Run the model on ``tokens`` ([pos] or [batch, pos] token ids).

    ``ablate`` lists (layer, head) pairs whose output is replaced before the heads are summed:
    by zero (``ablation="zero"``) or by its mean over positions (``"mean"``).
    """
    import torch

    cfg = weights.cfg
    path = getattr(weights, "path", None)
    if ablation not in ("zero", "mean"):
        raise ValueError(f"ablation must be 'zero' or 'mean', not {ablation!r}")
    ablated: dict[int, list[int]] = {}
    for layer, head in ablate:
        cfg.check_head(layer, head, path)
        ablated.setdefault(layer, []).append(head)

    with torch.inference_mode():
        toks = token_ids(tokens, cfg, path)
        x = embed(weights, toks)  # [batch, pos, d_model]
        patterns, head_outputs = [], []
        for layer in range(cfg.n_layers):
            read_next(weights, layer)
            x, pattern, result = block(weights, layer, x, ablated.get(layer, ()), ablation)
            patterns.append(pattern)
            if return_head_outputs:
                head_outputs.append(post_normed_heads(weights, layer, result))
        final_scale = None
        if return_head_outputs and not cfg.post_ln:
            final_scale = norm_scale(x, cfg)
        logits = unembed(weights, x)
        return ForwardResult(
            logits=logits,
            patterns=torch.stack(patterns, dim=1),
            head_outputs=torch.stack(head_outputs, dim=1) if return_head_outputs else None,
            final_scale=final_scale,
        )


def log_probs(result: ForwardResult) -> Tensor:
    """Log-probabilities over the vocabulary, [batch, pos, d_vocab]."""
    import torch

    return torch.log_softmax(result.logits, dim=-1)


# -- inputs --------------------------------------------------------------------------------


def token_ids(tokens: Tensor | Sequence, cfg: ModelConfig, path: str | None) -> Tensor:
    """``tokens`` ([pos] or [batch, pos] ids) as a ``[batch, pos]`` int64 tensor, checked: at
    least one position, at most ``n_ctx``, every id in the vocabulary."""
    import torch

    toks = torch.as_tensor(tokens, dtype=torch.long)
    if toks.ndim == 1:
        toks = toks[None, :]
    if toks.ndim != 2 or toks.shape[1] == 0:
        raise PromptError(path, f"expected token ids of shape [pos] or [batch, pos] with pos >= 1, got {tuple(toks.shape)}")
    if toks.shape[1] > cfg.n_ctx:
        raise IndexOutOfRangeError(path, f"{toks.shape[1]} tokens exceed the context length n_ctx={cfg.n_ctx}")
    if toks.numel() and (int(toks.min()) < 0 or int(toks.max()) >= cfg.d_vocab):
        bad = toks[(toks < 0) | (toks >= cfg.d_vocab)][0]
        raise IndexOutOfRangeError(path, f"token id {int(bad)} out of range (d_vocab={cfg.d_vocab})")
    return toks


# -- building blocks -----------------------------------------------------------------------


def embed(w: WeightSource, tokens: Tensor) -> Tensor:
    """Token (+ learned position) (+ BERT token-type 0, then LayerNorm) embeddings."""
    w = torch_weights(w)
    cfg = w.cfg
    x = w.embed_rows(tokens)
    if cfg.positional == "learned":
        x = x + w.get("pos_embed.W_pos")[: tokens.shape[1]]
    if w.has("embed.W_token_type"):
        x = x + w.get("embed.W_token_type")[0]  # every token is segment A
    if w.has("embed.ln.w"):
        x = layer_norm(x, w.get("embed.ln.w"), w.get("embed.ln.b"), cfg.norm_eps)
    return x


def block(w: WeightSource, layer: int, x: Tensor, ablated: Sequence[int], ablation: str
          ) -> tuple[Tensor, Tensor, Tensor]:
    """One transformer block. Returns (new residual, pattern [b, h, q, k], head outputs)."""
    a, pattern, result = attention(w, layer, attention_input(w, layer, x), ablated, ablation)
    return finish_block(w, layer, x, a), pattern, result


def attention_input(w: WeightSource, layer: int, x: Tensor) -> Tensor:
    """What attention reads: the normalised residual (pre-norm) or the residual itself (BERT)."""
    return x if w.cfg.post_ln else pre_norm(w, f"blocks.{layer}.ln1", x)


def finish_block(w: WeightSource, layer: int, x: Tensor, a: Tensor, *,
                 on_mlp: Callable[[Tensor], None] | None = None, mlp_in: Tensor | None = None) -> Tensor:
    """The rest of block ``layer`` given its input ``x`` and its attention output ``a``.

    ``on_mlp(out)``, if given, sees what the MLP adds to the residual stream ``[b, p,
    d_model]`` (TransformerLens' ``hook_mlp_out``): QK attribution keeps it as a component.
    ``mlp_in``, if given, is added to the stream the MLP reads (before its norm) and to
    nothing else: path patching into the MLP's input (pre-norm models)."""
    cfg = w.cfg
    ln1, ln2 = f"blocks.{layer}.ln1", f"blocks.{layer}.ln2"

    def seen(out: Tensor) -> Tensor:
        if on_mlp is not None:
            on_mlp(out)
        return out

    if cfg.post_ln:  # BERT: normalise after each residual add
        x = norm(w, ln1, x + a)
        if not cfg.attn_only:
            x = norm(w, ln2, x + seen(mlp(w, layer, x)))
        return x
    if cfg.attn_only:
        return x + a
    if cfg.parallel_attn_mlp:  # GPT-NeoX: both read the same residual stream
        return x + a + seen(mlp(w, layer, norm(w, ln2, x if mlp_in is None else x + mlp_in)))
    x = x + post_norm(w, f"blocks.{layer}.ln1_post", a)
    read = x if mlp_in is None else x + mlp_in
    return x + seen(post_norm(w, f"blocks.{layer}.ln2_post", mlp(w, layer, pre_norm(w, ln2, read))))


def blocks(w: WeightSource, x: Tensor, start: int = 0, stop: int | None = None, *,
           on_block: BlockCallback | None = None) -> Tensor:
    """Run blocks ``start .. stop-1`` (default: to the end) on the residual stream ``x``
    ``[b, p, d_model]`` entering block ``start``; return the stream after the last one.

    ``on_block(layer, x_in, pattern)`` is called after each block with the stream that
    entered it and its attention pattern ``[b, h, q, k]``: a way to reduce each layer's
    pattern (or keep each layer's input) as it is produced instead of stacking them all.
    An exception raised by the callback (e.g. ``CancelledError``) stops the pass.
    Call it under ``torch.inference_mode()`` (as ``run`` does) unless gradients are wanted.
    """
    stop = w.cfg.n_layers if stop is None else stop
    for layer in range(start, stop):
        x_in = x
        x, pattern, _ = block(w, layer, x_in, (), "zero")
        if on_block is not None:
            on_block(layer, x_in, pattern)
    return x


def blocks_together(w: WeightSource, streams: Sequence[Tensor], *,
                    on_block: StreamsCallback | None = None,
                    after_layer: Callable[[int], None] | None = None,
                    before_layer: Callable[[int], None] | None = None) -> list[Tensor]:
    """``blocks`` on several residual streams ``[b_i, p_i, d_model]`` at once (token batches
    of different lengths), layer by layer, so each layer's weights are read once for all of
    them: a pass over a 7B model reads 13 GB, and the behavioural scores, the sinks and the
    null run five batches.

    Everything that acts on one token alone (norms, the q/k/v and output projections, the
    MLP, Mixtral's router, the residual adds) runs once on every stream's tokens side by
    side, as ``[1, Σ b_i·p_i, d_model]`` rows; only the attention proper (positions, the
    pattern) runs per stream. ``on_block(i, layer, x_in, pattern)`` is called for each stream
    after the layer's attention and before its MLP, while the attention weights are still
    cached (a 7B layer's MLP weights are twice their size and would evict them);
    ``after_layer(layer)`` once the layer is done; ``before_layer(layer)`` before its attention
    (another sweep over the layers can use the attention weights then: what it reads stays
    cached for the attention). An exception raised by any of them (e.g.
    ``CancelledError``) stops the pass. The streams equal ``blocks``' up to float rounding
    (the heads' outputs are summed by one product, not one by one).
    """
    import torch

    shapes = [(x.shape[0], x.shape[1]) for x in streams]
    d = streams[0].shape[-1]
    x = torch.cat([s.reshape(-1, d) for s in streams])[None]  # [1, N, d_model]
    for layer in range(w.cfg.n_layers):
        read_next(w, layer)
        if before_layer is not None:
            before_layer(layer)
        a = _attention_side_by_side(w, layer, x, shapes, on_block)
        x = finish_block(w, layer, x, a)
        if after_layer is not None:
            after_layer(layer)
    return _per_stream(x[0], shapes)


def read_next(w: WeightSource, layer: int) -> None:
    """As layer ``layer`` starts, tell the kernel what the pass reads after it (the next
    layer's weights, or the unembedding after the last): its disk reads then overlap this
    layer's work when the checkpoint is streamed (``model.readplan``; nothing otherwise)."""
    will_need(w, f"blocks.{layer + 1}." if layer + 1 < w.cfg.n_layers else "unembed.")


def _per_stream(rows: Tensor, shapes: list[tuple[int, int]]) -> list[Tensor]:
    """``rows [Σ b·p, ...]`` cut back into ``[b, p, ...]`` per stream (views)."""
    parts = rows.split([b * p for b, p in shapes])
    return [part.reshape(b, p, *rows.shape[1:]) for part, (b, p) in zip(parts, shapes, strict=True)]


def _attention_side_by_side(w: WeightSource, layer: int, x: Tensor, shapes: list[tuple[int, int]],
                            on_block: StreamsCallback | None) -> Tensor:
    """The attention output ``[1, N, d_model]`` of the side-by-side streams ``x [1, N, d]``
    (``shapes``: each stream's ``(b, p)``)."""
    w = torch_weights(w)
    import torch

    h, e = w.cfg.n_heads, w.cfg.d_head
    projected = queries_keys_values(w, layer, attention_input(w, layer, x))  # [1, h, N, e] each
    # per stream: [b, p, h, e] -> [b, h, p, e]
    q, k, v = ([part.permute(0, 2, 1, 3) for part in _per_stream(t[0].transpose(0, 1), shapes)]
               for t in projected)
    streams = _per_stream(x[0], shapes)
    z_rows = []
    for i, (q_i, k_i, v_i) in enumerate(zip(q, k, v, strict=True)):
        pattern, z = attend(w, layer, q_i, k_i, v_i)
        if on_block is not None:
            on_block(i, layer, streams[i], pattern)
        z_rows.append(z.transpose(1, 2).reshape(-1, h * e))  # [b·p, h·e]
    # Σ_h z_h W_O[h] + b_O: every head's output at once, one product
    pre = f"blocks.{layer}.attn"
    out = torch.cat(z_rows) @ w.get(f"{pre}.W_O").reshape(h * e, -1) + w.get(f"{pre}.b_O")
    return out[None]


def run_ablations(w: WeightSource, x: Tensor, layer: int, heads: Sequence[int],
                  ablation: str = "zero") -> Tensor:
    """The residual stream after the last block, once per head of ``heads`` ablated alone.

    ``x [b, p, d_model]`` is the clean stream entering block ``layer``. Returns
    ``[len(heads), b, p, d_model]``: element ``i`` equals the final stream of
    ``run(..., ablate=[(layer, heads[i])], ablation=ablation)`` (up to float rounding), but
    the layers below ``layer`` are not re-run and the attention of ``layer`` is computed
    once: ablating head ``h`` only changes that layer's attention output (``combine_heads``
    of the per-head outputs with ``h`` replaced). All the ablations then go through the rest
    of the model as one batch (batch index = ablated head, then sequence). ``unembed`` the
    result to get logits.
    """
    if ablation not in ("zero", "mean"):
        raise ValueError(f"ablation must be 'zero' or 'mean', not {ablation!r}")
    cfg = w.cfg
    for h in heads:
        cfg.check_head(layer, h, getattr(w, "path", None))
    import torch

    n, (b, p, d) = len(heads), x.shape
    _, _, result = attention(w, layer, attention_input(w, layer, x), (), ablation)
    # Each ablated output summed exactly as ``attention`` sums it (not ``a - result_h``,
    # which cancels digits when the heads' outputs are large).
    a_ablated = torch.cat([combine_heads(w, layer, result.clone(), [h], ablation) for h in heads])
    x_rep = x[None].expand(n, b, p, d).reshape(n * b, p, d)
    out = blocks(w, finish_block(w, layer, x_rep, a_ablated), layer + 1)
    return out.reshape(n, b, p, d)


def attention(w: WeightSource, layer: int, x: Tensor, ablated: Sequence[int], ablation: str
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Multi-head attention on the (normalised) input x [b, p, d_model].

    Returns (output [b, p, d_model], pattern [b, h, q, k], per-head outputs [b, h, p, d_model]).
    """
    w = torch_weights(w)
    import torch

    pattern, z = attend(w, layer, *queries_keys_values(w, layer, x))
    result = torch.einsum("bhqe,hem->bhqm", z, w.get(f"blocks.{layer}.attn.W_O"))  # each head's output
    return combine_heads(w, layer, result, ablated, ablation), pattern, result


def queries_keys_values(w: WeightSource, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q``, ``k``, ``v [b, h, p, d_head]`` of the (normalised) input ``x [b, p, d_model]``,
    with their biases and the q/k norms (each acts on one token: no positions yet)."""
    q, k, v = projections(w, layer, x)
    q, k = qk_norm(w, layer, q, k)
    return q, k, v


def projections(w: WeightSource, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``queries_keys_values`` before the q/k norm (TransformerLens' ``hook_q``/``hook_k``).

    ``x`` is ``[b, p, d_model]``, read by every head, or ``[b, p, 3, h, d_model]``: the
    queries', keys' and values' own copy for each head (TransformerLens'
    ``use_split_qkv_input``; edge attribution gives each its own input, docs/math.md)."""
    w = torch_weights(w)
    import torch

    pre = f"blocks.{layer}.attn"
    spec = "bpd,hde->bhpe" if x.ndim == 3 else "bphd,hde->bhpe"
    # grouped-query attention, every head reading x: each stored K/V head is computed once and
    # copied to its group's query heads (the canonical K/V tensors repeat it per query head,
    # ``ModelConfig.kv_head_of``); with an input per head each query head keeps its own
    group = w.cfg.n_heads // w.cfg.kv_heads if x.ndim == 3 else 1

    def project(i: int, name: str) -> Tensor:  # [b, p, (h,) d_model] @ [h, d_model, d_head] -> [b, h, p, d_head]
        if name != "Q" and group > 1:  # the stored heads alone (``stored_kv``: no expanded copy read)
            weight, bias = stored_kv(w, f"{pre}.W_{name}"), stored_kv(w, f"{pre}.b_{name}")
            stored = torch.einsum(spec, x, weight) + bias[:, None, :]
            return stored.repeat_interleave(group, dim=1)
        weight, bias = w.get(f"{pre}.W_{name}"), w.get(f"{pre}.b_{name}")
        return torch.einsum(spec, x if x.ndim == 3 else x[:, :, i], weight) + bias[:, None, :]

    return project(0, "Q"), project(1, "K"), project(2, "V")


def attend(w: WeightSource, layer: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The pattern ``[b, h, q, k]`` and what each head reads, ``z = pattern @ v``
    ``[b, h, q, d_head]``, of one batch of sequences' queries, keys and values."""
    pattern = attention_pattern(w, layer, q, k)
    return pattern, pattern @ v


def attention_pattern(w: WeightSource, layer: int, q: Tensor, k: Tensor) -> Tensor:
    """The pattern ``[b, h, s, p]`` of queries ``[b, h, s, d_head]`` and keys ``[b, h, p,
    d_head]`` (RoPE, the scale, the soft-cap, the mask, the softmax). The queries are those of
    the last ``s <= p`` positions (``s < p``: a run that reuses the keys of a shared prefix
    computes only the rows it needs, as patching does; their RoPE angles and mask rows are
    those of their positions). Dimension 1 may hold any selection of heads (nothing in it is
    per head): patching runs chosen heads' attention side by side."""
    import torch

    cfg = w.cfg
    n, first = k.shape[-2], k.shape[-2] - q.shape[-2]
    q, k = rotate_queries_keys(w, layer, q, k)
    scores = q @ k.transpose(-1, -2) / cfg.scale  # [b, h, s, p]
    scores = softcap(scores, cfg.extra.get("attn_softcap"))
    hidden = attention_mask(cfg, n, layer)
    if hidden is not None:
        scores = scores.masked_fill(hidden[first:], float("-inf"))
    return torch.softmax(scores, dim=-1)


def rotate_queries_keys(w: WeightSource, layer: int, q: Tensor, k: Tensor, seq_len: int | None = None
                        ) -> tuple[Tensor, Tensor]:
    """RoPE of ``layer`` on queries ``[.., s, d_head]`` and keys ``[.., p, d_head]`` (keys at
    positions ``0 .. p-1``, queries at the last ``s`` of them); both unchanged without rotary
    positions. ``seq_len``: the length of the sequence whose frequencies apply (LongRoPE picks
    them by it), ``p`` unless given. Every leading dimension is a batch: QK attribution rotates
    each residual component's part of a query or key as the forward pass rotates the whole."""
    cfg = w.cfg
    if cfg.positional != "rotary":
        return q, k
    n, first = k.shape[-2], k.shape[-2] - q.shape[-2]
    layer_cfg = layer_config(cfg, layer)
    inv_freq = torch_rotary_inv_freq(layer_cfg, getattr(w, "path", None), seq_len=n if seq_len is None else seq_len)
    scale = rotary_scale(layer_cfg)
    return rotary(q, inv_freq, scale, start=first), rotary(k, inv_freq, scale)


def combine_heads(w: WeightSource, layer: int, result: Tensor, ablated: Sequence[int], ablation: str
                  ) -> Tensor:
    """The attention output ``Σ_h result_h + b_O`` [b, p, d_model] from the per-head outputs
    ``result`` [b, h, p, d_model], after replacing (in place) those of the ``ablated`` heads."""
    w = torch_weights(w)
    for h in ablated:
        if ablation == "zero":
            result[:, h] = 0.0
        else:  # mean over positions, per sequence
            result[:, h] = result[:, h].mean(dim=1, keepdim=True)
    return result.sum(dim=1) + w.get(f"blocks.{layer}.attn.b_O")


def attention_mask(cfg: ModelConfig, n: int, layer: int | None = None) -> Tensor | None:
    """[q, k] booleans, True where a query may not look: the future (causal models) and,
    with a sliding window W (Mistral; Gemma 2/3 and GPT-Neo on their local layers only),
    keys with q - k >= W. None: attend everywhere."""
    import torch

    if not cfg.causal:
        return None
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    hidden = k > q
    window = cfg.extra.get("sliding_window") if is_local_layer(cfg, layer) else None
    if window:
        hidden = hidden | (k <= q - int(window))
    return hidden


def softcap(x: Tensor, cap: float | None) -> Tensor:
    """Gemma 2's soft-capping ``cap · tanh(x / cap)`` (identity when ``cap`` is unset)."""
    import torch

    return x if not cap else torch.tanh(x / cap) * cap


def qk_norm(w: WeightSource, layer: int, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """RMSNorm of queries and keys ``[b, h, p, d_head]`` before RoPE, when the model has one:
    per head over ``d_head`` with a ``[d_head]`` gain (Qwen3, Gemma 3), or over the whole
    projection, all heads at once, with a ``[h, d_head]`` gain (OLMo2; with grouped-query
    attention the expanded keys have the same mean square as the stored ones); or a LayerNorm
    per head over ``d_head`` with gain and bias (Phi's ``qk_layernorm``: ``qk_norm == "layer"``)."""
    w = torch_weights(w)
    pre = f"blocks.{layer}.attn"
    if not w.has(f"{pre}.q_norm.w"):
        return q, k
    if w.cfg.extra.get("qk_norm") == "layer":
        eps = w.cfg.norm_eps
        return (layer_norm(q, w.get(f"{pre}.q_norm.w"), w.get(f"{pre}.q_norm.b"), eps),
                layer_norm(k, w.get(f"{pre}.k_norm.w"), w.get(f"{pre}.k_norm.b"), eps))
    return _qk_rms(w, f"{pre}.q_norm.w", q), _qk_rms(w, f"{pre}.k_norm.w", k)


def _qk_rms(w: WeightSource, name: str, x: Tensor) -> Tensor:
    w = torch_weights(w)
    import torch

    gain, eps = w.get(name), w.cfg.norm_eps
    if gain.ndim == 1:
        return x * _rsqrt_mean_square(x, eps) * gain
    scale = torch.rsqrt(x.pow(2).mean(dim=(1, 3), keepdim=True) + eps)  # [b, 1, p, 1]
    return x * scale * gain[:, None, :]


def torch_rotary_inv_freq(cfg: ModelConfig, path: str | None = None, seq_len: int | None = None) -> Tensor:
    """``engine.model.rotary.rotary_inv_freq`` as a float32 tensor (the one computation of
    the frequencies, every RoPE scaling included)."""
    import torch

    return torch.from_numpy(rotary_inv_freq(cfg, path, seq_len))


def rotary(x: Tensor, inv_freq: Tensor, scale: float = 1.0, start: int = 0) -> Tensor:
    """Rotate the first r = 2·len(inv_freq) dims of each head of x [b, h, p, d_head] by position
    (``start``, ``start + 1``, ...: the positions of its rows).

    NeoX / Hugging Face convention: dims (i, i + r/2) form a pair rotated by angle
    p · inv_freq[i]; the rest pass through unchanged (partial rotary). ``scale``: YaRN's and
    LongRoPE's factor on the rotated dims (``rotary_scale``).
    """
    import torch

    pos = torch.arange(start, start + x.shape[-2], dtype=torch.float32)
    return torch_apply_rotary(x, pos[:, None] * inv_freq[None, :], scale)  # angles [p, r/2]


def torch_apply_rotary(x: Tensor, angles: Tensor, scale: float = 1.0) -> Tensor:
    """Rotate the first ``r = 2·angles.shape[-1]`` dims of ``x`` by ``angles`` (broadcast
    against ``x[..., :r/2]``): dims ``(i, i + r/2)`` form a pair rotated by ``angles[..., i]``
    (the NeoX / Hugging Face ``rotate_half`` convention), times ``scale``; the rest pass
    through. The forward pass's rotation (``rotary``); the rotary circuits use its numpy
    twin, ``engine.model.rotary.apply_rotary``, with the same frequencies.
    """
    import torch

    r = 2 * angles.shape[-1]
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:  # as transformers: cos and sin (float32) times the attention scaling
        cos, sin = cos * scale, sin * scale
    cos = torch.cat((cos, cos), dim=-1).to(x.dtype)
    sin = torch.cat((sin, sin), dim=-1).to(x.dtype)
    x_rot, x_pass = x[..., :r], x[..., r:]
    x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)  # rotate_half
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


def mlp(w: WeightSource, layer: int, x: Tensor) -> Tensor:
    """act(x W_in + b_in) W_out + b_out, or gated: (act(x W_gate) * (x W_in) + b_in) W_out + b_out.

    The gated form is TransformerLens' ``GatedMLP``: ``b_in`` is added to the gated product,
    not inside it. The Hugging Face gated MLPs headscope reads (Llama, Qwen2) have no bias
    (``b_in = 0``), where both readings agree.
    """
    w = torch_weights(w)
    cfg = w.cfg
    pre = f"blocks.{layer}.mlp"
    act = activation(cfg.act_fn, getattr(w, "path", None))
    if cfg.extra.get("n_experts"):
        return experts(w, layer, x, act)
    if uses_blocks(w):  # a matrix too large to hold in float32 (70B): read it in column blocks
        return blocked_mlp(w, layer, x, act, cfg.gated_mlp)
    # ``(x @ W).add_(b)``: the bits of ``x @ W + b`` without a second activation-sized tensor
    # (a patching pass of many copies makes thousands); autograd keeps no product's output
    if cfg.gated_mlp:
        hidden = (act(x @ w.get(f"{pre}.W_gate")) * (x @ w.get(f"{pre}.W_in"))).add_(w.get(f"{pre}.b_in"))
    else:
        hidden = act((x @ w.get(f"{pre}.W_in")).add_(w.get(f"{pre}.b_in")))
    return (hidden @ w.get(f"{pre}.W_out")).add_(w.get(f"{pre}.b_out"))


def experts(w: WeightSource, layer: int, x: Tensor, act: Callable[[Tensor], Tensor]) -> Tensor:
    """Mixtral's sparse mixture of experts: each token goes to the ``experts_per_token``
    experts its router ranks highest, weighted by their softmax probabilities renormalised
    over the chosen ones; each expert is a gated MLP ``(act(x W_gate) * (x W_in)) W_out``."""
    w = torch_weights(w)
    import torch

    cfg, pre = w.cfg, f"blocks.{layer}.mlp"
    flat = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(flat @ w.get(f"{pre}.W_router"), dim=-1)
    top, chosen = torch.topk(probs, int(cfg.extra["experts_per_token"]), dim=-1)  # [n, k]
    top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(flat)
    for e in range(int(cfg.extra["n_experts"])):
        token, slot = torch.where(chosen == e)
        if token.numel() == 0:
            continue
        e_pre, h = f"{pre}.experts.{e}", flat[token]
        h = act(h @ w.get(f"{e_pre}.W_gate")) * (h @ w.get(f"{e_pre}.W_in"))
        out.index_add_(0, token, (h @ w.get(f"{e_pre}.W_out")) * top[token, slot, None])
    return out.reshape(x.shape)


def unembed(w: WeightSource, x: Tensor, columns: Sequence[int] | None = None, *,
            centred: bool = True) -> Tensor:
    """Final norm (pre-LN models) or the BERT masked-LM transform, then x W_U + b_U;
    ``columns``: only those tokens' logits (a logit difference needs two of ``d_vocab``);
    with ``centred=False`` they may all be shifted by the same amount per position (what
    processing's centring over the vocabulary changes: a difference of them is exact), which
    spares reading the whole unembedding for its mean."""
    w = torch_weights(w)
    cfg = w.cfg
    if cfg.post_ln:
        if w.has("mlm.W"):  # BertForMaskedLM: dense -> act -> LayerNorm -> tied decoder
            act = activation(cfg.act_fn, getattr(w, "path", None))
            x = act(x @ w.get("mlm.W") + w.get("mlm.b"))
            x = layer_norm(x, w.get("mlm.ln.w"), w.get("mlm.ln.b"), cfg.norm_eps)
    else:
        x = norm(w, "ln_final", x)
    if columns is None:
        w_u, b_u = w.get("unembed.W_U"), w.get("unembed.b_U")
    else:
        w_u, b_u = w.unembed_columns(columns, centred=centred)
    return softcap(x @ w_u + b_u, w.cfg.extra.get("final_softcap"))


# -- normalisation -------------------------------------------------------------------------


def norm(w: WeightSource, prefix: str, x: Tensor) -> Tensor:
    """The model's normalisation with parameters ``{prefix}.w``/``.b`` (absent once folded)."""
    w = torch_weights(w)
    cfg = w.cfg
    kind = cfg.normalization
    if kind in ("LN", "LNPre"):
        gain = w.get(f"{prefix}.w") if kind == "LN" else None
        bias = w.get(f"{prefix}.b") if kind == "LN" and w.has(f"{prefix}.b") else None
        return layer_norm(x, gain, bias, cfg.norm_eps)
    if kind in ("RMS", "RMSPre"):
        x = x * _rsqrt_mean_square(x, cfg.norm_eps)
        return x * w.get(f"{prefix}.w") if kind == "RMS" else x
    return x


def post_normed_heads(w: WeightSource, layer: int, result: Tensor) -> Tensor:
    """Each head's share ``[b, h, p, d_model]`` of what the attention of ``layer`` adds to the
    residual stream. With a post-attention norm (Gemma 2/3, OLMo2) that is the head's output
    times the norm's per-position factor ``g / rms(Σ_h result_h + b_O)``, frozen like the final
    norm's scale in direct logit attribution; otherwise ``result`` itself."""
    w = torch_weights(w)
    prefix = f"blocks.{layer}.ln1_post"
    if not w.has(f"{prefix}.w"):
        return result
    a = result.sum(dim=1) + w.get(f"blocks.{layer}.attn.b_O")  # [b, p, d_model]
    factor = _rsqrt_mean_square(a, w.cfg.norm_eps) * w.get(f"{prefix}.w")
    return result * factor[:, None]


def pre_norm(w: WeightSource, prefix: str, x: Tensor) -> Tensor:
    """``norm`` before a sublayer, or ``x`` itself for models without one (OLMo2, whose
    norms sit after the sublayers: ``extra["pre_norm"]`` false)."""
    return norm(w, prefix, x) if w.cfg.extra.get("pre_norm", True) else x


def post_norm(w: WeightSource, prefix: str, x: Tensor) -> Tensor:
    """RMSNorm, with its gain, of a sublayer's output before the residual add (Gemma 2/3,
    OLMo2); ``x`` itself when the model has no ``{prefix}.w``. Processing never folds it:
    the norm divides the sum of all heads' outputs (docs/math.md)."""
    w = torch_weights(w)
    if not w.has(f"{prefix}.w"):
        return x
    return x * _rsqrt_mean_square(x, w.cfg.norm_eps) * w.get(f"{prefix}.w")


def layer_norm(x: Tensor, gain: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[-1],), gain, bias, eps)


def norm_scale(x: Tensor, cfg: ModelConfig) -> Tensor:
    """What the normalisation divides x [.., d_model] by, [.., 1] (ones without a norm)."""
    import torch

    if cfg.normalization in ("LN", "LNPre"):
        return torch.sqrt(x.var(dim=-1, keepdim=True, unbiased=False) + cfg.norm_eps)
    if cfg.normalization in ("RMS", "RMSPre"):
        return 1.0 / _rsqrt_mean_square(x, cfg.norm_eps)
    return torch.ones_like(x[..., :1])


def _rsqrt_mean_square(x: Tensor, eps: float) -> Tensor:
    import torch

    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


# -- activations ---------------------------------------------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def activation(name: str | None, path: str | None = None) -> Callable[[Tensor], Tensor]:
    """The activation ``name`` exactly as ``transformers`` computes it."""
    import torch
    import torch.nn.functional as F

    def gelu_new(x: Tensor) -> Tensor:  # GPT-2's tanh approximation, written out as HF does
        if x.requires_grad:  # autograd keeps tanh's output: no step in place
            return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))
        # the same operations in the same order (the same bits) on one temporary: four fewer
        # activation-sized tensors, 10-15% of an MLP's time on a patching pass
        t = torch.pow(x, 3.0).mul_(0.044715).add_(x).mul_(_SQRT_2_OVER_PI).tanh_().add_(1.0)
        return (0.5 * x).mul_(t)

    def gelu_fast(x: Tensor) -> Tensor:
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))

    def quick_gelu(x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)

    table: dict[str, Callable[[Tensor], Tensor]] = {
        "gelu": F.gelu,
        "gelu_new": gelu_new,
        "gelu_fast": gelu_fast,
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "quick_gelu": quick_gelu,
        "relu": F.relu,
        "silu": F.silu,
        "swish": F.silu,
    }
    if name not in table:
        raise ConfigError(path, f"unsupported activation function {name!r} (supported: {', '.join(sorted(table))})")
    return table[name]
