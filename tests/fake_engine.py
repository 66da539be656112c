"""A fake ``engine.service.Engine`` for fast TUI tests (docs/internals.md, "Engine").

It implements the same async API with small numpy weights and computes real circuits from
them (token QK = W_E W_Q W_Kᵀ W_Eᵀ, full OV = W_E W_V W_O W_U, eigenvalues of BA, ...), so
what the TUI shows can be checked against numbers computed here independently. Planted
behaviour: L0.H1 is a previous-token head, L1.H2 an induction head.

``get(request)`` answers each request type of ``engine.core.requests`` with one method here
(``ANSWERS``: request class -> method name). Requests come built and validated by
``SomeRequest.of(engine.structure, ...)``, as the real engine gets them. Counters record the
calls by method name; ``delay`` slows every call down and ``fail`` makes the named methods raise.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from headscope.engine.core.errors import CancelledError, CorruptFileError, PromptError
from headscope.engine.core.requests import (
    AblationRequest,
    AblationSweepRequest,
    CircuitRequest,
    CompositionRequest,
    DirectionsRequest,
    EdgesRequest,
    FaithfulnessRequest,
    HeadScoresRequest,
    InductionPromptsRequest,
    PatchInputsRequest,
    PathRequest,
    ProfileRequest,
    PromptRequest,
    QKAttributionRequest,
    Request,
    ScoreNullRequest,
    ScoreTableRequest,
    SpectrumRequest,
    TokenizeRequest,
    TopOutputsRequest,
)
from headscope.engine.core.results import (
    CacheStats,
    CircuitBlock,
    Composition,
    HeadScores,
    PatchResult,
    PatchRow,
    Profile,
    PromptView,
    ScoreNull,
    ScoreTable,
    SingularDirections,
    Spectrum,
    TokenDirection,
    TopTokens,
    VirtualPath,
    rank_edges,
    readonly,
)
from headscope.engine.core.validation import MAX_RESULT_BYTES, SCORE_NAMES, TOP_EDGES
from headscope.engine.sweeps.diff import EDGE_THRESHOLD

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "and", "in", "of",
         " is", "it", "was", "he", "she", "big", "red", "blue"] + [f"w{i}" for i in range(20, 48)]


def _copying(eigs: np.ndarray) -> float:
    total = np.abs(eigs).sum()
    return float(eigs.real.sum() / total) if total > 0 else 0.0


# request class -> the FakeEngine method that answers it (``get``)
ANSWERS: dict[type[Request], str] = {
    CircuitRequest: "circuit_block", TopOutputsRequest: "top_outputs",
    SpectrumRequest: "spectrum", ProfileRequest: "rotary_profile",
    HeadScoresRequest: "head_scores", ScoreTableRequest: "all_head_scores",
    DirectionsRequest: "singular_directions", PathRequest: "virtual_path",
    ScoreNullRequest: "score_null", CompositionRequest: "composition",
    AblationRequest: "ablation", AblationSweepRequest: "all_ablation_effects",
    InductionPromptsRequest: "induction_prompts", PatchInputsRequest: "patch",
    PromptRequest: "run_prompt", TokenizeRequest: "tokenize",
    QKAttributionRequest: "qk_attribution",
    EdgesRequest: "edges", FaithfulnessRequest: "faithfulness",
}


class FakeEngine:
    max_block_bytes = MAX_RESULT_BYTES

    def __init__(self, path: str = "fake/attn-only-2l", *, raw: bool = False,
                 n_layers: int = 2, n_heads: int = 4, d_model: int = 16, d_head: int = 4,
                 n_ctx: int = 32, positional: str = "learned", delay: float = 0.0,
                 sweep_steps: int = 4, fail: set[str] | frozenset[str] = frozenset(),
                 seed: int = 0, sweep_delay: float | None = None) -> None:
        self.path = path
        self.raw = raw
        self.delay = delay
        self.sweep_steps = sweep_steps
        # the ablation sweep's steps together (default ``delay``): a test whose other call must
        # land mid-sweep makes the sweep much the longer, so a busy box cannot reorder them
        self.sweep_delay = delay if sweep_delay is None else sweep_delay
        self.fail = set(fail)
        self.calls: Counter[str] = Counter()
        self.requests: list[tuple[int, int, str, str]] = []  # circuit blocks asked for
        self.patch_requests: list[dict[str, Any]] = []  # patch requests' inputs
        self.path_requests: list[tuple[Any, str]] = []  # path patch requests' edges and input
        self.path_tasks: list[str | None] = []  # path patch requests' task (None: prompts)
        self.gate: asyncio.Event | None = None  # when set to an Event, ready() waits on it
        self.focused: tuple[int, int] | None = None
        self.closed = False
        self.stored_ablation = False  # stored_ablation_effects: None until set
        self._hits = self._misses = 0
        self._in_flight = 0
        self._activity: str | None = None
        self._progress: float | None = None
        self._cache: dict[tuple, Any] = {}
        self.L, self.H, self.d, self.dh = n_layers, n_heads, d_model, d_head
        self.V, self.n_ctx, self.positional = len(WORDS), n_ctx, positional
        rng = np.random.default_rng(seed)
        self.W_E = rng.normal(size=(self.V, d_model)).astype(np.float32)
        self.W_pos = rng.normal(size=(n_ctx, d_model)).astype(np.float32)
        self.W_Q = rng.normal(size=(n_layers, n_heads, d_model, d_head)).astype(np.float32)
        self.W_K = rng.normal(size=(n_layers, n_heads, d_model, d_head)).astype(np.float32)
        self.W_V = rng.normal(size=(n_layers, n_heads, d_model, d_head)).astype(np.float32)
        self.W_O = rng.normal(size=(n_layers, n_heads, d_head, d_model)).astype(np.float32)
        self.W_U = self.W_E.T.copy()
        self._behaviour = rng.uniform(0.0, 0.25, size=(3, n_layers, n_heads))
        self._behaviour[0, 0, min(1, n_heads - 1)] = 0.92  # prev-token head L0.H1
        self._behaviour[2, min(1, n_layers - 1), min(2, n_heads - 1)] = 0.88  # induction L1.H2
        # attention-sink scores from their own generator: the draws above stay as they were
        sink = np.random.default_rng(seed + 1).uniform(0.0, 0.25, size=(1, n_layers, n_heads))
        self._behaviour = np.concatenate((self._behaviour, sink, 0.5 * sink))  # first token, delimiters
        self.structure: dict[str, Any] = {
            "path": path, "format": "native", "family": "native",
            "architecture": "headscope-attn-only", "n_layers": n_layers, "n_heads": n_heads,
            "n_kv_heads": n_heads, "d_model": d_model, "d_head": d_head, "d_vocab": self.V,
            "n_ctx": n_ctx, "d_mlp": None, "positional": positional,
            "normalization": "LNPre", "n_params": 0, "dtype": "float32",
            "tied_unembed": True, "has_mlm_head": False, "causal": True, "processed": not raw,
        }

    # -- plumbing -------------------------------------------------------------------------
    async def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        else:
            await asyncio.sleep(0)
        if name in self.fail:
            raise CorruptFileError(self.path, f"{name} failed: tensor data truncated")

    def _cached(self, key: tuple, compute: Callable[[], Any]) -> Any:
        key = (*key, self.raw)
        if key in self._cache:
            self._hits += 1
            return self._cache[key]
        self._misses += 1
        value = self._cache[key] = compute()
        return value

    def _label(self, i: int) -> str:
        return WORDS[i]

    def encode(self, text: str) -> list[int]:
        return [WORDS.index(w) if w in WORDS else hash(w) % self.V for w in text.split()]

    # -- API ------------------------------------------------------------------------------
    async def get(self, request: Request, progress: Callable[[float], None] | None = None, *,
                  partial: Callable[[Composition], None] | None = None) -> Any:
        """The answer of ``ANSWERS[type(request)]`` (a composition's ``partial`` is not sent)."""
        return await getattr(self, ANSWERS[type(request)])(request, progress)

    async def tokenize(self, req: TokenizeRequest, progress: Any = None) -> list[int]:
        await self._enter("tokenize")
        return self.encode(req.text)

    async def qk_attribution(self, req: QKAttributionRequest, progress: Any = None) -> Any:
        """Not faked: a QK attribution row is a forward pass to the head's layer
        (tests/e2e/test_explorer_why.py runs the "why" view on the real engine)."""
        await self._enter("qk_attribution")
        raise CorruptFileError(self.path, "the fake engine does not compute QK attribution")

    async def edges(self, req: EdgesRequest, progress: Any = None) -> Any:
        """Not faked: edge attribution is a forward and backward pass (tests of the Circuit
        tab run the real engine: tests/e2e/test_explorer_circuit_tab.py)."""
        await self._enter("edges")
        raise CorruptFileError(self.path, "the fake engine does not compute edge attribution")

    async def faithfulness(self, req: FaithfulnessRequest, progress: Any = None) -> Any:
        await self._enter("faithfulness")
        raise CorruptFileError(self.path, "the fake engine does not compute faithfulness")


    async def ready(self) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await self._enter("ready")

    async def set_raw(self, raw: bool) -> None:
        await self._enter("set_raw")
        self.raw = raw
        self.structure = {**self.structure, "processed": not raw}

    def focus(self, layer: int, head: int) -> None:
        self.calls["focus"] += 1
        self.focused = (layer, head)

    def qk_factors(self, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        return self.W_Q[layer, head], self.W_K[layer, head].T

    def ov_factors(self, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        return self.W_V[layer, head], self.W_O[layer, head]

    def token_qk(self, layer: int, head: int) -> np.ndarray:
        A, B = self.qk_factors(layer, head)
        return (self.W_E @ A) @ (B @ self.W_E.T)

    def full_ov(self, layer: int, head: int) -> np.ndarray:
        A, B = self.ov_factors(layer, head)
        return (self.W_E @ A) @ (B @ self.W_U)

    async def circuit_block(self, req: CircuitRequest, progress: Any = None) -> CircuitBlock:
        layer, head, kind, basis = req.layer, req.head_index, req.kind, req.basis
        await self._enter("circuit_block")
        self.requests.append((layer, head, kind, basis))
        if basis == "position":
            A, B = self.qk_factors(layer, head)
            full = (self.W_pos @ A) @ (B @ self.W_pos.T)
            labels = [str(i) for i in range(self.n_ctx)]
        else:
            full = self.token_qk(layer, head) if kind == "qk" else self.full_ov(layer, head)
            labels = list(WORDS)
        r, c = list(req.rows), list(req.cols)
        values = readonly(full[np.ix_(r, c)], np.float32)
        return CircuitBlock(values=values, row_labels=tuple(labels[i] for i in r),
                            col_labels=tuple(labels[i] for i in c), row_ids=tuple(r),
                            col_ids=tuple(c), kind=kind, basis=basis, layer=layer, head=head,
                            vmin=float(values.min()), vmax=float(values.max()),
                            note="W_U is tied W_Eᵀ" if kind == "ov" else "", offset=req.offset)

    async def top_outputs(self, req: TopOutputsRequest, progress: Any = None) -> TopTokens:
        layer, head, source_token, k = req.layer, req.head_index, req.source, req.k
        await self._enter("top_outputs")
        row = self.full_ov(layer, head)[source_token]
        ids = [int(i) for i in np.argsort(-row)[:k]]
        return TopTokens(layer=layer, head=head, source_token=source_token,
                         source_label=WORDS[source_token], ids=tuple(ids),
                         labels=tuple(WORDS[i] for i in ids), values=readonly(row[ids]))

    async def singular_directions(self, req: DirectionsRequest, progress: Any = None) -> SingularDirections:
        layer, head, kind, k, top = req.layer, req.head_index, req.kind, req.k, req.top
        await self._enter("singular_directions")
        matrix = self.full_ov(layer, head) if kind == "ov" else self.token_qk(layer, head)
        u, s, vh = np.linalg.svd(matrix)
        k = min(k, self.W_Q.shape[-1])
        directions = []
        for i in range(k):
            ins = [int(t) for t in np.argsort(-np.abs(u[:, i]))[:top]]
            outs = [int(t) for t in np.argsort(-np.abs(vh[i]))[:top]]
            directions.append(TokenDirection(
                index=i, sigma=float(s[i]), in_ids=tuple(ins), in_labels=tuple(WORDS[t] for t in ins),
                in_values=readonly(u[ins, i], np.float32), out_ids=tuple(outs),
                out_labels=tuple(WORDS[t] for t in outs), out_values=readonly(vh[i, outs], np.float32),
                overlap=len(set(ins) & set(outs)) / max(1, len(ins))))
        return SingularDirections(layer=layer, head=head, kind=kind,  # type: ignore[arg-type]
                                  singular_values=readonly(s[:k], np.float32),
                                  directions=tuple(directions),
                                  overlap=float(np.mean([d.overlap for d in directions])))

    async def virtual_path(self, req: PathRequest, progress: Any = None) -> VirtualPath:
        source, target, rows, cols = req.source, req.target, req.rows, req.cols
        await self._enter("virtual_path")
        (la, ha), (lb, hb) = source, target
        ov_a = self.W_V[la, ha] @ self.W_O[la, ha]
        virtual = self.W_E @ ov_a @ self.W_V[lb, hb] @ self.W_O[lb, hb] @ self.W_U
        path = (self.W_E @ self.W_Q[lb, hb]) @ (self.W_E @ ov_a @ self.W_K[lb, hb]).T
        eig_v, eig_k = np.linalg.eigvals(virtual), np.linalg.eigvals(path)
        return VirtualPath(
            source=source, target=target, v_copying_score=_copying(eig_v),
            v_eigenvalues=readonly(eig_v[np.argsort(-np.abs(eig_v))][: self.W_Q.shape[-1]], np.complex64),
            v_singular_values=readonly(np.linalg.svd(virtual, compute_uv=False)[: self.W_Q.shape[-1]],
                                       np.float32),
            k_positivity=_copying(eig_k),
            k_diagonal=float(np.mean(path.argmax(1) == np.arange(path.shape[0]))),
            k_eigenvalues=readonly(eig_k[np.argsort(-np.abs(eig_k))][: self.W_Q.shape[-1]], np.complex64),
            k_block=readonly(path[np.ix_(rows, cols)], np.float32), row_ids=rows, col_ids=cols,
            row_labels=tuple(WORDS[i] for i in rows), col_labels=tuple(WORDS[i] for i in cols))

    async def score_null(self, req: ScoreNullRequest, progress: Any = None) -> ScoreNull:
        await self._enter("score_null")
        n = len(SCORE_NAMES)
        return ScoreNull(names=SCORE_NAMES, mean=readonly(np.full((n, self.L), 0.05), np.float32),
                         std=readonly(np.full((n, self.L), 0.02), np.float32), samples=64, seed=0)

    async def spectrum(self, req: SpectrumRequest, progress: Any = None) -> Spectrum:
        layer, head, kind = req.layer, req.head_index, req.kind
        await self._enter("spectrum")
        if kind == "ov":
            A, B = self.ov_factors(layer, head)
            A, B = self.W_E @ A, B @ self.W_U
        else:
            A, B = self.qk_factors(layer, head)
            A, B = self.W_E @ A, B @ self.W_E.T
        eigs = np.linalg.eigvals(B @ A)  # eigenvalues of AB are those of BA plus zeros
        eigs = eigs[np.argsort(-np.abs(eigs), kind="stable")]  # like the engine: largest |λ| first
        return Spectrum(eigenvalues=readonly(eigs, np.complex64), score=_copying(eigs), kind=kind,
                        layer=layer, head=head)

    async def rotary_profile(self, req: ProfileRequest, progress: Any = None) -> Profile:
        layer, head, offsets = req.layer, req.head_index, req.offsets
        await self._enter("rotary_profile")
        x = np.asarray(offsets, dtype=np.float64)
        return Profile(layer=layer, head=head, offsets=offsets,
                       values=readonly(np.cos(x / (3.0 + head)) * (layer + 1), np.float32))

    def _scores(self, layer: int, head: int) -> HeadScores:
        ov, qk = self.W_E @ self.W_V[layer, head], self.W_E @ self.W_Q[layer, head]
        eig_ov = np.linalg.eigvals((self.W_O[layer, head] @ self.W_U) @ ov)
        eig_qk = np.linalg.eigvals((self.W_K[layer, head].T @ self.W_E.T) @ qk)
        b = self._behaviour[:, layer, head]
        # float32-rounded, as the engine's score tables are: a head's scores are the same
        # whether they come from head_scores or from the all_head_scores table.
        def f32(x: float) -> float:
            return float(np.float32(x))

        return HeadScores(layer=layer, head=head, copying_score=f32(_copying(eig_ov)),
                          qk_positivity=f32(_copying(eig_qk)), prev_token_score=f32(b[0]),
                          duplicate_token_score=f32(b[1]), induction_score=f32(b[2]),
                          attention_sink_score=f32(b[3]), delimiter_sink_score=f32(b[4]),
                          nonfinite=False)

    async def head_scores(self, req: HeadScoresRequest, progress: Any = None) -> HeadScores:
        layer, head = req.layer, req.head_index
        await self._enter("head_scores")
        return self._cached((layer, head, "scores"), lambda: self._scores(layer, head))

    async def all_head_scores(self, req: ScoreTableRequest,
                              progress: Callable[[float], None] | None = None) -> ScoreTable:
        await self._enter("all_head_scores")
        self._activity = "scoring heads"
        heads = [(layer, h) for layer in range(self.L) for h in range(self.H)]
        out = []
        try:
            for i, (layer, h) in enumerate(heads):
                out.append(self._cached((layer, h, "scores"), lambda lay=layer, h=h: self._scores(lay, h)))
                if progress is not None and (i + 1) % max(1, len(heads) // self.sweep_steps) == 0:
                    # Like the real engine: progress comes from a worker thread.
                    t = threading.Thread(target=progress, args=((i + 1) / len(heads),))
                    t.start()
                    t.join()
                    await asyncio.sleep(self.delay / self.sweep_steps if self.delay else 0)
        finally:
            self._activity = None
        def grid(name: str, dtype: type = np.float32) -> np.ndarray:
            values = np.array([getattr(r, name) for r in out], dtype=dtype)
            return readonly(values.reshape(self.L, self.H))

        return ScoreTable(**{name: grid(name) for name in SCORE_NAMES},
                          nonfinite=grid("nonfinite", bool))

    async def composition(self, req: CompositionRequest,
                          progress: Callable[[float], None] | None = None) -> Composition:
        kind = req.kind
        await self._enter("composition")
        L, H = self.L, self.H
        scores = np.zeros((L, H, L, H))
        for l1 in range(L):
            for h1 in range(H):
                ov1 = self.W_V[l1, h1] @ self.W_O[l1, h1]
                for l2 in range(l1 + 1, L):
                    for h2 in range(H):
                        if kind == "v":
                            m2 = self.W_V[l2, h2] @ self.W_O[l2, h2]
                        else:
                            m2 = self.W_Q[l2, h2] @ self.W_K[l2, h2].T
                            m2 = m2 if kind == "q" else m2.T
                        denom = np.linalg.norm(ov1) * np.linalg.norm(m2)
                        # a pruned (zero) head composes with nothing: NaN, as the engine's
                        scores[l1, h1, l2, h2] = (np.linalg.norm(ov1 @ m2) / denom if denom > 0
                                                  else np.nan)
        baseline = 0.1
        scores = readonly(scores, np.float32)  # the engine's precision; edges come from it too
        if progress is not None:
            progress(1.0)
        return Composition(kind=kind, scores=scores, baseline=baseline,  # type: ignore[arg-type]
                           top_edges=rank_edges(scores, baseline, TOP_EDGES))

    async def run_prompt(self, req: PromptRequest, progress: Any = None) -> _Prompt:
        """Every head's view of the prompt, as the engine's ``PromptRequest`` answers it:
        ``.view(layer, head)`` is one head's."""
        await self._enter("run_prompt")
        return _Prompt(self, req.text)

    def prompt_view(self, text: str, layer: int, head: int) -> PromptView:
        ids = self.encode(text)
        truncated = len(ids) > self.n_ctx
        ids = ids[: self.n_ctx]
        n = len(ids)
        x = self.W_E[ids] + self.W_pos[:n]
        s = (x @ self.W_Q[layer, head]) @ (x @ self.W_K[layer, head]).T / np.sqrt(self.dh)
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dla = (x @ self.W_V[layer, head] @ self.W_O[layer, head] @ self.W_U).max(axis=1)
        logits = x[-1] @ self.W_U
        top = np.argsort(-logits)[:5]
        e = np.exp(logits - logits.max())
        probs = e / e.sum()
        predicted = tuple(int(i) for i in np.argmax(x @ self.W_U, axis=1))
        return PromptView(tokens=tuple(WORDS[i] for i in ids), ids=tuple(ids),
                          pattern=readonly(p, np.float32), dla=readonly(dla, np.float32), predicted=predicted,
                          top_predictions=tuple((int(i), WORDS[i], float(probs[i])) for i in top),
                          truncated=truncated, layer=layer, head=head)

    async def compare(self, other: FakeEngine, *, match_heads: bool = False,
                      threshold: float = EDGE_THRESHOLD) -> Any:
        """``engine.sweeps.diff.diff_models`` on the fake weights: dense circuits, same rules.

        Similarities are cosines of the dense full OV / token QK matrices; ``change`` is
        engine.sweeps.diff's measure (lost similarity or the largest score delta)."""
        from headscope.engine.sweeps.diff import SCORE_KEYS, ModelDiff, _change_size, edge_changes

        await self._enter("compare")
        await other.ready()

        def cosine(x: np.ndarray, y: np.ndarray) -> float:
            d = float(np.linalg.norm(x) * np.linalg.norm(y))
            return float((x * y).sum() / d) if d > 0 else 0.0

        heads = []
        for layer in range(self.L):
            for head in range(self.H):
                sa, sb = self._scores(layer, head), other._scores(layer, head)
                row: dict[str, Any] = {
                    "layer": layer, "head": head, "matched_head": head,
                    "ov_similarity": cosine(self.full_ov(layer, head), other.full_ov(layer, head)),
                    "qk_similarity": cosine(self.token_qk(layer, head),
                                            other.token_qk(layer, head))}
                for key in SCORE_KEYS:
                    a, b = float(getattr(sa, key)), float(getattr(sb, key))
                    row[f"{key}_a"], row[f"{key}_b"], row[f"{key}_delta"] = a, b, b - a
                row["change"] = _change_size(row)
                heads.append(row)
        composition = {}
        for kind in "qkv":
            ca, cb = (await self.get(CompositionRequest(kind)), await other.get(CompositionRequest(kind)))
            above_a = np.nan_to_num(np.asarray(ca.scores), nan=0.0) - ca.baseline
            above_b = np.nan_to_num(np.asarray(cb.scores), nan=0.0) - cb.baseline
            identity = [list(range(self.H)) for _ in range(self.L)]
            out = edge_changes(above_a, above_b, identity, threshold)
            composition[kind] = {"baseline_a": ca.baseline, "baseline_b": cb.baseline,
                                 "threshold": threshold, **out}
        biggest = sorted(heads, key=lambda r: -r["change"])[:10]
        return ModelDiff(heads=heads, matching=None, composition=composition,
                         biggest_changes=[{"layer": r["layer"], "head": r["head"],
                                           "change": r["change"]} for r in biggest])

    def prune(self, layer: int, head: int) -> FakeEngine:
        """Zero the head (every weight, and its behaviour), as a pruned checkpoint would."""
        for w in (self.W_Q, self.W_K, self.W_V, self.W_O):
            w[layer, head] = 0
        self._behaviour[:, layer, head] = 0
        self._cache.clear()
        return self

    async def ablation(self, req: AblationRequest, progress: Any = None) -> float:
        await self._enter("ablation")
        return float(self._behaviour[2, req.layer, req.head_index])

    async def all_ablation_effects(self, req: AblationSweepRequest,
                                   progress: Callable[[float], None] | None = None) -> np.ndarray | None:
        if req.stored_only:
            return await self.stored_ablation_effects()
        self._activity = "ablation sweep"
        try:
            await self._enter("all_ablation_effects")
            for step in range(1, self.sweep_steps + 1):
                if progress is not None:
                    t = threading.Thread(target=progress, args=(step / self.sweep_steps,))
                    t.start()
                    t.join()
                await asyncio.sleep(self.sweep_delay / self.sweep_steps if self.sweep_delay else 0)
        except asyncio.CancelledError:
            self.calls["all_ablation_effects cancelled"] += 1
            raise
        finally:
            self._activity = None
        return readonly(self._behaviour[2], np.float32)  # the same values ``ablation`` gives

    async def stored_ablation_effects(self) -> np.ndarray | None:
        """What a results store would hold: the sweep's values once ``stored_ablation`` is
        set (an earlier run's `a`, or the CLI's ``heads --ablation``), else None."""
        await self._enter("stored_ablation_effects")
        return readonly(self._behaviour[2], np.float32) if self.stored_ablation else None

    # -- patching (planted: the induction head L1.H2 recovers most) ------------------------
    async def induction_prompts(self, req: InductionPromptsRequest, progress: Any = None
                                ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        task = req.task
        self.calls["induction_prompts"] += 1
        await asyncio.sleep(0)
        half = tuple(range(3, 9))
        if task == "first-occurrence":  # every other token of the first copy redrawn
            return half + half, (20, 4, 21, 6, 22, 8, *half)
        return half + half, half + tuple(range(20, 26))

    def patch_table(self, site: str = "out", method: str = "exact") -> np.ndarray:
        """``[L, H]`` recovered of the fake: the behavioural induction score, L1.H2 planted
        highest, one head slightly negative; attribution: the same times 0.9."""
        table = self._behaviour[2].copy()
        table[0, 0] = -0.05
        if site != "out":
            table = table * 0.5
        return table * (0.9 if method == "attribution" else 1.0)

    async def patch(self, req: PatchInputsRequest,
                    progress: Callable[[float], None] | None = None) -> PatchResult:
        if req.edges is not None:
            return await self.path_patch(req)
        clean, corrupt, answer, wrong = (list(req.clean) if isinstance(req.clean, tuple) else req.clean,
                                         list(req.corrupt) if isinstance(req.corrupt, tuple) else req.corrupt,
                                         req.answer, req.wrong)
        site, method, task = req.site, req.method, req.task
        self.patch_requests.append({"clean": clean, "corrupt": corrupt, "answer": answer,
                                    "wrong": wrong, "site": site, "method": method, "task": task})
        self._activity = "patching"
        try:
            self.calls["patch"] += 1  # ``delay`` is spread over the progress steps
            if "patch" in self.fail:
                raise CorruptFileError(self.path, "patch failed: tensor data truncated")
            if clean is not None and corrupt is not None and len(clean) != len(corrupt):
                raise PromptError(self.path, f"the clean and corrupt inputs must have the same "
                                  f"length: clean has {len(clean)} tokens, corrupt {len(corrupt)}")
            if clean is not None and (answer is None or wrong is None):
                raise PromptError(self.path, "the logit difference needs --answer and --wrong tokens")
            for step in range(1, self.sweep_steps + 1):
                if progress is not None:
                    t = threading.Thread(target=progress, args=(step / self.sweep_steps,))
                    t.start()
                    t.join()
                await asyncio.sleep(self.delay / self.sweep_steps if self.delay else 0)
        except asyncio.CancelledError:
            self.calls["patch cancelled"] += 1
            raise
        finally:
            self._activity = None
        table = self.patch_table(site, method)
        clean_m, corrupt_m = -0.5, -6.0
        rows = tuple(PatchRow(((layer, head),), corrupt_m + float(table[layer, head]) * 5.5,
                              float(table[layer, head]),
                              estimate=float(table[layer, head]) * 5.5 if method == "attribution" else None)
                     for layer in range(self.L) for head in range(self.H))
        return PatchResult(method=method, site=site,  # type: ignore[arg-type]
                           metric=task or ("induction" if answer is None else "logit_diff"), noising=False,
                           clean=clean_m, corrupt=corrupt_m, rows=rows, n_layers=self.L,
                           n_heads=self.H, tokens=12, batch=1 if clean is not None else 4)

    async def path_patch(self, req: PatchInputsRequest) -> PatchResult:
        """Path patching of ``req.edges`` into the receivers' ``req.site``. Planted: an edge into L1.H2 recovers 0.3 (v) or 0.2 (q, k) per unit of the
        sender's prev-token score; every other edge 0."""
        await self._enter("path_patch")
        edges, receiver_input, task = req.edges or (), req.site, req.task
        self.path_requests.append((tuple(edges), receiver_input))
        self.path_tasks.append(task)
        rows = []
        for sender, receiver in edges:
            rec = 0.0
            if tuple(receiver) == (min(1, self.L - 1), min(2, self.H - 1)):
                rec = (0.3 if receiver_input == "v" else 0.2) * float(self._behaviour[0][sender])
            rows.append(PatchRow((tuple(sender), tuple(receiver)), -6.0 + 5.5 * rec, rec))
        return PatchResult(method="path", site=receiver_input, metric=task or "induction",
                           noising=False, clean=-0.5, corrupt=-6.0, rows=tuple(rows),
                           n_layers=self.L, n_heads=self.H, tokens=12, batch=4)

    def stats(self) -> CacheStats:
        return CacheStats(hits=self._hits, misses=self._misses, evictions=0, bytes=0,
                          capacity=1 << 20, entries=len(self._cache), in_flight=self._in_flight,
                          activity=self._activity, progress=self._progress)

    async def aclose(self) -> None:
        self.closed = True
        self.calls["aclose"] += 1


class _Prompt:
    """A prompt through the fake model: each head's view on demand (``PromptResult.view``)."""

    def __init__(self, engine: FakeEngine, text: str) -> None:
        self.engine, self.text = engine, text

    def view(self, layer: int, head: int) -> PromptView:
        return self.engine.prompt_view(self.text, layer, head)


def broken_factory(path: str = "broken/model.safetensors") -> Callable[..., Any]:
    """An engine factory that fails like a corrupt checkpoint does, before any structure."""

    def factory(*_: Any, **__: Any) -> Any:
        raise CorruptFileError(path, "safetensors header length exceeds file size")

    return factory


__all__ = ["CancelledError", "FakeEngine", "broken_factory"]
