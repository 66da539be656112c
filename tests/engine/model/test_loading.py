"""Loading real (tiny, random) Hugging Face checkpoints of every family.

The canonical tensors are checked against the ``transformers`` modules themselves: each
head's Q/K/V projection of a random input, each output projection, every MLP linear and
norm, the unembedding (and BERT's MLM head) — so a wrong split of a fused QKV tensor, a
missing transpose or a wrong GQA mapping shows up as a numeric mismatch. End to end,
``engine.forward`` on ``load_model`` must reproduce the transformers log-probabilities.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.formats.safetensors import read_header
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.loading import load_model, read_structure
from tests import hf_fixtures as hf

ATOL = 1e-5
ROOT = Path(__file__).resolve().parents[3]
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 60, 61, 95, 0]

FIXTURES = {
    "gpt2": "gpt2_dir",
    "neox": "neox_dir",
    "llama": "llama_dir",
    "qwen2": "qwen2_dir",
    "bert_mlm": "bert_mlm_dir",
    "bert_base": "bert_base_dir",
}


def _fixture(request: pytest.FixtureRequest, family: str) -> tuple[Path, Any]:
    return request.getfixturevalue(FIXTURES[family])


# --- what transformers computes, module by module ------------------------------------------


def _split_heads(t: torch.Tensor, n: int) -> torch.Tensor:
    """[pos, n * d_head] -> [n, pos, d_head]."""
    return t.view(t.shape[0], n, -1).transpose(0, 1)


def hf_layer_parts(family: str, model: Any, layer: int) -> dict[str, Any]:
    """The HF modules of one layer: a q/k/v function, the output projection, norms, MLP."""
    c = model.config
    n = c.num_attention_heads
    if family == "gpt2":
        blk = model.transformer.h[layer]

        def qkv(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(_split_heads(t, n) for t in blk.attn.c_attn(x).split(c.hidden_size, -1))

        return {
            "qkv": qkv,
            "o": blk.attn.c_proj,
            "norms": {"ln1": blk.ln_1, "ln2": blk.ln_2},
            "mlp": {"W_in": blk.mlp.c_fc, "W_out": blk.mlp.c_proj},
        }
    if family == "neox":
        blk = model.gpt_neox.layers[layer]

        def qkv(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # modeling_gpt_neox: view(..., n_heads, 3 * head_size), then chunk(3) per head
            fused = blk.attention.query_key_value(x).view(x.shape[0], n, -1).transpose(0, 1)
            return fused.chunk(3, dim=-1)

        return {
            "qkv": qkv,
            "o": blk.attention.dense,
            "norms": {"ln1": blk.input_layernorm, "ln2": blk.post_attention_layernorm},
            "mlp": {"W_in": blk.mlp.dense_h_to_4h, "W_out": blk.mlp.dense_4h_to_h},
        }
    if family in ("llama", "qwen2"):
        blk = model.model.layers[layer]
        kv = c.num_key_value_heads

        def qkv(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            a = blk.self_attn
            return (
                _split_heads(a.q_proj(x), n),
                _split_heads(a.k_proj(x), kv),
                _split_heads(a.v_proj(x), kv),
            )

        return {
            "qkv": qkv,
            "o": blk.self_attn.o_proj,
            "norms": {"ln1": blk.input_layernorm, "ln2": blk.post_attention_layernorm},
            "mlp": {
                "W_in": blk.mlp.up_proj,
                "W_gate": blk.mlp.gate_proj,
                "W_out": blk.mlp.down_proj,
            },
        }
    bert = model.bert if hasattr(model, "bert") else model
    blk = bert.encoder.layer[layer]

    def qkv(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = blk.attention.self
        return tuple(_split_heads(m(x), n) for m in (s.query, s.key, s.value))

    return {
        "qkv": qkv,
        "o": blk.attention.output.dense,
        "norms": {"ln1": blk.attention.output.LayerNorm, "ln2": blk.output.LayerNorm},
        "mlp": {"W_in": blk.intermediate.dense, "W_out": blk.output.dense},
    }


def _bias(w: Any, name: str, width: int) -> torch.Tensor:
    return w.get(name) if w.has(name) else torch.zeros(width)


@pytest.mark.parametrize("family", list(FIXTURES))
def test_canonical_tensors_reproduce_hf_modules(
    request: pytest.FixtureRequest, family: str
) -> None:
    path, model = _fixture(request, family)
    w = torch_weights(load_model(path, raw=True).weights)
    cfg = w.cfg
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, cfg.d_model, generator=gen)
    with torch.no_grad():
        for layer in range(cfg.n_layers):
            parts = hf_layer_parts(family, model, layer)
            a = f"blocks.{layer}."
            hf_q, hf_k, hf_v = parts["qkv"](x)
            for x_name, ref in (("Q", hf_q), ("K", hf_k), ("V", hf_v)):
                W, b = w.get(f"{a}attn.W_{x_name}"), w.get(f"{a}attn.b_{x_name}")
                assert W.shape == (cfg.n_heads, cfg.d_model, cfg.d_head)
                for h in range(cfg.n_heads):
                    stored = cfg.kv_head_of(h) if x_name != "Q" else h
                    ours = x @ W[h] + b[h]
                    torch.testing.assert_close(ours, ref[stored], atol=ATOL, rtol=0)
                    # get_head reads the same values as the full tensor
                    torch.testing.assert_close(
                        w.get_head(f"{a}attn.W_{x_name}", h), W[h], atol=0, rtol=0
                    )
                    torch.testing.assert_close(
                        w.get_head(f"{a}attn.b_{x_name}", h), b[h], atol=0, rtol=0
                    )
            # Output projection: the sum over heads of z_h @ W_O[h] + b_O is HF's o_proj(z).
            z = torch.randn(5, cfg.n_heads * cfg.d_head, generator=gen)
            W_O = w.get(f"{a}attn.W_O")
            ours = torch.einsum("phd,hdm->pm", z.view(5, cfg.n_heads, cfg.d_head), W_O)
            ours = ours + _bias(w, f"{a}attn.b_O", cfg.d_model)
            torch.testing.assert_close(ours, parts["o"](z), atol=ATOL, rtol=0)
            for h in range(cfg.n_heads):
                torch.testing.assert_close(w.get_head(f"{a}attn.W_O", h), W_O[h], atol=0, rtol=0)
            for name, module in parts["norms"].items():
                torch.testing.assert_close(w.get(f"{a}{name}.w"), module.weight, atol=0, rtol=0)
                if getattr(module, "bias", None) is not None:
                    torch.testing.assert_close(w.get(f"{a}{name}.b"), module.bias, atol=0, rtol=0)
                else:
                    assert not w.has(f"{a}{name}.b")
            for name, module in parts["mlp"].items():
                xin = torch.randn(
                    5, module.weight.shape[1 if family != "gpt2" else 0], generator=gen
                )
                b_name = {"W_in": "b_in", "W_out": "b_out"}.get(name)
                ours = xin @ w.get(f"{a}mlp.{name}")
                if b_name is not None:
                    ours = ours + w.get(f"{a}mlp.{b_name}")
                torch.testing.assert_close(ours, module(xin), atol=ATOL, rtol=0)
        torch.testing.assert_close(
            w.get("embed.W_E"), model.get_input_embeddings().weight, atol=0, rtol=0
        )
        head = model.get_output_embeddings()
        if head is not None and family != "bert_mlm":
            torch.testing.assert_close(
                x @ w.get("unembed.W_U") + w.get("unembed.b_U"), head(x), atol=ATOL, rtol=0
            )


def _hf_log_probs(family: str, model: Any, tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        if family == "bert_base":
            return torch.log_softmax(
                model(ids).last_hidden_state @ model.get_input_embeddings().weight.T, -1
            )
        return torch.log_softmax(model(ids).logits.float(), -1)


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "processed"])
@pytest.mark.parametrize("family", list(FIXTURES))
def test_open_model_forward_matches_transformers(
    request: pytest.FixtureRequest, family: str, raw: bool
) -> None:
    """End to end: loading (+ processing) + engine.forward reproduce transformers."""
    path, model = _fixture(request, family)
    m = load_model(path, raw=raw)
    ours = log_probs(run(m.weights, TOKENS))[0]
    torch.testing.assert_close(ours, _hf_log_probs(family, model, TOKENS)[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", list(FIXTURES))
def test_structure_matches_model_and_counts_hf_parameters(
    request: pytest.FixtureRequest, family: str
) -> None:
    path, model = _fixture(request, family)
    s = read_structure(path)
    m = load_model(path)
    assert s == m.structure()
    assert s["n_params"] == sum(p.numel() for p in model.parameters())
    c = model.config
    assert (s["n_layers"], s["n_heads"], s["d_model"], s["d_vocab"]) == (
        c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.vocab_size
    )  # fmt: skip
    assert s["n_kv_heads"] == getattr(c, "num_key_value_heads", c.num_attention_heads)
    assert s["format"] == "hf" and s["processed"] and s["dtype"] == "float32"
    assert m.with_raw(True).structure()["processed"] is False


def test_family_specific_config(
    neox_dir: tuple[Path, Any], llama_dir: tuple[Path, Any], qwen2_dir: tuple[Path, Any]
) -> None:
    neox = load_model(neox_dir[0], raw=True).cfg
    assert neox.rotary_dim == 2 and neox.parallel_attn_mlp and neox.positional == "rotary"
    llama = load_model(llama_dir[0], raw=True).cfg
    assert (llama.n_kv_heads, llama.gated_mlp, llama.normalization, llama.tied_unembed) == (
        2,
        True,
        "RMS",
        False,
    )
    qwen = load_model(qwen2_dir[0], raw=True).cfg
    assert qwen.family == "qwen2" and qwen.tied_unembed


def _rewrite_config(src: Path, dst: Path, edit: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_old_and_new_config_spellings_agree(
    tmp_path: Path, neox_dir: tuple[Path, Any], llama_dir: tuple[Path, Any]
) -> None:
    """Checkpoints on disk use the old keys (rotary_pct, rotary_emb_base, rope_theta,
    torch_dtype), fresh save_pretrained output the new rope_parameters; both are read."""

    def neox_old(c: dict[str, Any]) -> None:
        rope = c.pop("rope_parameters")
        c["rotary_pct"] = rope["partial_rotary_factor"] * 2  # a different value: proves it is read
        c["rotary_emb_base"] = 777.0
        c["torch_dtype"] = c.pop("dtype")

    new = load_model(neox_dir[0], raw=True).cfg
    old = load_model(_rewrite_config(neox_dir[0], tmp_path / "neox_old", neox_old), raw=True).cfg
    assert (new.rotary_dim, new.rotary_base) == (2, 10000.0)
    assert (old.rotary_dim, old.rotary_base) == (4, 777.0)

    def llama_old(c: dict[str, Any]) -> None:
        c.pop("rope_parameters")
        c["rope_theta"] = 500000.0

    assert (
        load_model(
            _rewrite_config(llama_dir[0], tmp_path / "llama_old", llama_old)
        ).raw_cfg.rotary_base
        == 500000.0
    )


def test_sharded_equals_single_file(tmp_path: Path) -> None:
    single, _ = hf.build_llama(tmp_path / "single", seed=7)
    sharded, _ = hf.build_llama(tmp_path / "sharded", seed=7, shard=True)
    assert (
        len(list(sharded.glob("*.safetensors"))) > 1
        and (sharded / "model.safetensors.index.json").exists()
    )
    a, b = load_model(single, raw=True), load_model(sharded, raw=True)
    assert len(set(b.checkpoint.files.values())) > 1
    assert read_structure(single) | {"path": ""} == read_structure(sharded) | {"path": ""}
    for name in a.checkpoint.specs:
        torch.testing.assert_close(a.weights.get(name), b.weights.get(name), atol=0, rtol=0)
    torch.testing.assert_close(
        a.weights.get_head("blocks.1.attn.W_K", 3), b.weights.get_head("blocks.1.attn.W_K", 3)
    )


def test_bf16_checkpoint_is_read_as_float32_and_stays_bf16_on_disk(tmp_path: Path) -> None:
    path, model = hf.build_gpt2(tmp_path / "bf16", dtype="bfloat16")
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.iterdir()}
    header = read_header(path / "model.safetensors")
    assert {t.dtype for t in header.tensors.values()} == {"BF16"}
    m = load_model(path, raw=True)
    assert m.structure()["dtype"] == "bfloat16"
    W_Q = torch_weights(m.weights).get("blocks.0.attn.W_Q")
    assert W_Q.dtype == torch.float32
    assert torch_weights(m.weights).get_head("blocks.0.attn.W_Q", 1).dtype == torch.float32
    ref = model.transformer.h[0].attn.c_attn.weight[:, :32].reshape(32, 4, 8).permute(1, 0, 2)
    torch.testing.assert_close(W_Q, ref.detach(), atol=0, rtol=0)
    log_probs(run(load_model(path).weights, TOKENS))  # processed forward runs on bf16 weights
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.iterdir()}
    assert before == after  # nothing written next to the checkpoint, nothing rewritten


def test_read_structure_does_not_import_torch(gpt2_dir: tuple[Path, Any]) -> None:
    code = (
        "import sys, json; import engine; from engine import read_structure; "
        f"s = read_structure({str(gpt2_dir[0])!r}); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(json.dumps(s))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["architecture"] == "GPT2LMHeadModel"


def test_single_safetensors_file_with_config_beside_it(gpt2_dir: tuple[Path, Any]) -> None:
    s = read_structure(gpt2_dir[0] / "model.safetensors")
    assert s["architecture"] == "GPT2LMHeadModel" and s["path"].endswith("model.safetensors")
    assert read_structure(gpt2_dir[0] / "config.json")["n_params"] == s["n_params"]


# --- native format ------------------------------------------------------------------------


def _canonical(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    m = load_model(path, raw=True)
    fields = {k: v for k, v in m.raw_cfg.to_dict().items() if k != "extra"}
    return fields, {n: torch_weights(m.weights).get(n).clone() for n in m.checkpoint.specs}


# --- tokenizers ------------------------------------------------------------------------
