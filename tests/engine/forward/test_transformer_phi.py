"""Parity with transformers for Phi-3, Phi, GPT-J and OPT (as tests/engine/forward/test_transformer.py).

Two routes, so a failure points at its cause: ``to_canonical`` (below) converts the in-memory
``transformers`` model independently of the adapters (forward pass alone), and
``load_model(path)`` checks adapter + loading + processing + forward. Logits and attention
patterns must match ``transformers`` (eager, ``output_attentions=True``) to 1e-4, raw and
processed.
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
from tests.engine.forward.test_transformer import (
    SEQS,
    _assert_close,
    _expand,
    _heads_in,
    _heads_out,
    hf_reference,
)
from tests.hf_fixtures_phi import (  # noqa: F401  (pytest fixtures)
    build_phi3,
    gptj_dir,
    opt_dir,
    opt_post_ln_dir,
    phi3_dir,
    phi_dir,
)

NAMES = ["phi3", "phi", "gptj", "opt", "opt_post_ln"]


def _sd(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def _phi3(model: Any) -> DictWeights:
    c, sd = model.config, _sd(model)
    d, L, H, kv = c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
    e, ff = d // H, c.intermediate_size
    rope = dict(c.rope_parameters)
    cfg = ModelConfig(family="phi3", architecture="Phi3ForCausalLM", n_layers=L, n_heads=H,  # type: ignore[arg-type]
                      n_kv_heads=kv, d_model=d, d_head=e, d_vocab=c.vocab_size,
                      n_ctx=c.max_position_embeddings, d_mlp=ff, act_fn=c.hidden_act, gated_mlp=True,
                      normalization="RMS", norm_eps=c.rms_norm_eps, positional="rotary",
                      rotary_dim=int(e * rope.get("partial_rotary_factor", 1.0)),
                      rotary_base=rope["rope_theta"], extra={"sliding_window": c.sliding_window})
    t = {"embed.W_E": sd["model.embed_tokens.weight"], "ln_final.w": sd["model.norm.weight"],
         "unembed.W_U": sd["lm_head.weight"].T}
    for i in range(L):
        p, a = f"model.layers.{i}.", f"blocks.{i}."
        q, k, v = sd[p + "self_attn.qkv_proj.weight"].split([H * e, kv * e, kv * e])
        for n, w, n_h in (("Q", q, H), ("K", k, kv), ("V", v, kv)):
            t[f"{a}attn.W_{n}"] = _expand(_heads_in(w, n_h), H)
            t[f"{a}attn.b_{n}"] = torch.zeros(H, e)
        t[f"{a}attn.W_O"], t[f"{a}attn.b_O"] = _heads_out(sd[p + "self_attn.o_proj.weight"], H), torch.zeros(d)
        gate, up = sd[p + "mlp.gate_up_proj.weight"].chunk(2, dim=0)
        t[f"{a}mlp.W_gate"], t[f"{a}mlp.W_in"], t[f"{a}mlp.b_in"] = gate.T, up.T, torch.zeros(ff)
        t[f"{a}mlp.W_out"], t[f"{a}mlp.b_out"] = sd[p + "mlp.down_proj.weight"].T, torch.zeros(d)
        t[f"{a}ln1.w"], t[f"{a}ln2.w"] = sd[p + "input_layernorm.weight"], sd[p + "post_attention_layernorm.weight"]
    return DictWeights(cfg, t)


def _rope(c: Any) -> tuple[float, float]:
    rope = dict(c.rope_parameters)
    return rope.get("partial_rotary_factor", 1.0), rope["rope_theta"]


def _phi(model: Any) -> DictWeights:
    c, sd = model.config, _sd(model)
    d, L, H = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    e, ff = d // H, c.intermediate_size
    pct, theta = _rope(c)
    cfg = ModelConfig(family="phi", architecture="PhiForCausalLM", n_layers=L, n_heads=H,  # type: ignore[arg-type]
                      d_model=d, d_head=e, d_vocab=c.vocab_size, n_ctx=c.max_position_embeddings,
                      d_mlp=ff, act_fn=c.hidden_act, norm_eps=c.layer_norm_eps, positional="rotary",
                      rotary_dim=int(e * pct), rotary_base=theta, parallel_attn_mlp=True)
    t = {"embed.W_E": sd["model.embed_tokens.weight"], "ln_final.w": sd["model.final_layernorm.weight"],
         "ln_final.b": sd["model.final_layernorm.bias"], "unembed.W_U": sd["lm_head.weight"].T,
         "unembed.b_U": sd["lm_head.bias"]}
    for i in range(L):
        p, a = f"model.layers.{i}.", f"blocks.{i}."
        for n, proj in (("Q", "q_proj"), ("K", "k_proj"), ("V", "v_proj")):
            t[f"{a}attn.W_{n}"] = _heads_in(sd[p + f"self_attn.{proj}.weight"], H)
            t[f"{a}attn.b_{n}"] = sd[p + f"self_attn.{proj}.bias"].reshape(H, e)
        t[f"{a}attn.W_O"], t[f"{a}attn.b_O"] = _heads_out(sd[p + "self_attn.dense.weight"], H), sd[p + "self_attn.dense.bias"]
        t[f"{a}mlp.W_in"], t[f"{a}mlp.b_in"] = sd[p + "mlp.fc1.weight"].T, sd[p + "mlp.fc1.bias"]
        t[f"{a}mlp.W_out"], t[f"{a}mlp.b_out"] = sd[p + "mlp.fc2.weight"].T, sd[p + "mlp.fc2.bias"]
        for ln in ("ln1", "ln2"):
            t[f"{a}{ln}.w"], t[f"{a}{ln}.b"] = sd[p + "input_layernorm.weight"], sd[p + "input_layernorm.bias"]
    return DictWeights(cfg, t)


def _rotate_half_order(e: int, r: int) -> torch.Tensor:
    """GPT-J pairs dims (2i, 2i+1) of the first r; rotate-half pairs (i, i + r/2)."""
    return torch.tensor([2 * i for i in range(r // 2)] + [2 * i + 1 for i in range(r // 2)] + list(range(r, e)))


def _gptj(model: Any, reorder: bool = True) -> DictWeights:
    c, sd = model.config, _sd(model)
    d, L, H = c.n_embd, c.n_layer, c.n_head
    e, ff, r = d // H, c.n_inner, c.rotary_dim
    cfg = ModelConfig(family="gptj", architecture="GPTJForCausalLM", n_layers=L, n_heads=H,  # type: ignore[arg-type]
                      d_model=d, d_head=e, d_vocab=c.vocab_size, n_ctx=c.n_positions, d_mlp=ff,
                      act_fn=c.activation_function, norm_eps=c.layer_norm_epsilon, positional="rotary",
                      rotary_dim=r, parallel_attn_mlp=True)
    t = {"embed.W_E": sd["transformer.wte.weight"], "ln_final.w": sd["transformer.ln_f.weight"],
         "ln_final.b": sd["transformer.ln_f.bias"], "unembed.W_U": sd["lm_head.weight"].T,
         "unembed.b_U": sd["lm_head.bias"]}
    order = _rotate_half_order(e, r) if reorder else torch.arange(e)
    for i in range(L):
        p, a = f"transformer.h.{i}.", f"blocks.{i}."
        for n, proj in (("Q", "q_proj"), ("K", "k_proj"), ("V", "v_proj")):
            w = _heads_in(sd[p + f"attn.{proj}.weight"], H)
            t[f"{a}attn.W_{n}"] = w[..., order] if n != "V" else w
            t[f"{a}attn.b_{n}"] = torch.zeros(H, e)
        t[f"{a}attn.W_O"], t[f"{a}attn.b_O"] = _heads_out(sd[p + "attn.out_proj.weight"], H), torch.zeros(d)
        t[f"{a}mlp.W_in"], t[f"{a}mlp.b_in"] = sd[p + "mlp.fc_in.weight"].T, sd[p + "mlp.fc_in.bias"]
        t[f"{a}mlp.W_out"], t[f"{a}mlp.b_out"] = sd[p + "mlp.fc_out.weight"].T, sd[p + "mlp.fc_out.bias"]
        for ln in ("ln1", "ln2"):
            t[f"{a}{ln}.w"], t[f"{a}{ln}.b"] = sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]
    return DictWeights(cfg, t)


def _opt(model: Any) -> DictWeights:
    c, sd = model.config, _sd(model)
    d, L, H = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    e, ff, pre = d // H, c.ffn_dim, c.do_layer_norm_before
    cfg = ModelConfig(family="opt", architecture="OPTForCausalLM", n_layers=L, n_heads=H,  # type: ignore[arg-type]
                      d_model=d, d_head=e, d_vocab=c.vocab_size, n_ctx=c.max_position_embeddings,
                      d_mlp=ff, act_fn=c.activation_function, norm_eps=1e-5, positional="learned",
                      post_ln=not pre)
    dec = "model.decoder."
    t = {"embed.W_E": sd[dec + "embed_tokens.weight"],
         "pos_embed.W_pos": sd[dec + "embed_positions.weight"][2:],  # OPT's position offset
         "unembed.W_U": sd["lm_head.weight"].T}
    if pre:
        t["ln_final.w"], t["ln_final.b"] = sd[dec + "final_layer_norm.weight"], sd[dec + "final_layer_norm.bias"]
    for i in range(L):
        p, a = f"{dec}layers.{i}.", f"blocks.{i}."
        for n, proj in (("Q", "q_proj"), ("K", "k_proj"), ("V", "v_proj")):
            t[f"{a}attn.W_{n}"] = _heads_in(sd[p + f"self_attn.{proj}.weight"], H)
            t[f"{a}attn.b_{n}"] = sd[p + f"self_attn.{proj}.bias"].reshape(H, e)
        t[f"{a}attn.W_O"], t[f"{a}attn.b_O"] = _heads_out(sd[p + "self_attn.out_proj.weight"], H), sd[p + "self_attn.out_proj.bias"]
        t[f"{a}mlp.W_in"], t[f"{a}mlp.b_in"] = sd[p + "fc1.weight"].T, sd[p + "fc1.bias"]
        t[f"{a}mlp.W_out"], t[f"{a}mlp.b_out"] = sd[p + "fc2.weight"].T, sd[p + "fc2.bias"]
        t[f"{a}ln1.w"], t[f"{a}ln1.b"] = sd[p + "self_attn_layer_norm.weight"], sd[p + "self_attn_layer_norm.bias"]
        t[f"{a}ln2.w"], t[f"{a}ln2.b"] = sd[p + "final_layer_norm.weight"], sd[p + "final_layer_norm.bias"]
    return DictWeights(cfg, t)


CONVERTERS = {"phi3": _phi3, "phi": _phi, "gptj": _gptj, "opt": _opt, "opt_post_ln": _opt}


def to_canonical(name: str, model: Any) -> DictWeights:
    w = CONVERTERS[name](model)
    t = dict(w._t)
    t.setdefault("unembed.b_U", torch.zeros(w.cfg.d_vocab))
    return DictWeights(w.cfg, {k: v.contiguous() for k, v in t.items()})


@pytest.fixture(params=NAMES)
def family(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    if request.param not in CONVERTERS:
        pytest.skip(f"{request.param}: not converted yet")
    path, model = request.getfixturevalue(f"{request.param}_dir")
    return request.param, path, model


def _check(name: str, weights: Any, model: Any, what: str) -> None:
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    res = run(weights, SEQS)
    _assert_close(res.patterns, ref_pat, f"{name} {what} patterns")
    _assert_close(log_probs(res), ref_lp, f"{name} {what} log-probs")
    assert ref_pat.max() > 0.9  # far from uniform: the comparison means something


def test_forward_matches_transformers(family: tuple[str, Any, Any]) -> None:
    name, _, model = family
    w = to_canonical(name, model)
    _check(name, w, model, "raw")
    _check(name, ProcessedWeights(w), model, "processed")


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "processed"])
def test_open_model_matches_transformers(family: tuple[str, Any, Any], raw: bool) -> None:
    from headscope.engine.model.loading import load_model

    name, path, model = family
    m = load_model(path, raw=raw)
    assert isinstance(m.weights, ProcessedWeights) != raw
    _check(name, m.weights, model, "load_model raw" if raw else "load_model processed")


def test_loaded_tensors_agree_with_independent_conversion(family: tuple[str, Any, Any]) -> None:
    from headscope.engine.model.loading import load_model

    name, path, model = family
    ours = to_canonical(name, model)
    loaded = torch_weights(load_model(path, raw=True).weights)
    ours_t = torch_weights(ours)
    for key in ours._t:
        assert loaded.has(key), f"{name}: loader lacks {key}"
        _assert_close(loaded.get(key), ours_t.get(key), f"{name} {key}")
    for key in ("blocks.1.attn.W_Q", "blocks.1.attn.W_K", "blocks.0.attn.W_V", "blocks.0.attn.W_O"):
        for head in range(loaded.cfg.n_heads):  # per-head reads of fused / sliced tensors
            _assert_close(loaded.get_head(key, head), ours_t.get(key)[head], f"{name} {key}[{head}]")


def test_phi3_sliding_window_and_partial_rotary(tmp_path) -> None:
    """A Phi-3 with a window shorter than the prompt and partial rotary, end to end."""
    from headscope.engine.model.loading import load_model

    path, model = build_phi3(tmp_path, sliding_window=5, partial_rotary_factor=0.5)
    m = load_model(path)
    assert m.cfg.extra["sliding_window"] == 5 and m.cfg.rotary_dim == 4
    _check("phi3", m.weights, model, "window")
    no_window = DictWeights(m.raw_cfg.replace(extra={}), to_canonical("phi3", model)._t)
    assert (run(no_window, SEQS).patterns - hf_reference("phi3", model, SEQS)[1]).abs().max() > 1e-3


def test_gptj_interleaved_rotary_needs_the_reordering(request: pytest.FixtureRequest) -> None:
    """Read without the interleaved -> rotate-half reordering, GPT-J's patterns are wrong:
    the test above really exercises it."""
    _, model = request.getfixturevalue("gptj_dir")
    ref = hf_reference("gptj", model, SEQS)[1]
    assert (run(_gptj(model, reorder=False), SEQS).patterns - ref).abs().max() > 1e-2


# -- processing, circuits and the CLI on each family ------------------------------------------


def test_processing_equals_transformerlens_definitions(family: tuple[str, Any, Any]) -> None:
    """The lazily processed checkpoint equals tests/engine/model/test_processing.tl_process (TransformerLens'
    from_pretrained defaults, transcribed eagerly) applied to the raw canonical tensors."""
    from headscope.engine.model.loading import load_model
    from tests.engine.model.test_processing import tl_process

    name, path, _ = family
    raw = load_model(path, raw=True)
    processed = torch_weights(load_model(path).weights)
    expected = tl_process(raw.cfg, {k: torch_weights(raw.weights).get(k) for k in raw.checkpoint.specs})
    for key, want in expected.items():
        assert processed.has(key), f"{name}: {key}"
        torch.testing.assert_close(processed.get(key), want, rtol=1e-5, atol=1e-5, msg=f"{name} {key}")
    for key in ("blocks.1.attn.W_Q", "blocks.1.attn.W_K", "blocks.1.attn.b_Q"):
        for head in range(raw.cfg.n_heads):
            torch.testing.assert_close(processed.get_head(key, head), expected[key][head], rtol=1e-5,
                                       atol=1e-5, msg=f"{name} {key}[{head}]")


def _hf_head_qk(name: str, model: Any, layer: int, head: int) -> torch.Tensor:
    """W_Q W_Kᵀ of one head straight from the HF state dict (no reordering, no adapters)."""
    sd, H = _sd(model), model.config.num_attention_heads if name != "gptj" else model.config.n_head
    if name == "phi3":
        c = model.config
        e = c.hidden_size // H
        q, k, _ = sd[f"model.layers.{layer}.self_attn.qkv_proj.weight"].split(
            [H * e, c.num_key_value_heads * e, c.num_key_value_heads * e])
        wq, wk = q[head * e:(head + 1) * e], k[(head // (H // c.num_key_value_heads)) * e:][:e]
    else:
        pre = {"phi": "model.layers.{}.self_attn.", "gptj": "transformer.h.{}.attn.",
               "opt": "model.decoder.layers.{}.self_attn.", "opt_post_ln": "model.decoder.layers.{}.self_attn."}[name]
        p = pre.format(layer)
        wq_all, wk_all = sd[p + "q_proj.weight"], sd[p + "k_proj.weight"]
        e = wq_all.shape[0] // H
        wq, wk = wq_all[head * e:(head + 1) * e], wk_all[head * e:(head + 1) * e]
    return wq.T @ wk


def test_raw_qk_circuit_is_the_checkpoints(family: tuple[str, Any, Any]) -> None:
    """The raw QK circuit W_Q W_Kᵀ of every head is the checkpoint's (for GPT-J: the head-dim
    reordering cancels), read through Model.circuit."""
    from headscope.engine.api.model import open_model

    name, path, model = family
    m = open_model(path, raw=True)
    for layer, head in ((0, 0), (1, 3)):
        ours = m.circuit(layer, head, "qk")
        dense = torch.from_numpy(ours.A @ ours.B)
        _assert_close(dense, _hf_head_qk(name, model, layer, head), f"{name} QK L{layer}H{head}")


def test_cli_info_heads_and_composition(family: tuple[str, Any, Any], capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from headscope.tui.cli.main import main

    name, path, _ = family
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == ("opt" if name.startswith("opt") else name)
    assert main(["heads", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * 4 and all(r["layer"] in (0, 1) for r in rows)
    assert main(["composition", str(path), "--kind", "k", "--json"]) == 0
    assert capsys.readouterr().out.strip()


def test_native_round_trip(family: tuple[str, Any, Any], tmp_path) -> None:
    """save_native of the processed model reopens with the same logits (post-LN OPT has no
    TransformerLens equivalent and is refused with a reason)."""
    from headscope.engine.core.errors import InvalidRequestError
    from headscope.engine.model.loading import load_model
    from headscope.engine.model.tl_compat import save_native

    name, path, _ = family
    m = load_model(path)
    if m.cfg.post_ln:
        with pytest.raises(InvalidRequestError, match="post-LN"):
            save_native(m.weights, tmp_path / "native")
        return
    save_native(m.weights, tmp_path / "native")
    again = load_model(tmp_path / "native")
    _assert_close(run(again.weights, SEQS).logits, run(m.weights, SEQS).logits, f"{name} native round trip")
