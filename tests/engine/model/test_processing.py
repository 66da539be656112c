"""ProcessedWeights against an independent, eager transcription of TransformerLens' processing.

``tl_process`` below follows ``HookedTransformer.load_and_process_state_dict`` step by step on
a whole state dict (fold_layer_norm, center_writing_weights, center_unembed,
fold_value_biases); ``ProcessedWeights`` computes the same lazily per layer/head. They must
agree on every tensor, full and per head, for LayerNorm, RMSNorm (+GQA) and post-LN models.
"""

from __future__ import annotations

import pytest
import torch

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import IndexOutOfRangeError, MissingTensorError
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import log_probs, run
from headscope.engine.model.processing import ProcessedWeights, processed_config
from headscope.engine.model.weights import HEAD_TENSORS, DictWeights

D, H, E, V, CTX, MLP, L = 12, 3, 4, 20, 10, 16, 2


def make_cfg(kind: str) -> ModelConfig:
    if kind == "ln":
        return ModelConfig(family="gpt2", architecture="test", n_layers=L, n_heads=H, d_model=D,
                           d_head=E, d_vocab=V, n_ctx=CTX, d_mlp=MLP, act_fn="gelu_new")
    if kind == "ln_attn_only":
        return ModelConfig(family="native", architecture="test", n_layers=L, n_heads=H, d_model=D,
                           d_head=E, d_vocab=V, n_ctx=CTX, d_mlp=None)
    if kind == "rms_gqa":
        return ModelConfig(family="llama", architecture="test", n_layers=L, n_heads=4, n_kv_heads=2,
                           d_model=D, d_head=E, d_vocab=V, n_ctx=CTX, d_mlp=MLP, act_fn="silu",
                           gated_mlp=True, normalization="RMS", norm_eps=1e-6, positional="rotary",
                           rotary_dim=E)
    if kind == "bert":
        return ModelConfig(family="bert", architecture="test", n_layers=L, n_heads=H, d_model=D,
                           d_head=E, d_vocab=V, n_ctx=CTX, d_mlp=MLP, act_fn="gelu",
                           norm_eps=1e-12, causal=False, post_ln=True, has_mlm_head=True)
    raise AssertionError(kind)


def random_tensors(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Canonical tensors with every gain, bias and weight random (none left at 0 or 1)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 0.5) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    def gain() -> torch.Tensor:
        return 1 + r(D, scale=0.3)

    h, d, e = cfg.n_heads, cfg.d_model, cfg.d_head
    t = {"embed.W_E": r(V, d, scale=1.0), "unembed.W_U": r(d, V), "unembed.b_U": r(V)}
    if cfg.positional == "learned":
        t["pos_embed.W_pos"] = r(CTX, d, scale=1.0)
    rms = cfg.normalization == "RMS"
    for i in range(cfg.n_layers):
        p = f"blocks.{i}"
        for n in "QKV":
            n_h = cfg.kv_heads if n in "KV" else h
            prefix = "_" if n_h != h else ""  # GQA: un-expanded K/V as TransformerLens stores them
            t[f"{p}.attn.{prefix}W_{n}"] = r(n_h, d, e)
            t[f"{p}.attn.{prefix}b_{n}"] = r(n_h, e)
        t[f"{p}.attn.W_O"], t[f"{p}.attn.b_O"] = r(h, e, d), r(d)
        for ln in ("ln1", "ln2"):
            t[f"{p}.{ln}.w"] = gain()
            if not rms:
                t[f"{p}.{ln}.b"] = r(d)
        if not cfg.attn_only:
            t[f"{p}.mlp.W_in"], t[f"{p}.mlp.b_in"] = r(d, MLP), r(MLP)
            t[f"{p}.mlp.W_out"], t[f"{p}.mlp.b_out"] = r(MLP, d), r(d)
            if cfg.gated_mlp:
                t[f"{p}.mlp.W_gate"] = r(d, MLP)
    if cfg.post_ln:
        t["embed.W_token_type"] = r(2, d)
        t["embed.ln.w"], t["embed.ln.b"] = gain(), r(d)
        t["mlm.W"], t["mlm.b"], t["mlm.ln.w"], t["mlm.ln.b"] = r(d, d), r(d), gain(), r(d)
    else:
        t["ln_final.w"] = gain()
        if not rms:
            t["ln_final.b"] = r(d)
    return t


def expanded(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    w = torch_weights(DictWeights(cfg, tensors))
    names = {k.replace("._", ".") for k in tensors}
    return {k: w.get(k) for k in names}


def tl_process(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TransformerLens' from_pretrained defaults, transcribed eagerly (expanded K/V)."""
    sd = {k: v.clone() for k, v in sd.items()}
    ln, rms = cfg.normalization == "LN", cfg.normalization == "RMS"
    if cfg.post_ln:
        ln = rms = False  # HookedEncoder: no folding, no centring of writing weights
    if ln or rms:  # fold_layer_norm(fold_biases=ln, center_weights=ln)
        for i in range(cfg.n_layers):
            a, w1 = f"blocks.{i}.attn", sd.pop(f"blocks.{i}.ln1.w")
            if ln:
                b1 = sd.pop(f"blocks.{i}.ln1.b")
                for n in "QKV":
                    sd[f"{a}.b_{n}"] = sd[f"{a}.b_{n}"] + (sd[f"{a}.W_{n}"] * b1[None, :, None]).sum(-2)
            for n in "QKV":
                sd[f"{a}.W_{n}"] = sd[f"{a}.W_{n}"] * w1[None, :, None]
                if ln:
                    sd[f"{a}.W_{n}"] = sd[f"{a}.W_{n}"] - sd[f"{a}.W_{n}"].mean(1, keepdim=True)
            if not cfg.attn_only:
                m, w2 = f"blocks.{i}.mlp", sd.pop(f"blocks.{i}.ln2.w")
                if ln:
                    sd[f"{m}.b_in"] = sd[f"{m}.b_in"] + (sd[f"{m}.W_in"] * sd.pop(f"blocks.{i}.ln2.b")[:, None]).sum(-2)
                sd[f"{m}.W_in"] = sd[f"{m}.W_in"] * w2[:, None]
                if cfg.gated_mlp:
                    sd[f"{m}.W_gate"] = sd[f"{m}.W_gate"] * w2[:, None]
                if ln:
                    sd[f"{m}.W_in"] = sd[f"{m}.W_in"] - sd[f"{m}.W_in"].mean(0, keepdim=True)
            else:
                sd.pop(f"blocks.{i}.ln2.w")
                sd.pop(f"blocks.{i}.ln2.b", None)
        if ln:
            sd["unembed.b_U"] = sd["unembed.b_U"] + (sd["unembed.W_U"] * sd.pop("ln_final.b")[:, None]).sum(-2)
        sd["unembed.W_U"] = sd["unembed.W_U"] * sd.pop("ln_final.w")[:, None]
        if ln:
            sd["unembed.W_U"] = sd["unembed.W_U"] - sd["unembed.W_U"].mean(0, keepdim=True)
    if ln:  # center_writing_weights
        for name in ("embed.W_E", "pos_embed.W_pos"):
            if name in sd:
                sd[name] = sd[name] - sd[name].mean(-1, keepdim=True)
        for i in range(cfg.n_layers):
            names = [f"blocks.{i}.attn.W_O", f"blocks.{i}.attn.b_O"]
            if not cfg.attn_only:
                names += [f"blocks.{i}.mlp.W_out", f"blocks.{i}.mlp.b_out"]
            for name in names:
                sd[name] = sd[name] - sd[name].mean(-1, keepdim=True)
    # center_unembed
    sd["unembed.W_U"] = sd["unembed.W_U"] - sd["unembed.W_U"].mean(-1, keepdim=True)
    sd["unembed.b_U"] = sd["unembed.b_U"] - sd["unembed.b_U"].mean()
    for i in range(cfg.n_layers):  # fold_value_biases
        a = f"blocks.{i}.attn"
        sd[f"{a}.b_O"] = sd[f"{a}.b_O"] + (sd[f"{a}.b_V"][:, :, None] * sd[f"{a}.W_O"]).sum([0, 1])
        sd[f"{a}.b_V"] = torch.zeros_like(sd[f"{a}.b_V"])
    return sd


KINDS = ["ln", "ln_attn_only", "rms_gqa", "bert"]


@pytest.mark.parametrize("kind", KINDS)
def test_processed_tensors_equal_transformerlens_definitions(kind: str) -> None:
    cfg = make_cfg(kind)
    raw = random_tensors(cfg)
    expected = tl_process(cfg, expanded(cfg, raw))
    pw = torch_weights(ProcessedWeights(DictWeights(cfg, raw)))
    for name, want in expected.items():
        assert pw.has(name), name
        torch.testing.assert_close(pw.get(name), want, rtol=1e-5, atol=1e-5, msg=name)
        if name.rsplit(".", 1)[-1] in HEAD_TENSORS:
            for h in range(cfg.n_heads):
                torch.testing.assert_close(pw.get_head(name, h), want[h], rtol=1e-5, atol=1e-5,
                                           msg=f"{name}[{h}]")
    # The folded norms are gone, exactly as in TransformerLens' processed state dict.
    for name in expanded(cfg, raw).keys() - expected.keys():
        assert not pw.has(name), name
        with pytest.raises(MissingTensorError):
            pw.get(name)


@pytest.mark.parametrize(("kind", "norm"), [("ln", "LNPre"), ("rms_gqa", "RMSPre"), ("bert", "LN")])
def test_config_after_processing(kind: str, norm: str) -> None:
    cfg = make_cfg(kind)
    assert ProcessedWeights(DictWeights(cfg, random_tensors(cfg))).cfg.normalization == norm
    assert processed_config(cfg).replace(normalization=cfg.normalization) == cfg


def test_written_out_example_w_q_is_scaled_then_centred() -> None:
    """W_Q processed = (diag(w) W_Q) with the d_model mean removed; b_Q gains ln1.b @ W_Q."""
    cfg = make_cfg("ln")
    raw = random_tensors(cfg)
    pw = torch_weights(ProcessedWeights(DictWeights(cfg, raw)))
    w, b, W_Q = raw["blocks.1.ln1.w"], raw["blocks.1.ln1.b"], raw["blocks.1.attn.W_Q"][2]
    scaled = torch.diag(w) @ W_Q
    centring = torch.eye(D) - torch.full((D, D), 1.0 / D)  # projection orthogonal to all-ones
    torch.testing.assert_close(pw.get_head("blocks.1.attn.W_Q", 2), centring @ scaled)
    torch.testing.assert_close(pw.get_head("blocks.1.attn.b_Q", 2),
                               raw["blocks.1.attn.b_Q"][2] + b @ W_Q)


@pytest.mark.parametrize("kind", KINDS)
def test_processing_is_idempotent(kind: str) -> None:
    """Processing already-processed weights changes nothing (re-centring is a projection)."""
    cfg = make_cfg(kind)
    once = ProcessedWeights(DictWeights(cfg, random_tensors(cfg)))
    twice = ProcessedWeights(once)
    assert twice.cfg == once.cfg
    for name in tl_process(cfg, expanded(cfg, random_tensors(cfg))):
        torch.testing.assert_close(torch_weights(twice).get(name), torch_weights(once).get(name),
                                   rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_processing_preserves_log_probs(kind: str) -> None:
    cfg = make_cfg(kind)
    raw = DictWeights(cfg, random_tensors(cfg))
    tokens = torch.randint(0, V, (3, CTX), generator=torch.Generator().manual_seed(1))
    a, b = run(raw, tokens), run(ProcessedWeights(raw), tokens)
    torch.testing.assert_close(log_probs(b), log_probs(a), rtol=0, atol=1e-4)
    torch.testing.assert_close(b.patterns, a.patterns, rtol=0, atol=1e-5)
    # and processing really changed something (the test above could not pass vacuously)
    assert not torch.allclose(b.logits, a.logits, atol=1e-3)


class CountingWeights:
    """A WeightSource that records every read (to check laziness and caching)."""

    def __init__(self, inner: DictWeights) -> None:
        self.inner, self.cfg, self.reads = inner, inner.cfg, []

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def get(self, name: str) -> torch.Tensor:
        self.reads.append((name, None))
        return self.inner.get(name)

    def get_head(self, name: str, head: int) -> torch.Tensor:
        self.reads.append((name, head))
        return self.inner.get_head(name, head)


def test_get_head_reads_only_that_head_and_caches() -> None:
    cfg = make_cfg("ln")
    raw = CountingWeights(DictWeights(cfg, random_tensors(cfg)))
    pw = ProcessedWeights(raw)
    for name in ("W_Q", "b_K", "W_V", "W_O"):
        pw.get_head(f"blocks.1.attn.{name}", 2)
    attn_reads = {r for r in raw.reads if ".attn." in r[0]}
    assert attn_reads and all(head == 2 for _, head in attn_reads), attn_reads
    # only layer 1's norm vectors were needed
    assert {n for n, _ in raw.reads} - {n for n, _ in attn_reads} <= {"blocks.1.ln1.w", "blocks.1.ln1.b"}
    before = len(raw.reads)
    for name in ("W_Q", "b_K", "W_V", "W_O"):
        pw.get_head(f"blocks.1.attn.{name}", 2)
    assert len(raw.reads) == before  # served from the cache


def test_repeated_forward_passes_hit_the_cache() -> None:
    cfg = make_cfg("ln")
    raw = CountingWeights(DictWeights(cfg, random_tensors(cfg)))
    pw = ProcessedWeights(raw)
    first = run(pw, [1, 2, 3]).logits
    n_reads = len(raw.reads)
    assert n_reads > 0
    torch.testing.assert_close(run(pw, [1, 2, 3]).logits, first)
    assert len(raw.reads) == n_reads


def test_small_cache_still_correct() -> None:
    cfg = make_cfg("ln")
    raw = DictWeights(cfg, random_tensors(cfg))
    tiny, big = ProcessedWeights(raw, cache_bytes=512), ProcessedWeights(raw)
    for _ in range(2):
        torch.testing.assert_close(run(tiny, [1, 2, 3]).logits, run(big, [1, 2, 3]).logits)
    assert tiny._cache.bytes <= 512


def test_get_head_rejects_bad_indices_and_names() -> None:
    cfg = make_cfg("ln")
    pw = ProcessedWeights(DictWeights(cfg, random_tensors(cfg)))
    with pytest.raises(IndexOutOfRangeError):
        pw.get_head("blocks.0.attn.W_Q", H)
    with pytest.raises(IndexOutOfRangeError):
        pw.get_head(f"blocks.{L}.attn.W_Q", 0)
    with pytest.raises(MissingTensorError):
        pw.get_head("blocks.0.mlp.W_in", 0)


def test_non_finite_weights_are_processed_without_error() -> None:
    cfg = make_cfg("ln")
    t = random_tensors(cfg)
    t["blocks.0.attn.W_V"][1, 3, 0] = float("nan")
    t["blocks.1.ln1.w"][0] = float("inf")
    pw = ProcessedWeights(DictWeights(cfg, t))
    tw = torch_weights(pw)
    assert tw.get("blocks.0.attn.b_O").isnan().any()  # NaN W_V -> folded b_V -> b_O
    assert torch.isfinite(tw.get_head("blocks.0.attn.W_Q", 0)).all()
    res = run(pw, [1, 2, 3])
    assert res.logits.isnan().any()


def test_concurrent_reads_agree_with_serial_reads() -> None:
    """The service reads from a thread pool: a shared, small cache must stay consistent."""
    from concurrent.futures import ThreadPoolExecutor

    cfg = make_cfg("rms_gqa")
    raw = DictWeights(cfg, random_tensors(cfg))
    serial = ProcessedWeights(raw)
    shared = ProcessedWeights(raw, cache_bytes=4096)  # small: forces concurrent evictions
    jobs = [(f"blocks.{i}.attn.{n}", h) for i in range(L) for n in ("W_Q", "W_K", "b_V", "W_O")
            for h in range(cfg.n_heads)] * 4
    jobs += [(f"blocks.{i}.attn.b_O", None) for i in range(L)] * 4 + [("unembed.W_U", None)] * 4

    def read(job: tuple[str, int | None]) -> torch.Tensor:
        name, head = job
        tw = torch_weights(shared)
        return tw.get(name) if head is None else tw.get_head(name, head)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(read, jobs))
    for (name, head), got in zip(jobs, results, strict=True):
        tw = torch_weights(serial)
        want = tw.get(name) if head is None else tw.get_head(name, head)
        torch.testing.assert_close(got, want, msg=f"{name}[{head}]")
    assert shared._cache.bytes <= 4096
