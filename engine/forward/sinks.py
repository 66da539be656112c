"""Attention sinks (docs/math.md, "Reading a head"): how much attention each head puts on the
first token and on delimiters, from forward passes over seeded and natural text.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from headscope.engine.model.weights import WeightSource

SINK_SKIP = 4  # query positions 0..SINK_SKIP-1 are left out of the sink score


# -- attention sinks ---------------------------------------------------------------------------


def sink_mass(pattern: Tensor, skip: int = SINK_SKIP) -> Tensor:
    """``pattern [b, h, q, k]`` -> ``[h]``: mean attention to key 0 over queries ``q >= skip``
    (all queries if the sequence is not longer than ``skip``) and over the batch."""
    q = pattern.shape[-2]
    start = skip if q > skip else 0
    return pattern[:, :, start:, 0].float().mean((0, 2))


# Special tokens that end or separate text, by their usual spellings (prompts are encoded
# without special tokens, so these count only where a prompt spells them out).
SPECIAL_DELIMITERS = frozenset({
    "<s>", "</s>", "<bos>", "<eos>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|eot_id|>", "<|im_start|>", "<|im_end|>", "[CLS]", "[SEP]",
})


def is_delimiter(text: str) -> bool:
    """Whether a token's text is a delimiter: whitespace only (a newline, a space), or
    punctuation only (Unicode category P*: ``.`` ``,`` ``?`` ``"`` ``)``, once whitespace is
    removed: `` ,`` and ``.\n`` count), or one of ``SPECIAL_DELIMITERS`` (BOS/EOS/SEP)."""
    if text in SPECIAL_DELIMITERS:
        return True
    core = "".join(text.split())
    return all(unicodedata.category(c).startswith("P") for c in core)


def delimiter_sink_mass(pattern: Tensor, delimiter: Tensor, skip: int = SINK_SKIP,
                        causal: bool = True) -> Tensor:
    """``pattern [b, h, q, k]``, ``delimiter [b, k]`` (bool) -> ``[h]``: the attention mass on
    the delimiter positions ``1 ≤ k < q`` (neither the first token, which ``sink_mass``
    counts, nor the query itself; an encoder's ``k > q`` too), averaged over the queries
    ``q >= skip`` that have at least one such position and over the batch; NaN for every head
    if no query has one."""
    n = pattern.shape[-1]
    others = torch.ones(n, n, dtype=torch.bool)
    others = others.tril(-1) if causal else others & ~torch.eye(n, dtype=torch.bool)
    others[:, 0] = False  # the first token is sink_mass's
    keys = delimiter.bool()[:, None, :] & others[None]  # [b, q, k]
    rows = keys.any(-1)  # [b, q]
    if n > skip:
        rows[:, :skip] = False
    if not bool(rows.any()):
        return torch.full((pattern.shape[1],), math.nan)
    mass = (pattern.float() * keys[:, None].float()).sum(-1)  # [b, h, q]
    return (mass * rows[:, None].float()).sum((0, 2)) / rows.sum()


# Natural text for the sink score (encoded with the model's tokenizer where it has one).
NATURAL_PROMPTS = (
    "When Mary and John went to the store , John gave a drink to Mary .",
    "The cat sat on the mat and looked at the dog , and the dog looked back at the cat .",
    "On Monday the old man walked to the river with his small red boat .",
    "In the morning we read the news , then we went out to buy bread and milk .",
)


def passes(w: WeightSource, batches: Sequence[Tensor],
           on_block: Callable[[int, int, Tensor, Tensor], None],
           after_layer: Callable[[int], None] | None = None,
           before_layer: Callable[[int], None] | None = None) -> None:
    """Run the ``[b, p]`` token batches through the model side by side, layer by layer
    (``forward.blocks_together``: each layer's weights are read once for all of them);
    ``on_block(batch_index, layer, x_in, pattern)`` sees every layer's input stream and
    pattern of every batch, ``after_layer(layer)`` runs once each layer is done,
    ``before_layer(layer)`` before its attention."""
    from headscope.engine.forward.transformer import blocks_together, embed

    with torch.inference_mode():
        blocks_together(w, [embed(w, tokens) for tokens in batches], on_block=on_block,
                        after_layer=after_layer, before_layer=before_layer)


def sink_scores(w: WeightSource, batches: Sequence[Tensor],
                delimiters: Sequence[Tensor | None], skip: int = SINK_SKIP
                ) -> tuple[Tensor, Tensor]:
    """``([L, H], [L, H])`` in one pass over the batches: ``sink_mass`` averaged over every
    batch, and ``delimiter_sink_mass`` averaged over the batches with a ``delimiters [b, p]``
    mask (``None``: a batch without one) that have a query to score (NaN if none has)."""
    sums = SinkSums(w.cfg, len(batches), delimiters, skip)
    passes(w, batches, sums)
    return sums.result()


class SinkSums:
    """``sink_scores``' reduction, an ``on_block(batch_index, layer, x, pattern)`` for
    ``passes``; ``result()`` once every batch has run."""

    def __init__(self, cfg: Any, n_batches: int, delimiters: Sequence[Tensor | None],
                 skip: int = SINK_SKIP) -> None:
        self.cfg, self.n_batches, self.delimiters, self.skip = cfg, n_batches, delimiters, skip
        self.first = torch.zeros(cfg.n_layers, cfg.n_heads)
        self.delim = torch.zeros(cfg.n_layers, cfg.n_heads)
        self.counted = torch.zeros(cfg.n_layers)

    def __call__(self, i: int, layer: int, _x: Tensor, pattern: Tensor) -> None:
        self.first[layer] += sink_mass(pattern, self.skip) / self.n_batches
        if self.delimiters[i] is not None:
            found = delimiter_sink_mass(pattern, self.delimiters[i], self.skip, self.cfg.causal)
            if not bool(found.isnan().all()):
                self.delim[layer] += found
                self.counted[layer] += 1

    def result(self) -> tuple[Tensor, Tensor]:
        return self.first, self.delim / self.counted[:, None]  # 0/0: NaN where no batch had a delimiter


