"""The notebook ``Model``: an open checkpoint with the conveniences of README.md's "Python API".

``engine.model.loading`` opens a checkpoint into the plain data class (path, configs,
weights, tokenizer); the sweeps, the service and the CLI work on that. This module, part of
the engine's facade (the UI imports ``engine.core``, ``engine.api`` and ``engine.service``
only: docs/internals.md, "Layers"), adds what a notebook asks of a model — a circuit, the
head table, a composition sweep, a head's singular directions, a virtual path, a forward
pass — each a request of ``core.requests`` (validated where it is built) computed by
``sweeps.dispatch.compute``, the function under the explorer's ``Engine`` too; ``Model.get``
takes any request. Those imports are made in the methods: ``read_structure`` and
``open_model`` stay free of torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.model import loading
from headscope.engine.model.loading import read_structure

if TYPE_CHECKING:
    from headscope.engine.circuits.factored import FactoredMatrix
    from headscope.engine.core.attribution import QKAttribution
    from headscope.engine.core.edge_results import EdgeAttribution, FaithfulnessResult
    from headscope.engine.core.requests import Request
    from headscope.engine.core.results import Composition, PatchResult
    from headscope.engine.forward.transformer import ForwardResult
    from headscope.engine.sweeps.store import ResultStore

__all__ = ["CIRCUITS", "InputWarning", "Model", "open_model", "read_structure", "supported_checkpoints"]

# The circuits ``Model.circuit`` names (engine.circuits.head_circuits makes them).
CIRCUITS = ("qk", "ov", "token_qk", "full_ov", "positional_qk")


def supported_checkpoints() -> dict[str, list[str]]:
    """What opens: ``families`` (README.md's "Supported checkpoints" table, in its order),
    the Hugging Face ``architectures`` of their ``config.json`` and the ``gguf``
    architectures of llama.cpp files. The one source of ``headscope --help``'s list."""
    from headscope.engine.model import gguf_config
    from headscope.engine.model.adapters import registry

    return {"families": registry.family_names(),
            "architectures": registry.supported_architectures(),
            "gguf": sorted(gguf_config.ARCHS)}


class Model(loading.LoadedModel):
    """An open model (``engine.model.loading.LoadedModel``) with the notebook conveniences: thin
    wrappers over ``engine.circuits``, ``engine.forward``, ``sweeps.dispatch.compute`` and
    ``api.report``, so a notebook gets the numbers and the errors of the CLI."""

    def get(self, request: Request, *, store: ResultStore | None = None,
            progress: Callable[[float], None] | None = None) -> Any:
        """The result of any request of ``core.requests`` (built with ``SomeRequest.of(
        model.structure(), ...)``), computed as the CLI and the explorer compute it; ``store``:
        a results store (``engine.api.store``) to read and write stored requests."""
        from headscope.engine.sweeps.dispatch import compute

        entry = None if store is None else store.for_model(self)
        return compute(self, request, progress=progress, store=entry)

    def circuit(self, layer: int, head: int, kind: str = "ov") -> FactoredMatrix:
        """A head's circuit as a FactoredMatrix: ``"qk"``/``"ov"`` (``d_model × d_model``),
        ``"token_qk"``, ``"full_ov"`` (``d_vocab × d_vocab``) or ``"positional_qk"``."""
        from headscope.engine.circuits import head_circuits as circuits


        if kind not in CIRCUITS:
            raise InvalidRequestError(self.path, f"unknown circuit {kind!r}; choose from {', '.join(CIRCUITS)}")
        self.cfg.check_head(layer, head, str(self.path))
        return getattr(circuits, kind)(self.weights, layer, head)

    def heads(self, seed: int = 0, *, ablation: bool = False) -> list[dict[str, Any]]:
        """Every head with every score (what ``headscope heads [--ablation]`` prints)."""
        from headscope.engine.api.report import head_table

        return head_table(self, seed=seed, ablation=ablation)

    def composition(self, kind: str, seed: int = 0) -> Composition:
        """All ``kind``-composition scores (``.scores [L, H, L, H]``, ``.baseline``,
        ``.top_edges``): the sweep of ``headscope composition``, so the same numbers."""
        from headscope.engine.core.requests import CompositionRequest

        return self.get(CompositionRequest.of(self.structure(), kind, seed, where=str(self.path)))

    def singular_directions(self, layer: int, head: int, kind: str = "ov", *, k: int = 5,
                            top: int = 10) -> dict[str, Any]:
        """A head's top singular directions as tokens (what ``headscope svd --json`` prints)."""
        from headscope.engine.api.report import svd_report

        return svd_report(self, layer, head, kind, k=k, top=top)  # type: ignore[arg-type]

    def virtual_path(self, source: tuple[int, int], target: tuple[int, int]) -> dict[str, Any]:
        """The virtual heads of a composition path (what ``headscope path --json`` prints)."""
        from headscope.engine.api.report import path_report

        return path_report(self, source, target)

    def patch(self, clean: str | Sequence[Any] | None = None, corrupt: str | Sequence[Any] | None = None, *,
              answer: int | str | None = None, wrong: int | str | None = None, site: str = "out",
              method: str = "exact", noising: bool = False, heads: Any = None, by_position: bool = False,
              verify: int = 0, task: str | None = None, seed: int = 0, seq_len: int | None = None,
              batch: int = 4, store: ResultStore | None = None,
              progress: Callable[[float], None] | None = None) -> PatchResult:
        """Activation (``method="exact"``) or attribution patching of every head (what
        ``headscope patch`` prints; docs/math.md, "Patching"). ``clean``/``corrupt``: text,
        token ids or a batch of id lists, of the same length, with the ``answer`` and
        ``wrong`` tokens of the logit difference (ids, ``"id:7"``, or token strings: with text
        prompts, digits that are a vocabulary token are that token); a batch is a list of texts,
        of id lists, or a 2-D array; neither: the seeded
        built-in ``task``, ``"induction"`` (the default) or ``"first-occurrence"`` (its first
        copy corrupted, not its second: the path through an induction head's keys carries
        the answer; docs/math.md, "Patching"). ``heads``: sets patched together (``"L1.H1,L1.H2"``, ``[(1, 1), (1, 2)]``,
        or a list of such sets; numpy integers too); ``store``: a results store (``engine.api.store``)
        to reuse. What the CLI says on stderr about the inputs (words outside the vocabulary,
        digits read as a token) is an ``InputWarning``."""
        from headscope.engine.sweeps.prompts import patch_request

        notes: list[str] = []
        req = patch_request(self, clean, corrupt, answer=answer, wrong=wrong, site=site, method=method,
                            noising=noising, heads=heads, by_position=by_position, verify=verify,
                            task=task, seed=seed, seq_len=seq_len, batch=batch, notes=notes)
        _warn(notes)
        return self.get(req, store=store, progress=progress)

    def path_patch(self, sender: tuple[int, int] | str, receiver: tuple[int, int] | str,
                   clean: str | Sequence[Any] | None = None, corrupt: str | Sequence[Any] | None = None, *,
                   patch: str = "q", answer: int | str | None = None, wrong: int | str | None = None,
                   noising: bool = False, task: str | None = None, seed: int = 0,
                   seq_len: int | None = None, batch: int = 4, store: ResultStore | None = None,
                   progress: Callable[[float], None] | None = None) -> PatchResult:
        """Path patching of the edge ``sender -> receiver`` (what ``headscope path-patch``
        prints): the sender's clean output into the receiver's ``patch`` input (q, k or v)
        only; inputs, ``task`` and metric as ``patch``; heads as pairs or ``"L0.H1"``. One row,
        ``heads = (sender, receiver)``. Any edge of ``edges``' graph, by its nodes' names: a
        sender ``"input"``, ``"a0.h1"`` or ``"m0"``, a receiver ``"a1.h2<k>"`` (its input named:
        ``patch`` is not needed), ``"m1"`` or ``"logits"`` (``core.path_nodes``; such an end's
        row pair is ``path_nodes.node_key``'s). With ``noising=True`` this is the number
        ``edges(verify=K)`` gives the edge as its ``exact`` check (its ``patched``)."""
        from headscope.engine.sweeps.prompts import patch_request

        notes: list[str] = []
        req = patch_request(self, clean, corrupt, answer=answer, wrong=wrong, site=patch, noising=noising,
                            task=task, seed=seed, seq_len=seq_len, batch=batch, edge=(sender, receiver),
                            notes=notes)
        _warn(notes)
        return self.get(req, store=store, progress=progress)

    def qk_attribution(self, head: str | Sequence[int], *, prompt: str | None = None,
                       tokens: Sequence[int] | None = None, query: int, key: int | None = None,
                       confirm: int = 0) -> QKAttribution:
        """Why ``head`` (``"L1.H2"`` or ``(1, 2)``) scores each key from position ``query`` on
        a prompt (text, tokenised as the Prompt tab does, or ids): the whole query row split
        into (query source, key source) terms (what ``headscope qk-attribution`` prints;
        docs/math.md, "QK attribution"). ``key``, if given, is checked (``0 <= key <= query``);
        read it with ``.ranked_terms(key)`` and ``.totals(key)``. ``confirm = N``: each side's
        top N sources at each key also removed from that side exactly, the norm's scale frozen
        and recomputed (``.exact(key)``; a second pass to the layer)."""
        from headscope.engine.sweeps.attribution import qk_attribution_request

        return self.get(qk_attribution_request(self, head, prompt=prompt, tokens=tokens, query=query, key=key,
                                               confirm=confirm))

    def edges(self, clean: str | Sequence[Any] | None = None, corrupt: str | Sequence[Any] | None = None, *,
              answer: int | str | None = None, wrong: int | str | None = None, task: str | None = None,
              method: str = "eap-ig", steps: int = 5, verify: int = 0, seed: int = 0, seq_len: int | None = None,
              batch: int = 4, store: ResultStore | None = None,
              progress: Callable[[float], None] | None = None) -> EdgeAttribution:
        """EAP or EAP-IG scores of every edge (what ``headscope edges`` prints; docs/math.md,
        "Edge attribution"): ``.scores`` (``EdgeScores``: ``.score(name)``, ``.ranked()``) and
        ``.exact``, the top ``verify`` edges patched alone. Inputs, ``task`` and metric as ``patch``."""
        from headscope.engine.sweeps.edges import edges_request

        return self.get(edges_request(self, clean, corrupt, answer=answer, wrong=wrong, task=task, method=method,
                                      steps=steps, verify=verify, seed=seed, seq_len=seq_len, batch=batch),
                        store=store, progress=progress)

    def faithfulness(self, clean: str | Sequence[Any] | None = None, corrupt: str | Sequence[Any] | None = None,
                     *, top: int | Sequence[int] = (), curve: bool = False, answer: int | str | None = None,
                     wrong: int | str | None = None, task: str | None = None, method: str = "eap-ig",
                     steps: int = 5, seed: int = 0, seq_len: int | None = None, batch: int = 4,
                     store: ResultStore | None = None,
                     progress: Callable[[float], None] | None = None) -> FaithfulnessResult:
        """The faithfulness of the top-``top`` circuits (one N or several) of an edge
        attribution, and with ``curve`` the curve over 1 … 100 % of the edges (what ``headscope
        faithfulness`` prints): ``.points``, ``.curve``, ``.scores``."""
        from headscope.engine.sweeps.edges import faithfulness_request

        return self.get(faithfulness_request(self, clean, corrupt, tops=top, curve=curve, answer=answer, wrong=wrong,
                                             task=task, method=method, steps=steps, seed=seed, seq_len=seq_len,
                                             batch=batch), store=store, progress=progress)

    def run(self, tokens: str | Sequence[int], **kwargs: Any) -> ForwardResult:
        """The reference forward pass on a prompt (encoded with the tokenizer) or token ids."""
        from headscope.engine.core.validation import check_tokens
        from headscope.engine.forward.transformer import run

        ids = self.tokenizer.encode(tokens) if isinstance(tokens, str) else list(tokens)
        check_tokens(self.structure(), ids, str(self.path))
        return run(self.weights, ids, **kwargs)


class InputWarning(UserWarning):
    """What ``Model.patch`` says about its inputs (words that became ``<unk>``, digits read as
    a token) — what the CLI prints on stderr."""


def _warn(notes: list[str]) -> None:
    import warnings

    for note in notes:
        warnings.warn(note, InputWarning, stacklevel=3)


def open_model(path: str | os.PathLike[str], raw: bool = False) -> Model:
    """``engine.model.loading.load_model`` as the notebook ``Model`` (the same weights,
    tokenizer and caches; ``with_raw`` keeps the class)."""
    opened = loading.load_model(path, raw=raw)
    return Model(**{f.name: getattr(opened, f.name) for f in dataclasses.fields(opened)})
