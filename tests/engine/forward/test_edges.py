"""Edge attribution (issue 37; docs/math.md, "Edge attribution") against a reference written
here with TransformerLens hooks, following hannamw/EAP-IG's ``Graph.from_model``,
``attribute.py`` (EAP, EAP-IG "inputs") and ``evaluate.py`` (``evaluate_graph`` with patching).

The reference runs TransformerLens' bridge with EAP-IG's settings: ``use_split_qkv_input``
(each head's q, k, v read their own copy of the residual stream, ``hook_{q,k,v}_input``
``[b, p, h, d_model]``, before ln1), ``use_attn_result`` (``attn.hook_result``: each head's
``z W_O``) and ``use_hook_mlp_in``. Gradients are taken through a zero leaf added to each
destination's hook (the total derivative through every later layer); grouped-query models are
run "ungrouped" as EAP-IG requires (``ungroup_grouped_query_attention``): the checkpoint is
rewritten with each K/V head repeated for its query heads, the same function.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from headscope.engine.core.edge_graph import QKV, edge_graph
from headscope.engine.core.edge_results import curve_area
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.forward import edges, patch_tasks, patching
from headscope.engine.model.loading import load_model
from tests.conftest import sample_model
from tests.engine.test_tl_parity import boot_transformer_lens
from tests.hf_fixtures import (  # noqa: F401  (session-scoped pytest fixtures)
    gpt2_dir,
    llama_dir,
    neox_dir,
    qwen2_dir,
)

ATTN2 = sample_model("attn-only-2l")
CLEAN = [[1, 5, 9, 2, 33, 7, 5, 9], [3, 4, 5, 6, 7, 8, 9, 10]]
CORRUPT = [[1, 5, 9, 2, 40, 7, 11, 9], [3, 4, 50, 6, 7, 8, 9, 11]]
ANSWER, WRONG = 3, 4
SCORE_RTOL = 1e-4  # × the largest |score| (float32 sums of d_model · positions products)
FAITH_ATOL = 1e-3
K_EDGE = "a0.h1->a1.h2<k>"  # the tour's K-composition


# -- the reference graph: EAP-IG's Graph.from_model, transcribed ----------------------------------


def reference_graph(n_layers: int, n_heads: int, has_mlp: bool, parallel: bool) -> tuple[list[str], list[str], list[str]]:
    """(sources, destinations, edge names) in ``from_model``'s order (no ``m{l}`` without MLPs)."""
    sources = ["input"]
    dsts = []
    for layer in range(n_layers):
        sources += [f"a{layer}.h{h}" for h in range(n_heads)] + ([f"m{layer}"] if has_mlp else [])
        dsts += [f"a{layer}.h{h}<{x}>" for x in "qkv" for h in range(n_heads)] + ([f"m{layer}"] if has_mlp else [])
    dsts.append("logits")
    names = []
    stream = ["input"]
    for layer in range(n_layers):
        attn = [f"a{layer}.h{h}" for h in range(n_heads)]
        if has_mlp and parallel:
            for node in stream:
                names += [f"{node}->{a}<{x}>" for a in attn for x in "qkv"]
                names.append(f"{node}->m{layer}")
            stream += [*attn, f"m{layer}"]
        else:
            for node in stream:
                names += [f"{node}->{a}<{x}>" for a in attn for x in "qkv"]
            stream += attn
            if has_mlp:
                names += [f"{node}->m{layer}" for node in stream]
                stream.append(f"m{layer}")
    names += [f"{node}->logits" for node in stream]
    return sources, dsts, names


# -- the reference computation with TransformerLens hooks ------------------------------------------


class Reference:
    """EAP-IG's attribution and evaluation on a TransformerLens bridge ``tl``."""

    def __init__(self, tl: Any, has_mlp: bool, parallel: bool) -> None:
        tl.set_use_split_qkv_input(True)
        tl.set_use_attn_result(True)
        if has_mlp:
            tl.set_use_hook_mlp_in(True)
        self.tl = tl
        cfg = tl.cfg
        self.L, self.H, self.d = cfg.n_layers, cfg.n_heads, cfg.d_model
        self.has_mlp, self.parallel = has_mlp, parallel
        self.sources, self.dsts, self.names = reference_graph(self.L, self.H, has_mlp, parallel)
        self.n_src = len(self.sources)

    # indices as EAP-IG's graph: forward (source) and backward (destination) ones
    def src(self, layer: int) -> int:
        return 1 + layer * (self.H + int(self.has_mlp))

    def prev_head(self, layer: int) -> int:
        return self.src(layer)

    def prev_mlp(self, layer: int) -> int:
        return self.src(layer) + (0 if self.parallel else self.H)

    def dst(self, layer: int) -> int:
        return layer * (3 * self.H + int(self.has_mlp))

    def source_hooks(self, store: torch.Tensor, sign: float) -> list[tuple[str, Any]]:
        """EAP-IG's ``activation_hook``s: add (corrupt) or subtract (clean) each source."""
        def at(index: int, heads: bool) -> Any:
            def hook(act: torch.Tensor, hook: Any) -> None:
                if heads:
                    store[:, :, index:index + self.H] += sign * act.detach()
                else:
                    store[:, :, index] += sign * act.detach()
            return hook
        hooks = [("hook_embed", at(0, False))]
        for layer in range(self.L):
            hooks.append((f"blocks.{layer}.attn.hook_result", at(self.src(layer), True)))
            if self.has_mlp:
                hooks.append((f"blocks.{layer}.hook_mlp_out", at(self.src(layer) + self.H, False)))
        return hooks

    def destination_hooks(self) -> list[tuple[str, str]]:
        """(hook name, what) of each destination: q/k/v inputs, mlp input, the final stream."""
        out = []
        for layer in range(self.L):
            out += [(f"blocks.{layer}.hook_{x}_input", x) for x in QKV]
            if self.has_mlp:
                out.append((f"blocks.{layer}.hook_mlp_in", "m"))
        out.append((f"blocks.{self.L - 1}.hook_resid_post", "logits"))
        return out

    def differences(self, clean: torch.Tensor, corrupt: torch.Tensor) -> torch.Tensor:
        diff = torch.zeros(clean.shape[0], clean.shape[1], self.n_src, self.d)
        with torch.no_grad():
            self.tl.run_with_hooks(corrupt, fwd_hooks=self.source_hooks(diff, 1.0))
            self.tl.run_with_hooks(clean, fwd_hooks=self.source_hooks(diff, -1.0))
        return diff

    def scores(self, clean: torch.Tensor, corrupt: torch.Tensor, metric: Any, method: str, steps: int = 5
               ) -> torch.Tensor:
        """EAP-IG's ``get_scores_eap`` / ``get_scores_eap_ig`` ([n_src, n_dst]), the gradients
        through zero leaves added at each destination's hook."""
        diff = self.differences(clean, corrupt)
        scores = torch.zeros(self.n_src, len(self.dsts), dtype=torch.float64)
        with torch.no_grad():
            embeds = {}
            for name, toks in (("clean", clean), ("corrupt", corrupt)):
                self.tl.run_with_hooks(toks, fwd_hooks=[("hook_embed", lambda a, hook, n=name: embeds.__setitem__(n, a.clone()))])
        runs = [None] if method == "eap" else list(range(steps))
        for k in runs:
            leaves: dict[str, torch.Tensor] = {}

            def add_leaf(act: torch.Tensor, name: str, leaves: dict[str, torch.Tensor] = leaves) -> torch.Tensor:
                leaf = torch.zeros_like(act, requires_grad=True)
                leaves[name] = leaf  # (by the name asked: an alias's hook.name is another)
                return act + leaf

            hooks = [(name, lambda a, hook, name=name: add_leaf(a, name)) for name, _ in self.destination_hooks()]
            if k is not None:
                mix = embeds["corrupt"] + (k / steps) * (embeds["clean"] - embeds["corrupt"])
                hooks.insert(0, ("hook_embed", lambda a, hook, mix=mix: mix))
            with torch.enable_grad():
                value = metric(self.tl.run_with_hooks(clean, fwd_hooks=hooks))
                names = [name for name, _ in self.destination_hooks()]
                grads = torch.autograd.grad(value, [leaves[n] for n in names])
            for (name, what), g in zip(self.destination_hooks(), grads, strict=True):
                layer = int(name.split(".")[1])
                if what in QKV:
                    prev, at = self.prev_head(layer), self.dst(layer) + QKV.index(what) * self.H
                    s = torch.einsum("bpsd,bphd->sh", diff[:, :, :prev], g)
                    scores[:prev, at:at + self.H] += s.double()
                else:
                    prev = self.n_src if what == "logits" else self.prev_mlp(layer)
                    at = len(self.dsts) - 1 if what == "logits" else self.dst(layer) + 3 * self.H
                    scores[:prev, at] += torch.einsum("bpsd,bpd->s", diff[:, :, :prev], g).double()
        return scores / len(runs)

    def evaluate(self, clean: torch.Tensor, corrupt: torch.Tensor, metric: Any, in_graph: torch.Tensor) -> float:
        """EAP-IG's ``evaluate_graph`` with patching: a clean run whose destination inputs get
        ``Σ (corrupt - this run's)`` activation of every source whose edge is not in the graph
        (``in_graph [n_src, n_dst]``)."""
        diff = torch.zeros(clean.shape[0], clean.shape[1], self.n_src, self.d)
        out_of = 1.0 - in_graph.float()
        with torch.no_grad():
            self.tl.run_with_hooks(corrupt, fwd_hooks=self.source_hooks(diff, 1.0))

            def construct(prev: int, cols: slice | int) -> Any:
                def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
                    mask = out_of[:prev, cols]
                    if mask.ndim == 1:
                        return act + torch.einsum("bpsd,s->bpd", diff[:, :, :prev], mask)
                    return act + torch.einsum("bpsd,sh->bphd", diff[:, :, :prev], mask)
                return hook

            hooks = []
            for name, what in self.destination_hooks():
                layer = int(name.split(".")[1])
                if what in QKV:
                    at = self.dst(layer) + QKV.index(what) * self.H
                    hooks.append((name, construct(self.prev_head(layer), slice(at, at + self.H))))
                elif what == "m":
                    hooks.append((name, construct(self.prev_mlp(layer), self.dst(layer) + 3 * self.H)))
                else:
                    hooks.append((name, construct(self.n_src, len(self.dsts) - 1)))
            # the source hooks (this run's activations subtracted) fire before the destination
            # hooks that read them, as EAP-IG's fwd_hooks_clean + input_construction_hooks
            logits = self.tl.run_with_hooks(clean, fwd_hooks=self.source_hooks(diff, -1.0) + hooks)
        return float(metric(logits))


def topn_pruned(ref: Reference, scores: torch.Tensor, n: int, real: torch.Tensor) -> torch.Tensor:
    """EAP-IG's ``apply_topn(n, absolute=True)`` then ``prune`` on the reference matrix."""
    key = scores.abs().clone()
    key[~real] = -torch.inf
    order = torch.argsort(key.flatten(), descending=True, stable=True)
    in_graph = torch.zeros_like(real)
    in_graph.view(-1)[order[:n]] = True
    f2b = torch.zeros(ref.n_src, len(ref.dsts), dtype=torch.bool)
    for layer in range(ref.L):
        for h in range(ref.H):
            for x in range(3):
                f2b[ref.src(layer) + h, ref.dst(layer) + x * ref.H + h] = True
        if ref.has_mlp:
            f2b[ref.src(layer) + ref.H, ref.dst(layer) + 3 * ref.H] = True
    while True:
        outgoing = in_graph.any(dim=1)
        incoming = (in_graph.any(dim=0).float() @ f2b.float().T) > 0
        incoming[0] = True
        nodes = outgoing & incoming
        backward = (nodes.float() @ f2b.float()) > 0
        backward[-1] = True
        new = in_graph & nodes[:, None] & backward[None, :]
        if torch.equal(new, in_graph):
            return in_graph
        in_graph = new


# -- the models ------------------------------------------------------------------------------------


def ungrouped(path: Path, tmp: Path) -> Path:
    """The grouped-query checkpoint at ``path`` rewritten with one K/V head per query head
    (each stored K/V head repeated for its group): the same function, for EAP-IG's
    ``ungroup_grouped_query_attention``."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    cfg = hf.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    d_head = cfg.hidden_size // cfg.num_attention_heads
    state = hf.state_dict()
    for name in list(state):
        if any(f"self_attn.{p}_proj." in name for p in "kv"):
            t = state[name]
            state[name] = t.reshape(cfg.num_key_value_heads, d_head, *t.shape[1:]).repeat_interleave(
                group, dim=0).reshape(-1, *t.shape[1:])
    cfg.num_key_value_heads = cfg.num_attention_heads
    out = type(hf)(cfg)
    out.load_state_dict(state)
    out.save_pretrained(tmp, safe_serialization=True)
    return tmp


def family(name: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(headscope model, TransformerLens bridge) of a fixture family."""
    path, _ = request.getfixturevalue(f"{name}_dir")
    model = load_model(path)
    tl_path = path if model.cfg.kv_heads == model.cfg.n_heads else ungrouped(path, tmp_path_factory.mktemp(f"{name}_ungrouped"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, boot_transformer_lens(tl_path)


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()


def check_parity(model: Any, tl: Any, clean: Any, corrupt: Any, metric: Any, tl_metric: Any, what: str,
                 ref_has_mlp: bool | None = None, every_kind: bool = False) -> None:
    """Every edge's EAP and EAP-IG score, the graph's names and order, and the faithfulness of
    top-N circuits against the reference. ``ref_has_mlp``: the reference model has MLPs
    where ours has none (attn-only-2l run as a GPT-2 whose MLPs write 0): its extra edges
    must score 0, and ours are compared by name."""
    cfg = model.cfg
    graph = edges.graph_of(model.weights)
    sources, dsts, names = reference_graph(cfg.n_layers, cfg.n_heads, not cfg.attn_only, cfg.parallel_attn_mlp)
    assert list(graph.sources) == sources and list(graph.destinations) == dsts
    assert list(graph.edges) == names, f"{what}: edge names or order"
    ref = Reference(tl, not cfg.attn_only if ref_has_mlp is None else ref_has_mlp, cfg.parallel_attn_mlp)
    # each of our edges in the reference's [n_src, n_dst] matrix
    at_src = torch.tensor([ref.sources.index(graph.sources[s]) for s in graph.edge_src])
    at_dst = torch.tensor([ref.dsts.index(graph.destinations[d]) for d in graph.edge_dst])
    ours_in_ref = torch.zeros(ref.n_src, len(ref.dsts), dtype=torch.bool)
    ours_in_ref[at_src, at_dst] = True
    real = torch.zeros_like(ours_in_ref)
    for name in ref.names:
        src, dst = name.split("->")
        real[ref.sources.index(src), ref.dsts.index(dst)] = True

    def in_ref(mask: np.ndarray) -> torch.Tensor:
        out = torch.zeros_like(real)
        out[at_src[mask], at_dst[mask]] = True
        return out

    clean_t, corrupt_t = torch.tensor(clean), torch.tensor(corrupt)
    for method in edges.METHODS:
        found = edges.edge_scores(model.weights, clean, corrupt, metric, method=method)
        assert found.steps == (5 if method == "eap-ig" else 0) and not found.nonfinite.any()
        expected = ref.scores(clean_t, corrupt_t, tl_metric, method)
        assert not (expected[~ours_in_ref] != 0).any()  # no edge there, or an MLP writing 0
        err = (torch.from_numpy(found.scores) - expected[at_src, at_dst]).abs().max().item()
        scale = expected.abs().max().item()
        assert err <= SCORE_RTOL * scale, f"{what} {method}: max |ours - reference| = {err:.2e} (largest |score| {scale:.2e})"
    # faithfulness of top-N circuits (the last attribution's), pruned as EAP-IG prunes
    tops = [0, 1, 5, 20, graph.n_edges // 2, graph.n_edges]
    points = edges.faithfulness(model.weights, clean, corrupt, metric, found, tops)
    m_clean = ref.evaluate(clean_t, corrupt_t, tl_metric, real)
    m_corrupt = ref.evaluate(clean_t, corrupt_t, tl_metric, torch.zeros_like(real))
    for n, point in zip(tops, points, strict=True):
        # (ranked among our edges: the padding head's and zero MLPs' edges are not the model's)
        in_graph = topn_pruned(ref, expected, n, ours_in_ref)
        assert torch.equal(in_ref(point.in_circuit), in_graph), f"{what} top {n}"
        assert point.edges == int(in_graph.sum())
        m = ref.evaluate(clean_t, corrupt_t, tl_metric, in_graph)
        assert point.circuit == pytest.approx(m, abs=FAITH_ATOL), f"{what} top {n}: circuit metric"
        assert point.faithfulness == pytest.approx((m - m_corrupt) / (m_clean - m_corrupt), abs=FAITH_ATOL), \
            f"{what} top {n}: faithfulness"
    # the exact check of the top 3 edges (``every_kind``: and of the last edge of every kind,
    # sender input, a head or an MLP, receiver a head's q, k or v, an MLP or the logits):
    # every other edge in the graph (``patching.patch_paths`` in noising)
    def kind(name: str) -> tuple[str, str]:
        src, dst = name.split("->")
        return src[0], dst[-3:] if dst.endswith(">") else dst[0]

    last_of_kind = {kind(name): name for name in graph.edges} if every_kind else {}
    checked = [graph.edges[i] for i in found.ranked()[:3]] + sorted(last_of_kind.values())
    assert len(last_of_kind) == (0 if not every_kind else 8 if cfg.attn_only else 15)
    for exact in edges.exact_edges(model.weights, clean, corrupt, metric, checked, found):
        alone = real.clone()
        alone[at_src[graph.index[exact.edge]], at_dst[graph.index[exact.edge]]] = False
        assert exact.patched == pytest.approx(ref.evaluate(clean_t, corrupt_t, tl_metric, alone), abs=FAITH_ATOL)
        assert exact.exact == pytest.approx(exact.patched - m_clean, abs=FAITH_ATOL)
    # every edge: the clean run; none: the corrupt run
    assert points[-1].circuit == pytest.approx(points[-1].clean, abs=1e-4) and points[-1].faithfulness == pytest.approx(1.0, abs=1e-4)
    assert points[0].edges == 0 and points[0].circuit == pytest.approx(points[0].corrupt, abs=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "neox", "llama", "qwen2"])
def test_edge_attribution_matches_the_reference(name: str, request: pytest.FixtureRequest,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    model, tl = family(name, request, tmp_path_factory)
    # every kind of edge checked exactly on a sequential and a parallel block
    check_parity(model, tl, CLEAN, CORRUPT, patch_tasks.LogitDiff(ANSWER, WRONG), logit_diff, name,
                 every_kind=name in ("gpt2", "neox"))


def test_edge_attribution_matches_the_reference_on_attn_only_2l(tmp_path: Path) -> None:
    """The first-occurrence task (its metric written out for the reference), short sequences."""
    model = load_model(ATTN2)
    clean, corrupt = patch_tasks.induction_task(model.cfg.d_vocab, model.cfg.n_ctx, 3, 8, 2, task="first-occurrence")
    half = clean.shape[1] // 2

    def tl_metric(logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits[:, half:-1].float(), dim=-1)
        return logp.gather(-1, clean[:, half + 1:, None])[:, ::2].mean()

    tl, b_u = attn_only_as_gpt2(model, tmp_path)

    def with_b_u(logits: torch.Tensor) -> torch.Tensor:  # GPT-2's lm_head has no bias
        return tl_metric(logits + b_u)

    check_parity(model, tl, clean.tolist(), corrupt.tolist(), patch_tasks.task_metric("first-occurrence", clean),
                 with_b_u, "attn-only-2l", ref_has_mlp=True)


def attn_only_as_gpt2(model: Any, tmp: Path) -> tuple[Any, torch.Tensor]:
    """attn-only-2l as a GPT-2 checkpoint (TransformerLens' native bridge has no per-head q/k/v
    inputs; its GPT-2 bridge does), booted on TransformerLens, and the unembedding bias GPT-2
    has no place for (the reference metric adds it). GPT-2 needs ``n_heads · d_head =
    d_model``: attn-only-2l's 3 heads of 32 in 128 dims get a fourth head whose weights are 0,
    and the MLPs write 0; their edges score 0 in the reference."""
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel

    raw, cfg = load_file(ATTN2 / "model.safetensors"), model.cfg  # the checkpoint as stored
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model
    heads = d // e

    def t(name: str) -> torch.Tensor:
        return raw[name].float()

    def padded(x: torch.Tensor) -> torch.Tensor:  # [h, ...] -> [heads, ...], zeros after
        return torch.cat((x, x.new_zeros((heads - h, *x.shape[1:]))))

    hf = GPT2LMHeadModel(GPT2Config(vocab_size=cfg.d_vocab, n_positions=cfg.n_ctx, n_embd=d, n_layer=cfg.n_layers,
                                    n_head=heads, n_inner=4, layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=False,
                                    attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    state = hf.state_dict()
    state["transformer.wte.weight"] = t("embed.W_E")
    state["transformer.wpe.weight"] = t("pos_embed.W_pos")
    for layer in range(cfg.n_layers):
        pre, hp = f"blocks.{layer}", f"transformer.h.{layer}"
        state[f"{hp}.ln_1.weight"], state[f"{hp}.ln_1.bias"] = t(f"{pre}.ln1.w"), t(f"{pre}.ln1.b")
        state[f"{hp}.attn.c_attn.weight"] = torch.cat(
            [padded(t(f"{pre}.attn.W_{x}")).permute(1, 0, 2).reshape(d, heads * e) for x in "QKV"], dim=1)
        state[f"{hp}.attn.c_attn.bias"] = torch.cat([padded(t(f"{pre}.attn.b_{x}")).reshape(-1) for x in "QKV"])
        state[f"{hp}.attn.c_proj.weight"] = padded(t(f"{pre}.attn.W_O")).reshape(heads * e, d)
        state[f"{hp}.attn.c_proj.bias"] = t(f"{pre}.attn.b_O")
        for name in ("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
            state[f"{hp}.{name}"] = torch.zeros_like(state[f"{hp}.{name}"])
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = t("ln_final.w"), t("ln_final.b")
    state["lm_head.weight"] = t("unembed.W_U").T.contiguous()
    hf.load_state_dict(state)
    hf.save_pretrained(tmp, safe_serialization=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return boot_transformer_lens(tmp), t("unembed.b_U")


# -- the graph -------------------------------------------------------------------------------------


def test_the_curve_counts_edges_as_mib(first_occurrence: Any) -> None:
    w, clean, corrupt, metric = first_occurrence
    ig = edges.edge_scores(w, clean, corrupt, metric, method="eap-ig")
    curve = edges.faithfulness_curve(w, clean, corrupt, metric, ig)
    assert [pt.top for pt in curve.points] == [int(f * 52) for f in curve.fractions] == [0, 1, 2, 5, 10, 26, 52]
    assert curve.points[-1].faithfulness == pytest.approx(1.0, abs=1e-5)
    values = tuple(pt.faithfulness for pt in curve.points)
    assert curve.area == pytest.approx(curve_area(curve.fractions, values))
    assert curve.area_from_1 == pytest.approx(curve_area(curve.fractions, tuple(abs(1 - v) for v in values)))
    with pytest.raises(InvalidRequestError, match="must increase within 0"):
        edges.faithfulness_curve(w, clean, corrupt, metric, ig, (0.5, 0.2))


# -- the first-occurrence task on attn-only-2l ------------------------------------------------------


@pytest.fixture(scope="module")
def first_occurrence() -> tuple[Any, Any, Any, Any]:
    model = load_model(ATTN2)
    w = model.weights
    clean, corrupt = patch_tasks.induction_task(w.cfg.d_vocab, w.cfg.n_ctx, 0, task="first-occurrence")
    return w, clean, corrupt, patch_tasks.task_metric("first-occurrence", clean)


def test_the_k_composition_edge_is_found_and_its_exact_check_is_path_patching(first_occurrence: Any) -> None:
    """On the task's 4 × 64 tokens EAP-IG ranks ``a0.h1->a1.h2<k>`` second of the 52 edges
    (after ``input->a0.h1<v>``, the previous-token head reading the token it moves), and its
    top 3 edges are the induction circuit, which alone keeps most of the behaviour. EAP's
    linear estimate of the same edge is ~200× too small (the induction head's softmax is
    saturated; docs/math.md, "Edge attribution"). The exact check of the edge, the edge
    alone corrupted on the clean run, is path patching of L0.H1 -> L1.H2 (k) in noising."""
    w, clean, corrupt, metric = first_occurrence
    ig = edges.edge_scores(w, clean, corrupt, metric, method="eap-ig")
    assert ig.rank(K_EDGE) <= 2
    (three,) = edges.faithfulness(w, clean, corrupt, metric, ig, [3])
    kept = {ig.graph.edges[i] for i in np.nonzero(three.in_circuit)[0]}
    assert kept == {"input->a0.h1<v>", K_EDGE, "a1.h2->logits"}
    assert three.faithfulness > 0.6
    (exact,) = edges.exact_edges(w, clean, corrupt, metric, [K_EDGE], ig)
    (row,) = patching.path_patch(w, clean, corrupt, metric, [((0, 1), (1, 2))], receiver_input="k",
                                 noising=True).rows
    assert exact.patched == pytest.approx(row.patched, abs=1e-4)
    assert exact.exact < -0.4 * (ig.clean - ig.corrupt)  # the edge alone loses about half the behaviour
    assert exact.estimate == ig.score(K_EDGE) and exact.estimate < 0
    eap = edges.edge_scores(w, clean, corrupt, metric, method="eap")
    assert abs(eap.score(K_EDGE)) < 0.05 * abs(exact.exact)


def test_progress_and_cancellation(first_occurrence: Any) -> None:
    from headscope.engine.core.errors import CancelledError

    w, clean, corrupt, metric = first_occurrence
    seen: list[float] = []
    edges.edge_scores(w, clean[:1, :12], corrupt[:1, :12], patch_tasks.LogitDiff(3, 4), progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) >= 2 * w.cfg.n_layers
    calls = [0]

    def cancel_later() -> bool:
        calls[0] += 1
        return calls[0] > 2

    with pytest.raises(CancelledError):
        edges.edge_scores(w, clean, corrupt, metric, method="eap-ig", cancelled=cancel_later)
    scores = edges.edge_scores(w, clean, corrupt, metric)
    seen.clear()
    edges.faithfulness(w, clean, corrupt, metric, scores, [3, 10], progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) >= w.cfg.n_layers
    calls[0] = 1  # cancelled at the edge's layer, after the plain runs
    with pytest.raises(CancelledError):
        edges.exact_edges(w, clean, corrupt, metric, [K_EDGE], cancelled=cancel_later)


# -- bad input -------------------------------------------------------------------------------------


def test_bad_input_is_refused_in_one_line(first_occurrence: Any) -> None:
    w, clean, corrupt, metric = first_occurrence
    same = clean[:1, :12]
    with pytest.raises(InvalidRequestError, match="steps must be a whole number of at least 1"):
        edges.edge_scores(w, clean, corrupt, metric, method="eap-ig", steps=0)
    with pytest.raises(InvalidRequestError, match="method must be one of eap, eap-ig"):
        edges.edge_scores(w, clean, corrupt, metric, method="acdc")  # type: ignore[arg-type]
    diff = patch_tasks.LogitDiff(3, 4)
    scores = edges.edge_scores(w, same, same, diff)
    assert not scores.scores.any()  # nothing differs: every score is 0
    with pytest.raises(InvalidRequestError, match=r"give the same logit_diff .*faithfulness is undefined") as err:
        edges.faithfulness(w, same, same, diff, scores, [3])
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidRequestError, match=r"larger than the graph's 52 edges"):
        edges.faithfulness(w, clean[:1, :12], corrupt[:1, :12], diff, scores, [53])
    with pytest.raises(InvalidRequestError, match=r"no edge 'a9\.h0->logits'"):
        edges.exact_edges(w, same, same, diff, ["a9.h0->logits"])


def test_nonfinite_scores_are_flagged_never_nan() -> None:
    """An edge whose gradient was not finite is flagged, scores 0 (None by name), ranks last
    and is never picked into a circuit before a finite one."""
    from headscope.engine.core.edge_results import edge_scores_result

    g = edge_graph(2, 2, attn_only=True, parallel=False)
    raw = np.linspace(0.1, 1.0, g.n_edges)
    raw[g.index["a1.h0->logits"]] = np.nan
    raw[g.index["a1.h1->logits"]] = np.inf
    s = edge_scores_result(method="eap", steps=0, metric="logit_diff", clean=1.0, corrupt=0.0, graph=g,
                           scores=raw, tokens=3, batch=1)
    assert np.isfinite(s.scores).all() and s.nonfinite.sum() == 2
    assert s.score("a1.h0->logits") is None and s.score("a1.h1->logits") is None
    assert {g.edges[i] for i in s.ranked()[-2:]} == {"a1.h0->logits", "a1.h1->logits"}
    picked = g.top(s.scores, g.n_edges - 2, ~s.nonfinite)
    assert not picked[s.nonfinite].any()


@pytest.mark.parametrize("build", ["build_gemma2", "build_olmo2"])
def test_models_normalising_after_their_sublayers_are_refused(build: str, tmp_path: Path) -> None:
    """Their norms divide the sum of the sources: no source's difference reaches a destination
    alone, so the graph does not describe them (one line, naming the architecture)."""
    from tests import family_fixtures

    path, _ = getattr(family_fixtures, build)(tmp_path)
    model = load_model(path)
    with pytest.raises(InvalidRequestError, match="edge attribution needs a pre-norm model") as err:
        edges.edge_scores(model.weights, CLEAN, CORRUPT, patch_tasks.LogitDiff(ANSWER, WRONG))
    assert model.cfg.architecture in str(err.value) and "\n" not in str(err.value)


def test_non_finite_activations_are_refused(tmp_path: Path) -> None:
    """A NaN weight makes the runs non-finite: refused in one line, never NaN scores."""
    import shutil

    from safetensors.torch import load_file, save_file

    from headscope.engine.core.errors import NonFiniteError

    for name in ("headscope.json", "vocab.txt"):
        shutil.copy(ATTN2 / name, tmp_path / name)
    tensors = load_file(ATTN2 / "model.safetensors")
    tensors["blocks.1.attn.W_V"][0, 0, 0] = float("nan")
    save_file(tensors, tmp_path / "model.safetensors")
    w = load_model(tmp_path, raw=True).weights
    diff = patch_tasks.LogitDiff(3, 4)
    for call in (lambda: edges.edge_scores(w, [[1, 2, 3, 1, 2]], [[1, 2, 4, 1, 2]], diff, method="eap-ig"),
                 lambda: edges.exact_edges(w, [[1, 2, 3, 1, 2]], [[1, 2, 4, 1, 2]], diff, [K_EDGE])):
        # (the exact check is path patching: its message names the run and the layer)
        with pytest.raises(NonFiniteError, match="non-finite activations in the clean") as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_exact_checks_of_head_edges_are_path_patching(name: str, request: pytest.FixtureRequest) -> None:
    """Every head -> later head edge at q, k and v (Llama: grouped keys and values, each query
    head its own copy): the exact check equals ``path_patch`` in noising."""
    path, _ = request.getfixturevalue(f"{name}_dir")
    w = load_model(path).weights
    metric = patch_tasks.LogitDiff(ANSWER, WRONG)
    pairs = [((0, s), (1, r)) for s in range(w.cfg.n_heads) for r in range(w.cfg.n_heads)]
    for x in QKV:
        found = edges.exact_edges(w, CLEAN, CORRUPT, metric, [f"a0.h{s}->a1.h{r}<{x}>" for (_, s), (_, r) in pairs])
        rows = patching.path_patch(w, CLEAN, CORRUPT, metric, pairs, receiver_input=x, noising=True).rows
        assert [e.patched for e in found] == pytest.approx([row.patched for row in rows], abs=1e-4), x
