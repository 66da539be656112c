"""Writers for the two on-disk formats the sample models ship in.

- ``write_native``: headscope's native layout (docs/internals.md): ``model.safetensors``
  with canonical TransformerLens names, the ``ModelConfig`` as JSON both in the safetensors
  metadata key ``headscope_config`` and in ``headscope.json``, and ``vocab.txt``.
- ``write_hf_gpt2``: a Hugging Face GPT-2 directory (``config.json``, ``model.safetensors``
  with Conv1D layouts, ``tokenizer.json``), written without importing ``transformers``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.export import file_mode

from .model import ModelShape, TinyTransformer

NATIVE_ARCHITECTURE = "headscope-attn-only"


def native_config(shape: ModelShape, n_params: int, dtype: str = "float32") -> ModelConfig:
    return ModelConfig(
        family="native",
        architecture=NATIVE_ARCHITECTURE if shape.d_mlp is None else "headscope-transformer",
        n_layers=shape.n_layers,
        n_heads=shape.n_heads,
        d_model=shape.d_model,
        d_head=shape.d_head,
        d_vocab=shape.d_vocab,
        n_ctx=shape.n_ctx,
        d_mlp=shape.d_mlp,
        act_fn="gelu_new" if shape.d_mlp else None,
        normalization="LN" if shape.layer_norm else None,
        norm_eps=shape.ln_eps,
        positional="learned",
        tied_unembed=shape.tied_unembed,
        dtype=dtype,
        n_params=n_params,
    )


def config_json(cfg: ModelConfig) -> str:
    """The config as JSON whose keys are exactly ``ModelConfig``'s field names."""
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)


def write_native(model: TinyTransformer, vocab: Sequence[str], out: Path,
                 dtype: torch.dtype = torch.float32) -> ModelConfig:
    """Write ``model`` in the native layout, its tensors stored as ``dtype`` (a copy: the
    model itself is not touched)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(dtype) for k, v in model.canonical_tensors().items()}
    cfg = native_config(model.shape, sum(t.numel() for t in tensors.values()),
                        str(dtype).removeprefix("torch."))
    cfg_text = config_json(cfg)
    save_file(tensors, str(out / "model.safetensors"), metadata={"headscope_config": cfg_text})
    (out / "model.safetensors").chmod(file_mode())  # safetensors writes 0o600
    (out / "headscope.json").write_text(json.dumps(json.loads(cfg_text), indent=2) + "\n")
    write_vocab(vocab, out / "vocab.txt")
    return cfg


def write_vocab(vocab: Sequence[str], path: Path) -> None:
    assert all(w and not any(c.isspace() for c in w) for w in vocab), "word-level vocab"
    path.write_text("".join(w + "\n" for w in vocab))


# ---- Hugging Face GPT-2 --------------------------------------------------------------------


def gpt2_tensors(model: TinyTransformer) -> dict[str, torch.Tensor]:
    """Canonical tensors → HF GPT-2 names. Conv1D weights are [in, out]: y = x W + b.

    ``c_attn`` packs Q | K | V along the output dim, each as heads side by side, so the
    canonical ``W_Q`` [H, D, dh] becomes columns ``h*dh:(h+1)*dh`` of the Q third.
    """
    s = model.shape
    if not (s.layer_norm and s.d_mlp and s.tied_unembed):
        raise ValueError("GPT-2 export needs LayerNorm, an MLP and a tied unembedding")
    t = model.canonical_tensors()
    D, H, dh = s.d_model, s.n_heads, s.d_head

    def heads_to_cols(w: torch.Tensor) -> torch.Tensor:  # [H, D, dh] -> [D, H*dh]
        return w.permute(1, 0, 2).reshape(D, H * dh)

    out = {
        "transformer.wte.weight": t["embed.W_E"],
        "transformer.wpe.weight": t["pos_embed.W_pos"],
        "transformer.ln_f.weight": t["ln_final.w"],
        "transformer.ln_f.bias": t["ln_final.b"],
    }
    for layer in range(s.n_layers):
        c, h = f"blocks.{layer}.", f"transformer.h.{layer}."
        out[h + "ln_1.weight"] = t[c + "ln1.w"]
        out[h + "ln_1.bias"] = t[c + "ln1.b"]
        out[h + "attn.c_attn.weight"] = torch.cat(
            [heads_to_cols(t[c + f"attn.W_{x}"]) for x in "QKV"], dim=1
        )
        out[h + "attn.c_attn.bias"] = torch.cat([t[c + f"attn.b_{x}"].reshape(-1) for x in "QKV"])
        out[h + "attn.c_proj.weight"] = t[c + "attn.W_O"].reshape(H * dh, D)
        out[h + "attn.c_proj.bias"] = t[c + "attn.b_O"]
        out[h + "ln_2.weight"] = t[c + "ln2.w"]
        out[h + "ln_2.bias"] = t[c + "ln2.b"]
        out[h + "mlp.c_fc.weight"] = t[c + "mlp.W_in"]
        out[h + "mlp.c_fc.bias"] = t[c + "mlp.b_in"]
        out[h + "mlp.c_proj.weight"] = t[c + "mlp.W_out"]
        out[h + "mlp.c_proj.bias"] = t[c + "mlp.b_out"]
    return {k: v.contiguous() for k, v in out.items()}


def gpt2_config(shape: ModelShape, bos_id: int) -> dict:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": shape.d_vocab,
        "n_positions": shape.n_ctx,
        "n_ctx": shape.n_ctx,
        "n_embd": shape.d_model,
        "n_layer": shape.n_layers,
        "n_head": shape.n_heads,
        "n_inner": shape.d_mlp,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": shape.ln_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": bos_id,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def write_tokenizer_json(vocab: Sequence[str], unk: str, path: Path) -> None:
    """Word-level ``tokenizer.json``: WordLevel model, WhitespaceSplit pre-tokenizer."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=unk))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.save(str(path))


def write_hf_gpt2(
    model: TinyTransformer, vocab: Sequence[str], out: Path, *, unk: str, bos: str
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    save_file(gpt2_tensors(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(file_mode())
    cfg = gpt2_config(model.shape, list(vocab).index(bos))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_tokenizer_json(vocab, unk, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": unk, "bos_token": bos,
             "eos_token": bos, "model_max_length": model.shape.n_ctx},
            indent=2,
        )
        + "\n"
    )
    return cfg
