"""The architecture-independent description of a model.

Built by the format adapters from ``config.json`` / native metadata and the safetensors
headers alone: this module never imports torch. Field names follow TransformerLens'
``HookedTransformerConfig`` where the meaning is the same.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["native", "gpt2", "neox", "llama", "qwen2", "bert",
                 "gemma", "gemma2", "gemma3", "qwen3", "olmo2", "gpt_neo", "mixtral",
                 "phi3", "phi", "gptj", "opt"]
Positional = Literal["learned", "rotary", "none"]
# "LNPre"/"RMSPre": the normalisation without its (folded-away) gain and bias.
Normalization = Literal["LN", "LNPre", "RMS", "RMSPre"] | None


@dataclass(frozen=True)
class ModelConfig:
    family: Family
    architecture: str  # as the checkpoint names it, e.g. "GPT2LMHeadModel"
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    n_kv_heads: int | None = None  # None: same as n_heads (no grouped-query attention)
    d_mlp: int | None = None  # None: attention-only
    act_fn: str | None = None  # "gelu_new" | "gelu" | "relu" | "silu" | "gelu_fast" | ...
    gated_mlp: bool = False  # SwiGLU-style (Llama, Qwen2)
    normalization: Normalization = "LN"
    norm_eps: float = 1e-5
    positional: Positional = "learned"
    rotary_dim: int | None = None  # rotated dims per head (partial rotary: < d_head)
    rotary_base: float = 10000.0
    parallel_attn_mlp: bool = False  # GPT-NeoX/Pythia: x + attn(ln1 x) + mlp(ln2 x)
    causal: bool = True  # False for BERT-style encoders
    post_ln: bool = False  # BERT: LayerNorm after each residual add
    tied_unembed: bool = False  # no LM head in the checkpoint: W_U is W_Eᵀ (flag in UI/JSON)
    has_mlm_head: bool = False  # BERT with cls.predictions.*
    attn_scale: float | None = None  # None: sqrt(d_head)
    dtype: str = "float32"  # storage dtype of the checkpoint; compute is always float32
    n_params: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def attn_only(self) -> bool:
        return self.d_mlp is None

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else math.sqrt(self.d_head)

    def kv_head_of(self, head: int) -> int:
        """The K/V head a query head reads (grouped-query attention: heads share K/V in groups)."""
        return head // (self.n_heads // self.kv_heads)

    def check_head(self, layer: int, head: int, path: str | None = None) -> None:
        """Raise IndexOutOfRangeError unless (layer, head) names a head of this model."""
        from headscope.engine.core.validation import check_head

        check_head({"n_layers": self.n_layers, "n_heads": self.n_heads}, layer, head, path)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["n_kv_heads"] = self.kv_heads
        d["attn_only"] = self.attn_only
        return d
