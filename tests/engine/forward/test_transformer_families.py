"""Mistral, Llama 3 RoPE scaling, Qwen3, Gemma 1/2/3, OLMo2, GPT-Neo and Mixtral against
transformers.

For each family (tiny random checkpoints, tests/family_fixtures.py): logits and attention
patterns through ``load_model`` match ``transformers`` to 1e-4, raw and processed; each
feature the family adds changes the numbers (so the parity is not vacuous); the canonical
tensors and their processing are what docs/math.md says; scores, composition, the CLI and
the explorer work on it; the structure flags the heads whose circuits are approximate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import layer_config, log_probs, run
from headscope.engine.model import rotary
from headscope.engine.model.loading import load_model
from headscope.engine.model.processing import ProcessedWeights, plan_for
from tests import family_fixtures
from tests.engine.forward.test_transformer import SEQS, _assert_close, hf_reference
from tests.family_fixtures import build_gemma, build_gemma2, build_gemma3, build_olmo2

new_family = family_fixtures.new_family  # the session-scoped fixture, one per family


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "processed"])
def test_open_model_matches_transformers(new_family: tuple[str, Path, Any], raw: bool) -> None:
    name, path, model = new_family
    m = load_model(path, raw=raw)
    assert isinstance(m.weights, ProcessedWeights) != raw
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    res = run(m.weights, SEQS)
    _assert_close(res.patterns, ref_pat, f"{name} patterns")
    _assert_close(log_probs(res), ref_lp, f"{name} log-probs")
    assert ref_pat.max() > 0.9  # far from uniform: the comparison means something


# -- each feature matters: leaving it out changes patterns or log-probs -------------------


class _Without:
    """A weight source like ``w`` with ``cfg`` changed and the tensors containing any of
    ``hide`` in their name absent (``has`` false)."""

    def __init__(self, w: Any, hide: tuple[str, ...] = (), **changes: Any) -> None:
        self._w, self._hide = w, hide
        extra = {**w.cfg.extra, **changes.pop("extra", {})}
        self.cfg = w.cfg.replace(extra=extra, **changes)

    def has(self, name: str) -> bool:
        return not any(h in name for h in self._hide) and self._w.has(name)

    def get(self, name: str) -> torch.Tensor:
        return self._w.get(name)

    def get_head(self, name: str, head: int) -> torch.Tensor:
        return self._w.get_head(name, head)


FEATURES: dict[str, dict[str, dict[str, Any]]] = {
    "mistral": {"sliding window": {"extra": {"sliding_window": None}}},
    "llama3_rope": {"llama3 RoPE": {"extra": {"rope_type": "default"}}},
    "qwen3": {"q/k norm": {"hide": (".q_norm.", ".k_norm.")}},
    "gemma2": {
        "attention soft-cap": {"extra": {"attn_softcap": None}},
        "final soft-cap": {"extra": {"final_softcap": None}},
        "local layers only": {"extra": {"layer_types": None}},
        "query_pre_attn_scalar": {"attn_scale": None},
        "post-attention norm": {"hide": ("ln1_post",)},
        "post-MLP norm": {"hide": ("ln2_post",)},
    },
    "gemma3": {
        "local RoPE base": {"extra": {"rope_local": None}},
        "q/k norm": {"hide": (".q_norm.", ".k_norm.")},
        "local layers only": {"extra": {"layer_types": None}},
    },
    "olmo2": {
        "q/k norm": {"hide": (".q_norm.", ".k_norm.")},
        "post-attention norm": {"hide": ("ln1_post",)},
    },
    "gpt_neo": {
        "unscaled scores": {"attn_scale": None},
        "local layers only": {"extra": {"layer_types": None}},
    },
    "mixtral": {"top-2 routing": {"extra": {"experts_per_token": 4}}},
}


def test_every_feature_changes_the_output(new_family: tuple[str, Path, Any]) -> None:
    name, path, _ = new_family
    w = load_model(path, raw=True).weights
    base = run(w, SEQS)
    for feature, change in FEATURES.get(name, {}).items():
        change = dict(change)
        res = run(_Without(w, change.pop("hide", ()), **change), SEQS)
        diff = max((res.patterns - base.patterns).abs().max().item(),
                   (log_probs(res) - log_probs(base)).abs().max().item())
        assert diff > 1e-3, f"{name}: leaving out {feature} changes nothing ({diff:.1e})"


# -- canonical tensors and processing --------------------------------------------------------


def _hf(model: Any, name: str) -> torch.Tensor:
    return model.state_dict()[name].detach().float()


@pytest.mark.parametrize("builder", [build_gemma, build_gemma2, build_gemma3])
def test_gemma_gains_are_one_plus_w_and_embeddings_scaled(tmp_path: Path, builder: Any) -> None:
    path, model = builder(tmp_path)
    raw_arrays = load_model(path, raw=True).weights
    raw = torch_weights(raw_arrays)
    d = raw.cfg.d_model
    embed = _hf(model, "model.embed_tokens.weight")
    torch.testing.assert_close(raw.get("embed.W_E"), embed * math.sqrt(d))
    torch.testing.assert_close(raw.get("unembed.W_U"), embed.T)  # tied, unscaled
    gain = 1 + _hf(model, "model.layers.0.input_layernorm.weight")
    torch.testing.assert_close(raw.get("blocks.0.ln1.w"), gain)
    torch.testing.assert_close(raw.get("ln_final.w"), 1 + _hf(model, "model.norm.weight"))
    # Processing folds the real (1 + w) gain into the readers: exact, as for any RMSNorm.
    proc = torch_weights(ProcessedWeights(raw_arrays))
    torch.testing.assert_close(proc.get_head("blocks.0.attn.W_Q", 1), gain[:, None] * raw.get_head("blocks.0.attn.W_Q", 1))
    assert not proc.has("blocks.0.ln1.w")


def test_gemma2_final_softcap_keeps_unembed_uncentred(tmp_path: Path) -> None:
    """Centring W_U shifts each position's logits before the tanh cap: not exact, so off."""
    for builder, centred in ((build_gemma, True), (build_gemma2, False)):
        path, _ = builder(tmp_path / builder.__name__)
        proc = load_model(path).weights
        assert plan_for(proc.raw_cfg).center_unembed is centred
        mean = torch_weights(proc).get("unembed.W_U").mean(-1).abs().max().item()
        assert (mean < 1e-5) is centred


def test_olmo2_norms_after_sublayers_and_whole_projection_qk_norm(tmp_path: Path) -> None:
    path, model = build_olmo2(tmp_path)
    m = load_model(path)
    raw, processed = torch_weights(m.raw_weights), torch_weights(m.weights)
    assert not raw.has("blocks.0.ln1.w") and raw.has("blocks.0.ln1_post.w")
    # nothing before attention to fold: processed W_Q is the raw one
    torch.testing.assert_close(processed.get("blocks.0.attn.W_Q"), raw.get("blocks.0.attn.W_Q"))
    # K/V gains: 2 stored heads, each read by 2 query heads
    k_gain = _hf(model, "model.layers.0.self_attn.k_norm.weight").reshape(2, -1)
    torch.testing.assert_close(raw.get("blocks.0.attn.k_norm.w"), k_gain.repeat_interleave(2, 0))
    torch.testing.assert_close(processed.get("blocks.1.ln2_post.w"),
                               _hf(model, "model.layers.1.post_feedforward_layernorm.weight"))


def test_gemma3_rotary_circuits_use_each_layers_base(tmp_path: Path) -> None:
    """The rotary circuits rotate like transformers' rotary embedding of that layer's kind."""

    path, model = build_gemma3(tmp_path)
    cfg = load_model(path).cfg
    pos = torch.arange(17)
    x = torch.randn(1, 1, 17, cfg.d_head, generator=torch.Generator().manual_seed(0))
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    for layer, kind in enumerate(model.config.layer_types):
        cos, sin = model.model.rotary_emb(x, pos[None], kind)
        ref, _ = apply_rotary_pos_emb(x, x, cos, sin)
        ours = torch.from_numpy(rotary.rope(x.numpy(), pos.double().numpy(), layer_config(cfg, layer)))
        _assert_close(ours, ref, f"gemma3 layer {layer} ({kind}) rotary")
    assert layer_config(cfg, 0).rotary_base != layer_config(cfg, 1).rotary_base


# -- scores, flags, CLI, explorer ---------------------------------------------------------


def test_scores_and_composition_are_finite(new_family: tuple[str, Path, Any]) -> None:
    from headscope.engine.api.report import composition_report, head_table

    name, path, _ = new_family
    m = load_model(path)
    rows = head_table(m)
    assert len(rows) == m.cfg.n_layers * m.cfg.n_heads
    for row in rows:
        assert not row["nonfinite"]
        for key in ("copying_score", "qk_positivity", "prev_token_score", "induction_score"):
            assert math.isfinite(row[key]), f"{name} L{row['layer']}H{row['head']} {key}"
    report = composition_report(m, "k", top=3)
    assert all(math.isfinite(e["score"]) for e in report["top_edges"])


BENT = {"qwen3": "q/k RMSNorm", "gemma3": "q/k RMSNorm", "olmo2": "q/k RMSNorm",
        "gemma2": "soft-capped"}


def test_batches_side_by_side_run_as_each_alone(new_family: tuple[str, Path, Any]) -> None:
    """The one pass of `heads` (every batch side by side, the MLPs as one): Mixtral's router,
    Gemma's post-norms and sliding windows, Qwen3/OLMo2's q/k norms."""
    from tests.engine.forward.test_behaviour import assert_side_by_side_is_alone

    assert_side_by_side_is_alone(load_model(new_family[1]).weights)


def test_structure_and_circuits_flag_non_bilinear_scores(new_family: tuple[str, Path, Any]) -> None:
    from headscope.engine.api.report import circuit_report
    from headscope.engine.model.loading import read_structure

    name, path, _ = new_family
    notes = read_structure(path)["approximations"]
    qk = circuit_report(load_model(path), 0, 0, "qk", rows=[1, 2], cols=[1, 2])["approximations"]
    if name in BENT:
        assert any(BENT[name] in n for n in notes) and any(BENT[name] in n for n in qk)
    else:
        assert notes == [] and qk == []


def test_tl_conversion_refuses_what_it_cannot_carry(tmp_path: Path) -> None:
    from headscope.engine.core.errors import InvalidRequestError
    from headscope.engine.model.tl_compat import save_native

    path, _ = build_gemma2(tmp_path / "g2")
    with pytest.raises(InvalidRequestError, match="soft-capping"):
        save_native(load_model(path).weights, tmp_path / "out")


def test_cli_info_and_heads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from headscope.tui.cli.main import main

    path, _ = build_gemma2(tmp_path)
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "gemma2" and info["architecture"] == "Gemma2ForCausalLM"
    assert info["approximations"]
    assert main(["heads", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == info["n_layers"] * info["n_heads"]


async def test_explorer_opens_and_flags_qk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headscope.tui.app import HeadscopeApp
    from headscope.tui.base.settings import Settings
    from headscope.tui.widgets.chart import Chart
    from headscope.tui.widgets.status import StatusBar
    from tests.e2e.test_explorer_real_engine import wait_ready

    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))
    path, _ = build_gemma3(tmp_path / "g3")
    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_ready(pilot, app)
        assert app.errors == []
        text = app.explorer.query_one("#qk-token", Chart).rendered.plain
        assert "token QK L0.H0" in text and "q/k RMSNorm" in text
        assert "circuits≈" in app.query_one(StatusBar).render().plain
        await pilot.press("q")


# -- bad configs are typed errors naming the file ---------------------------------------------


@pytest.mark.parametrize(("builder", "change", "message"), [
    ("gemma2", {"query_pre_attn_scalar": -4}, "query_pre_attn_scalar must be > 0"),
    ("gemma2", {"attn_logit_softcapping": 0}, "attn_logit_softcapping must be > 0"),
    ("gemma2", {"layer_types": ["full_attention"]}, "layer_types"),
    ("qwen3", {"layer_types": "full_attention"}, "layer_types"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_theta": "x"}}}, "rope_theta"),
    ("gpt_neo", {"attention_layers": ["global"], "attention_types": None}, "attention_layers"),
    ("gpt_neo", {"attention_layers": None, "attention_types": [["global", 2]]}, "attention_types"),
    ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok 9 exceeds"),
    ("mixtral", {"num_local_experts": 10**9}, "num_local_experts"),
])
def test_bad_configs_are_config_errors(tmp_path: Path, builder: str, change: dict[str, Any], message: str) -> None:
    from headscope.engine.core.errors import ConfigError
    from headscope.engine.model.loading import read_structure

    path, _ = family_fixtures.NEW_FAMILIES[builder](tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.update(change)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message) as err:
        read_structure(path)
    assert "config.json" in str(err.value) or str(path) in str(err.value)


def test_head_outputs_sum_to_the_post_normed_attention_output(tmp_path: Path) -> None:
    """Gemma 2: head outputs are what each head adds to the residual stream through the
    post-attention norm (its per-position scale frozen), so they sum to that norm's output."""
    from headscope.engine.forward import transformer as forward

    path, _ = build_gemma2(tmp_path)
    w = load_model(path).weights
    res = run(w, SEQS, return_head_outputs=True)
    stream: list[torch.Tensor] = []
    with torch.inference_mode():
        forward.blocks(w, forward.embed(w, SEQS), on_block=lambda layer, x, _: stream.append(x))
        for layer, x in enumerate(stream):
            a = forward.attention(w, layer, forward.attention_input(w, layer, x), (), "zero")[0]
            added = forward.post_norm(w, f"blocks.{layer}.ln1_post", a)
            assert not w.get(f"blocks.{layer}.attn.b_O").any()  # Gemma: no b_O to leave out
            _assert_close(res.head_outputs[:, layer].sum(1), added, f"gemma2 layer {layer} head outputs")


def test_gemma3_global_rope_scaling_matches_transformers(tmp_path: Path) -> None:
    """Gemma 3 4B+ scale the global layers' RoPE (linear, factor 8) and not the local ones'."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from tests.family_fixtures import WINDOW, _common
    from tests.hf_fixtures import _finish

    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 100.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}
    cfg = Gemma3TextConfig(head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
                           layer_types=["full_attention", "sliding_attention"],
                           rope_parameters=rope, **_common())
    path, model = _finish(Gemma3ForCausalLM(cfg), tmp_path, seed=29, shard=False, dtype=None,
                          tokenizer=False)
    ref_lp, ref_pat = hf_reference("gemma3", model, SEQS)
    w = load_model(path).weights
    res = run(w, SEQS)
    _assert_close(res.patterns, ref_pat, "gemma3 scaled-RoPE patterns")
    _assert_close(log_probs(res), ref_lp, "gemma3 scaled-RoPE log-probs")
    unscaled = run(_Without(w, extra={"rope_type": "default"}), SEQS)
    assert (unscaled.patterns - ref_pat).abs().max() > 1e-3


@pytest.mark.parametrize(("name", "legacy"), [
    # Hub configs written before transformers 5: no layer_types / rope_parameters
    ("gemma3", {"layer_types": None, "rope_parameters": None, "rope_theta": 10000.0,
                "rope_local_base_freq": 10.0, "sliding_window_pattern": 2}),
    ("gemma2", {"layer_types": None}),
    ("gpt_neo", {"attention_layers": None}),
])
def test_older_config_spellings_give_the_same_model(tmp_path: Path, name: str, legacy: dict[str, Any]) -> None:
    path, model = family_fixtures.NEW_FAMILIES[name](tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.update(legacy)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    ref_lp, ref_pat = hf_reference(name, model, SEQS)
    res = run(load_model(path).weights, SEQS)
    _assert_close(res.patterns, ref_pat, f"{name} (older config) patterns")
    _assert_close(log_probs(res), ref_lp, f"{name} (older config) log-probs")


@pytest.mark.parametrize("extra", [
    {"sliding_window": "wide"}, {"layer_types": ["sliding_attention"] * 2}, {"attn_softcap": -1.0},
    {"final_softcap": "x"}, {"qk_norm": "both"}, {"rope_local": {"rope_theta": 0}},
    {"n_experts": 2, "experts_per_token": 3}, {"n_experts": True, "experts_per_token": 1},
])
def test_native_config_features_are_type_checked(tmp_path: Path, extra: dict[str, Any]) -> None:
    """A native checkpoint can put any key in the config; the ones the forward pass reads
    must be well-formed, or opening it is a ConfigError naming the file."""
    from headscope.engine.core.errors import ConfigError
    from headscope.engine.model.loading import read_structure
    from tests.hf_fixtures import write_native

    fields = {"n_layers": 1, "n_heads": 1, "d_model": 4, "d_head": 4, "d_vocab": 5, "n_ctx": 8,
              "d_mlp": None, "positional": "learned", **extra}
    t = {"embed.W_E": torch.zeros(5, 4), "pos_embed.W_pos": torch.zeros(8, 4),
         "blocks.0.ln1.w": torch.ones(4), "blocks.0.ln1.b": torch.zeros(4),
         "ln_final.w": torch.ones(4), "ln_final.b": torch.zeros(4), "unembed.W_U": torch.zeros(4, 5)}
    for x in "QKV":
        t[f"blocks.0.attn.W_{x}"] = torch.zeros(1, 4, 4)
    t["blocks.0.attn.W_O"] = torch.zeros(1, 4, 4)
    path = write_native(tmp_path / "m", fields, t)
    with pytest.raises(ConfigError) as err:
        read_structure(path)
    assert str(path) in str(err.value)
