"""Parity of engine.forward with transformers on the tiny random checkpoints of every family.

Two routes, so a failure points at its cause:
- ``hf_to_canonical`` (below) converts the in-memory ``transformers`` model to canonical
  tensors independently of the loaders: this checks the forward pass alone;
- ``load_model(path)`` (engine.model.loading) checks loading + processing + forward.
Both are compared with ``transformers`` run eagerly with ``output_attentions=True``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headscope.engine.core.config import ModelConfig
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.processing import ProcessedWeights
from headscope.engine.model.weights import DictWeights

# float32 against transformers' float32 forward in another summation order: ~u·64·2 ≈ 1e-5 of
# the terms' magnitude through 2 layers; 1e-4 of the reference's magnitude (at least 1: log-probs
# and logits of O(1..10)); ``_assert_close`` scales it.
TOL = 1e-4
SEQS = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5, 60, 61, 62],
                     [95, 0, 17, 17, 17, 40, 3, 2, 1, 88, 47, 46, 45, 44, 5, 5, 9]])


# -- independent HF -> canonical conversion (test-only) -----------------------------------


def _heads_in(W: torch.Tensor, n: int) -> torch.Tensor:
    """nn.Linear weight [n*d_head, d_model] -> [n, d_model, d_head]."""
    return W.reshape(n, -1, W.shape[1]).transpose(1, 2).contiguous()


def _heads_out(W: torch.Tensor, n: int) -> torch.Tensor:
    """nn.Linear weight [d_model, n*d_head] (output projection) -> [n, d_head, d_model]."""
    return W.T.reshape(n, -1, W.shape[0]).contiguous()


def _expand(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    return torch.repeat_interleave(t, n_heads // t.shape[0], dim=0)


def hf_to_canonical(family: str, model: Any) -> DictWeights:
    """Canonical float32 tensors + ModelConfig from a transformers model (no engine.model.loading)."""
    c = model.config
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    d, L, H = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    e = d // H
    t: dict[str, torch.Tensor] = {}
    zeros_h = torch.zeros(H, e)
    if family == "gpt2":
        cfg = ModelConfig(family="gpt2", architecture="GPT2LMHeadModel", n_layers=L, n_heads=H,
                          d_model=d, d_head=e, d_vocab=c.vocab_size, n_ctx=c.n_positions,
                          d_mlp=c.n_inner, act_fn=c.activation_function,
                          norm_eps=c.layer_norm_epsilon, positional="learned")
        t["embed.W_E"], t["pos_embed.W_pos"] = sd["transformer.wte.weight"], sd["transformer.wpe.weight"]
        for i_l in range(L):
            p = f"transformer.h.{i_l}."
            Wqkv, bqkv = sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"]  # Conv1D: x @ W
            for i, n in enumerate("QKV"):
                t[f"blocks.{i_l}.attn.W_{n}"] = Wqkv[:, i * d:(i + 1) * d].reshape(d, H, e).permute(1, 0, 2)
                t[f"blocks.{i_l}.attn.b_{n}"] = bqkv[i * d:(i + 1) * d].reshape(H, e)
            t[f"blocks.{i_l}.attn.W_O"] = sd[p + "attn.c_proj.weight"].reshape(H, e, d)
            t[f"blocks.{i_l}.attn.b_O"] = sd[p + "attn.c_proj.bias"]
            t[f"blocks.{i_l}.mlp.W_in"], t[f"blocks.{i_l}.mlp.b_in"] = sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"]
            t[f"blocks.{i_l}.mlp.W_out"], t[f"blocks.{i_l}.mlp.b_out"] = sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"]
            for ln, hf in (("ln1", "ln_1"), ("ln2", "ln_2")):
                t[f"blocks.{i_l}.{ln}.w"], t[f"blocks.{i_l}.{ln}.b"] = sd[p + hf + ".weight"], sd[p + hf + ".bias"]
        t["ln_final.w"], t["ln_final.b"] = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
        t["unembed.W_U"] = sd["lm_head.weight"].T
    elif family == "neox":
        rot = int(e * c.rope_parameters.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0)))
        cfg = ModelConfig(family="neox", architecture="GPTNeoXForCausalLM", n_layers=L, n_heads=H,
                          d_model=d, d_head=e, d_vocab=c.vocab_size, n_ctx=c.max_position_embeddings,
                          d_mlp=c.intermediate_size, act_fn=c.hidden_act, norm_eps=c.layer_norm_eps,
                          positional="rotary", rotary_dim=rot,
                          rotary_base=c.rope_parameters["rope_theta"],
                          parallel_attn_mlp=c.use_parallel_residual)
        t["embed.W_E"] = sd["gpt_neox.embed_in.weight"]
        for i_l in range(L):
            p = f"gpt_neox.layers.{i_l}."
            # query_key_value's outputs are laid out [head, (q|k|v), d_head]
            Wqkv = sd[p + "attention.query_key_value.weight"].reshape(H, 3, e, d)
            bqkv = sd[p + "attention.query_key_value.bias"].reshape(H, 3, e)
            for i, n in enumerate("QKV"):
                t[f"blocks.{i_l}.attn.W_{n}"] = Wqkv[:, i].transpose(1, 2)
                t[f"blocks.{i_l}.attn.b_{n}"] = bqkv[:, i]
            t[f"blocks.{i_l}.attn.W_O"] = _heads_out(sd[p + "attention.dense.weight"], H)
            t[f"blocks.{i_l}.attn.b_O"] = sd[p + "attention.dense.bias"]
            t[f"blocks.{i_l}.mlp.W_in"], t[f"blocks.{i_l}.mlp.b_in"] = sd[p + "mlp.dense_h_to_4h.weight"].T, sd[p + "mlp.dense_h_to_4h.bias"]
            t[f"blocks.{i_l}.mlp.W_out"], t[f"blocks.{i_l}.mlp.b_out"] = sd[p + "mlp.dense_4h_to_h.weight"].T, sd[p + "mlp.dense_4h_to_h.bias"]
            for ln, hf in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
                t[f"blocks.{i_l}.{ln}.w"], t[f"blocks.{i_l}.{ln}.b"] = sd[p + hf + ".weight"], sd[p + hf + ".bias"]
        t["ln_final.w"], t["ln_final.b"] = sd["gpt_neox.final_layer_norm.weight"], sd["gpt_neox.final_layer_norm.bias"]
        t["unembed.W_U"] = sd.get("embed_out.weight", sd.get("lm_head.weight")).T  # transformers 5 renamed it
    elif family in ("llama", "qwen2", "mistral"):
        kv = c.num_key_value_heads
        rope = dict(c.rope_parameters)
        extra = {"rope_type": rope.get("rope_type", "default"), "rope_scaling": rope,
                 "sliding_window": c.to_dict().get("sliding_window") if c.to_dict().get("use_sliding_window", True) else None}
        cfg = ModelConfig(family="llama" if family == "mistral" else family,
                          architecture=type(model).__name__, n_layers=L, n_heads=H, n_kv_heads=kv, d_model=d, d_head=e, d_vocab=c.vocab_size,
                          n_ctx=c.max_position_embeddings, d_mlp=c.intermediate_size,
                          act_fn=c.hidden_act, gated_mlp=True, normalization="RMS",
                          norm_eps=c.rms_norm_eps, positional="rotary", rotary_dim=e,
                          rotary_base=c.rope_parameters["rope_theta"], extra=extra)
        t["embed.W_E"] = sd["model.embed_tokens.weight"]
        for i_l in range(L):
            p = f"model.layers.{i_l}."
            for n, proj, n_h in (("Q", "q_proj", H), ("K", "k_proj", kv), ("V", "v_proj", kv)):
                t[f"blocks.{i_l}.attn.W_{n}"] = _expand(_heads_in(sd[p + f"self_attn.{proj}.weight"], n_h), H)
                bias = sd.get(p + f"self_attn.{proj}.bias")
                t[f"blocks.{i_l}.attn.b_{n}"] = zeros_h if bias is None else _expand(bias.reshape(n_h, e), H)
            t[f"blocks.{i_l}.attn.W_O"] = _heads_out(sd[p + "self_attn.o_proj.weight"], H)
            t[f"blocks.{i_l}.attn.b_O"] = torch.zeros(d)
            t[f"blocks.{i_l}.mlp.W_in"] = sd[p + "mlp.up_proj.weight"].T
            t[f"blocks.{i_l}.mlp.W_gate"] = sd[p + "mlp.gate_proj.weight"].T
            t[f"blocks.{i_l}.mlp.b_in"] = torch.zeros(c.intermediate_size)
            t[f"blocks.{i_l}.mlp.W_out"] = sd[p + "mlp.down_proj.weight"].T
            t[f"blocks.{i_l}.mlp.b_out"] = torch.zeros(d)
            t[f"blocks.{i_l}.ln1.w"] = sd[p + "input_layernorm.weight"]
            t[f"blocks.{i_l}.ln2.w"] = sd[p + "post_attention_layernorm.weight"]
        t["ln_final.w"] = sd["model.norm.weight"]
        t["unembed.W_U"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).T
    elif family in ("bert_mlm", "bert_base"):
        mlm = family == "bert_mlm"
        pre = "bert." if mlm else ""
        cfg = ModelConfig(family="bert", architecture=type(model).__name__, n_layers=L, n_heads=H,
                          d_model=d, d_head=e, d_vocab=c.vocab_size, n_ctx=c.max_position_embeddings,
                          d_mlp=c.intermediate_size, act_fn=c.hidden_act, norm_eps=c.layer_norm_eps,
                          positional="learned", causal=False, post_ln=True,
                          tied_unembed=not mlm, has_mlm_head=mlm)
        em = pre + "embeddings."
        t["embed.W_E"], t["pos_embed.W_pos"] = sd[em + "word_embeddings.weight"], sd[em + "position_embeddings.weight"]
        t["embed.W_token_type"] = sd[em + "token_type_embeddings.weight"]
        t["embed.ln.w"], t["embed.ln.b"] = sd[em + "LayerNorm.weight"], sd[em + "LayerNorm.bias"]
        for i_l in range(L):
            p = f"{pre}encoder.layer.{i_l}."
            for n, proj in (("Q", "query"), ("K", "key"), ("V", "value")):
                t[f"blocks.{i_l}.attn.W_{n}"] = _heads_in(sd[p + f"attention.self.{proj}.weight"], H)
                t[f"blocks.{i_l}.attn.b_{n}"] = sd[p + f"attention.self.{proj}.bias"].reshape(H, e)
            t[f"blocks.{i_l}.attn.W_O"] = _heads_out(sd[p + "attention.output.dense.weight"], H)
            t[f"blocks.{i_l}.attn.b_O"] = sd[p + "attention.output.dense.bias"]
            t[f"blocks.{i_l}.ln1.w"], t[f"blocks.{i_l}.ln1.b"] = sd[p + "attention.output.LayerNorm.weight"], sd[p + "attention.output.LayerNorm.bias"]
            t[f"blocks.{i_l}.mlp.W_in"], t[f"blocks.{i_l}.mlp.b_in"] = sd[p + "intermediate.dense.weight"].T, sd[p + "intermediate.dense.bias"]
            t[f"blocks.{i_l}.mlp.W_out"], t[f"blocks.{i_l}.mlp.b_out"] = sd[p + "output.dense.weight"].T, sd[p + "output.dense.bias"]
            t[f"blocks.{i_l}.ln2.w"], t[f"blocks.{i_l}.ln2.b"] = sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"]
        if mlm:
            tr = "cls.predictions.transform."
            t["mlm.W"], t["mlm.b"] = sd[tr + "dense.weight"].T, sd[tr + "dense.bias"]
            t["mlm.ln.w"], t["mlm.ln.b"] = sd[tr + "LayerNorm.weight"], sd[tr + "LayerNorm.bias"]
            t["unembed.W_U"] = sd["cls.predictions.decoder.weight"].T
            t["unembed.b_U"] = sd["cls.predictions.bias"]
        else:
            t["unembed.W_U"] = t["embed.W_E"].T
    else:
        raise AssertionError(family)
    t.setdefault("unembed.b_U", torch.zeros(cfg.d_vocab))
    return DictWeights(cfg, {k: v.contiguous() for k, v in t.items()})


# -- the reference: transformers itself ---------------------------------------------------


def hf_reference(family: str, model: Any, tokens: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(log-probs or None for BertModel, patterns [batch, layer, head, q, k]) from transformers."""
    model.config._attn_implementation = "eager"  # output_attentions needs the eager path
    with torch.no_grad():
        out = model(input_ids=tokens, output_attentions=True)
    patterns = torch.stack(out.attentions, dim=1)
    if family == "bert_base":
        return None, patterns
    return torch.log_softmax(out.logits.float(), dim=-1), patterns


FAMILY_NAMES = ["gpt2", "neox", "llama", "qwen2", "bert_mlm", "bert_base"]


@pytest.fixture(params=FAMILY_NAMES)
def family(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    """(family, checkpoint dir, transformers model) built once per session by conftest."""
    path, model = request.getfixturevalue(f"{request.param}_dir")
    return request.param, path, model


def _assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = (a - b).abs().max().item()
    scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0  # relative beyond magnitude 1
    assert err < TOL * scale, f"{what}: max abs diff {err:.2e} >= {TOL} x {scale:.3g}"


def test_forward_matches_transformers(family: tuple[str, Any, Any]) -> None:
    name, _, model = family
    w = hf_to_canonical(name, model)
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    res = run(w, SEQS)
    _assert_close(res.patterns, ref_pat, f"{name} patterns")
    if ref_lp is not None:
        _assert_close(log_probs(res), ref_lp, f"{name} log-probs")
    # The fixtures must be strong enough that the comparison means something: patterns far
    # from uniform (HF's default 0.02 init would leave them near 1/pos).
    assert ref_pat.max() > 0.9


def test_processed_forward_matches_transformers(family: tuple[str, Any, Any]) -> None:
    name, _, model = family
    w = ProcessedWeights(hf_to_canonical(name, model))
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    res = run(w, SEQS)
    _assert_close(res.patterns, ref_pat, f"{name} processed patterns")
    if ref_lp is not None:
        _assert_close(log_probs(res), ref_lp, f"{name} processed log-probs")


def test_single_sequence_is_batch_of_one(gpt2_dir: tuple[Any, Any]) -> None:
    w = hf_to_canonical("gpt2", gpt2_dir[1])
    one = run(w, SEQS[1].tolist())
    both = run(w, SEQS)
    assert one.logits.shape == (1, SEQS.shape[1], w.cfg.d_vocab)
    _assert_close(one.logits[0], both.logits[1], "batch row vs single")


# -- end to end: checkpoint on disk -> engine.model.loading -> (processing) -> forward -----------


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "processed"])
def test_open_model_forward_matches_transformers(family: tuple[str, Any, Any], raw: bool) -> None:
    from headscope.engine.model.loading import load_model

    name, path, model = family
    m = load_model(path, raw=raw)
    assert isinstance(m.weights, ProcessedWeights) != raw
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    res = run(m.weights, SEQS)
    _assert_close(res.patterns, ref_pat, f"{name} patterns via load_model")
    if ref_lp is not None:
        _assert_close(log_probs(res), ref_lp, f"{name} log-probs via load_model")


def test_loaded_canonical_tensors_agree_with_independent_conversion(family: tuple[str, Any, Any]) -> None:
    """The adapters and this file's converter agree tensor by tensor (localises failures)."""
    from headscope.engine.model.loading import load_model

    name, path, model = family
    ours = hf_to_canonical(name, model)
    loaded = torch_weights(load_model(path, raw=True).weights)
    for key in ours._t:
        assert loaded.has(key), f"{name}: loader lacks {key}"
        _assert_close(loaded.get(key), torch_weights(ours).get(key), f"{name} {key}")


# -- RoPE scaling and sliding windows: features real Llama 3 / Mistral checkpoints use --------


def _rope_variant(kind: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    from tests.hf_fixtures import D_MLP, D_MODEL, N_CTX, N_HEADS, N_LAYERS, VOCAB, randomize_

    common = dict(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_MLP,
                  num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, num_key_value_heads=2,
                  max_position_embeddings=N_CTX, rms_norm_eps=1e-6, hidden_act="silu")
    if kind == "mistral_window":  # window 5 < the 17-token test sequences
        model = MistralForCausalLM(MistralConfig(sliding_window=5, **common))
    else:
        # Tiny original context so the scaling changes frequencies that matter at 17 positions.
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        if kind == "llama_linear":
            rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
        model = LlamaForCausalLM(LlamaConfig(rope_parameters=rope, **common))
    return randomize_(model, seed=11)


@pytest.mark.parametrize("kind", ["llama3_rope", "llama_linear", "mistral_window"])
def test_rope_scaling_and_sliding_window_match_transformers(kind: str) -> None:
    model = _rope_variant(kind)
    w = hf_to_canonical("mistral" if kind == "mistral_window" else "llama", model)
    ref_lp, ref_pat = hf_reference("llama", model, SEQS)
    for weights in (w, ProcessedWeights(w)):
        res = run(weights, SEQS)
        _assert_close(res.patterns, ref_pat, f"{kind} patterns")
        _assert_close(log_probs(res), ref_lp, f"{kind} log-probs")
    # The feature is really exercised: ignoring it gives different patterns.
    plain = DictWeights(w.cfg.replace(extra={}), w._t)
    assert (run(plain, SEQS).patterns - ref_pat).abs().max() > 1e-3


def test_unsupported_rope_scaling_is_a_config_error() -> None:
    from headscope.engine.core.errors import ConfigError

    w = hf_to_canonical("llama", _rope_variant("llama3_rope"))
    for extra in ({"rope_type": "yarn"}, {"rope_type": "llama3"}, {"rotary_style": "interleaved"}):
        with pytest.raises(ConfigError):
            run(DictWeights(w.cfg.replace(extra=extra), w._t), [1, 2, 3])


def test_llama3_rope_scaling_through_open_model(tmp_path) -> None:
    """A Llama checkpoint with llama3 RoPE scaling loads and matches transformers end to end
    (the adapter must carry the scaling parameters to the forward pass)."""
    import json

    import transformers

    from headscope.engine.forward.transformer import log_probs, run
    from headscope.engine.model.loading import load_model
    from tests.hf_fixtures import randomize_

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
    )
    hf = randomize_(transformers.LlamaForCausalLM(cfg), seed=7).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "llama3" in json.dumps(saved)
    tokens = torch.tensor([[3, 9, 1, 40, 2, 7, 7, 30, 11, 5, 60, 4]])
    with torch.inference_mode():
        ref = hf(tokens).logits.log_softmax(-1)
    ours = log_probs(run(load_model(tmp_path).weights, tokens))
    assert torch.allclose(ours, ref, atol=TOL, rtol=TOL)  # log-probs of O(5): TOL of their magnitude


# -- gated MLP bias: TransformerLens' GatedMLP adds b_in after the gate ----------------------


def _tl_gated_state(llama_path: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The llama fixture as a TransformerLens config + state dict, with a non-zero ``b_in``."""
    from headscope.engine.model.loading import load_model
    from headscope.engine.model.tl_compat import to_transformer_lens

    tl_cfg, arrays = to_transformer_lens(load_model(llama_path, raw=True).weights)
    state = {k: torch.tensor(v) for k, v in arrays.items()}  # as load_state_dict takes them
    g = torch.Generator().manual_seed(0)
    for layer in range(tl_cfg["n_layers"]):
        state[f"blocks.{layer}.mlp.b_in"] = torch.randn(tl_cfg["d_mlp"], generator=g)
    return tl_cfg, state


def test_gated_mlp_bias_follows_transformer_lens(llama_dir: tuple[Any, Any]) -> None:
    from headscope.engine.forward.transformer import activation, mlp
    from headscope.engine.model.tl_compat import from_transformer_lens

    tl_cfg, state = _tl_gated_state(llama_dir[0])
    w = from_transformer_lens(tl_cfg, state)
    assert w.cfg.gated_mlp
    x = torch.randn(2, 5, tl_cfg["d_model"], generator=torch.Generator().manual_seed(1))
    act = activation(tl_cfg["act_fn"])
    for layer in range(tl_cfg["n_layers"]):
        p = {n: state[f"blocks.{layer}.mlp.{n}"] for n in ("W_gate", "W_in", "b_in", "W_out", "b_out")}
        # TransformerLens GatedMLP.forward: post = act(x W_gate) * (x W_in) + b_in
        ref = (act(x @ p["W_gate"]) * (x @ p["W_in"]) + p["b_in"]) @ p["W_out"] + p["b_out"]
        _assert_close(mlp(w, layer, x), ref, f"gated MLP of layer {layer}")


def test_gated_mlp_bias_is_a_constant_output_in_the_whole_model(llama_dir: tuple[Any, Any]) -> None:
    """After the gate, ``b_in`` adds the constant ``b_in W_out``: moving it into ``b_out``
    leaves the logits unchanged (it would not if ``b_in`` were inside the gated product)."""
    from headscope.engine.model.tl_compat import from_transformer_lens

    tl_cfg, state = _tl_gated_state(llama_dir[0])
    moved = dict(state)
    for layer in range(tl_cfg["n_layers"]):
        p = f"blocks.{layer}.mlp."
        moved[p + "b_out"] = state[p + "b_out"] + state[p + "b_in"] @ state[p + "W_out"]
        moved[p + "b_in"] = torch.zeros_like(state[p + "b_in"])
    with_bias = run(from_transformer_lens(tl_cfg, state), SEQS).logits
    _assert_close(with_bias, run(from_transformer_lens(tl_cfg, moved), SEQS).logits, "moved b_in")
    # and the bias does matter (the check above is not vacuous)
    unbiased = dict(state, **{k: torch.zeros_like(v) for k, v in state.items() if k.endswith("mlp.b_in")})
    assert (with_bias - run(from_transformer_lens(tl_cfg, unbiased), SEQS).logits).abs().max() > 0.1
