"""One head's views, each computed from its request (``core.requests``): a labelled circuit
block, the top output tokens, a spectrum, a rotary profile, an ablation, singular directions,
and the virtual heads of a path between two heads (docs/math.md, "Reading a head", "Virtual
heads"). The maths is in ``engine.circuits``; this module selects, labels and packs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from headscope.engine.core.errors import NonFiniteError
from headscope.engine.core.progress import Cancelled, check_cancelled
from headscope.engine.core.requests import (
    AblationRequest,
    CircuitRequest,
    DirectionsRequest,
    PathRequest,
    ProfileRequest,
    SpectrumRequest,
    TopOutputsRequest,
    computes,
)
from headscope.engine.core.results import (
    CircuitBlock,
    Profile,
    SingularDirections,
    Spectrum,
    TokenDirection,
    TopTokens,
    VirtualPath,
    readonly,
)
from headscope.engine.core.validation import PATH_SAMPLE
from headscope.engine.model.caveats import ov_caveats, qk_caveats
from headscope.engine.sweeps.prompts import label

if TYPE_CHECKING:
    from headscope.engine.model.loading import LoadedModel
    from headscope.engine.sweeps.store import ModelStore


def _unembed_note(model: LoadedModel) -> str:
    return "W_U is tied W_Eᵀ" if model.cfg.tied_unembed else ""


@computes(CircuitRequest)
def labelled_block(model: LoadedModel, req: CircuitRequest, **_: Any) -> CircuitBlock:
    """The block ``req`` asks for (``head_circuits.circuit_block``), labelled."""
    from headscope.engine.circuits import head_circuits

    values = head_circuits.circuit_block(model.weights, req.layer, req.head_index, req.kind, req.basis,
                                         req.rows, req.cols, req.offset)
    array = readonly(values, np.float32)
    finite = array[np.isfinite(array)]
    if req.basis == "position":
        row_labels, col_labels = tuple(map(str, req.rows)), tuple(map(str, req.cols))
    else:
        row_labels = tuple(label(model.tokenizer, t) for t in req.rows)
        col_labels = tuple(label(model.tokenizer, t) for t in req.cols)
    notes = []
    if req.kind == "ov" and model.cfg.tied_unembed:
        notes.append(_unembed_note(model))
    # Where the circuit is not exactly what the model computes (docs/math.md).
    notes += ov_caveats(model.cfg) if req.kind == "ov" else qk_caveats(model.cfg)
    if finite.size < array.size:
        notes.append("NaN/inf in this head's weights")
    return CircuitBlock(
        values=array,
        row_labels=row_labels,
        col_labels=col_labels,
        row_ids=req.rows,
        col_ids=req.cols,
        kind=req.kind,  # type: ignore[arg-type]
        basis=req.basis,  # type: ignore[arg-type]
        layer=req.layer,
        head=req.head_index,
        vmin=float(finite.min()) if finite.size else float("nan"),
        vmax=float(finite.max()) if finite.size else float("nan"),
        note="; ".join(notes),
        offset=req.offset,
    )


@computes(TopOutputsRequest)
def top_outputs(model: LoadedModel, req: TopOutputsRequest, **_: Any) -> TopTokens:
    """The output tokens the full OV circuit raises most when the head attends to ``source``."""
    from headscope.engine.circuits import head_circuits

    layer, head, source, k = req.layer, req.head_index, req.source, max(1, min(req.k, model.cfg.d_vocab))
    row = head_circuits.full_ov_row(model.weights, layer, head, source)
    ids = np.argsort(-row, kind="stable")[:k]  # the k largest, largest first
    values = row[ids]
    tok = model.tokenizer
    return TopTokens(
        layer=layer,
        head=head,
        source_token=source,
        source_label=label(tok, source),
        ids=tuple(int(i) for i in ids),
        labels=tuple(label(tok, int(i)) for i in ids),
        values=readonly(values, np.float32),
        note=_unembed_note(model),
    )


@computes(SpectrumRequest)
def head_spectrum(model: LoadedModel, req: SpectrumRequest, *, cancelled: Cancelled = None,
                  store: ModelStore | None = None, **_: Any) -> Spectrum:
    """Eigenvalues of the full OV (``"ov"``) or token QK (``"qk"``) circuit, and its score;
    kept in the results store per head (eigenvalues and score)."""
    layer, head, kind = req.layer, req.head_index, req.kind
    name, index = f"spectrum-{kind}", f"L{layer}H{head}"
    if store is not None:
        eig = store.load(name, index, None, np.complex64)
        score = store.load(f"{name}-score", index, (), np.float64)
        if eig is not None and score is not None:
            return Spectrum(readonly(eig, np.complex64), float(score), kind, layer, head)  # type: ignore[arg-type]
    found = _spectrum_now(model, layer, head, kind, cancelled)
    if store is not None:
        store.save(name, found.eigenvalues, index)
        store.save(f"{name}-score", np.asarray(found.score, np.float64), index)
    return found


def _spectrum_now(model: LoadedModel, layer: int, head: int, kind: str, cancelled: Cancelled) -> Spectrum:
    from headscope.engine.circuits import head_circuits, spectral

    w = model.weights
    if kind == "ov":
        fm = head_circuits.full_ov(w, layer, head)
        score = spectral.copying_score(fm)
    else:
        fm = head_circuits.token_qk(w, layer, head)
        score = spectral.qk_positivity(fm)
    check_cancelled(cancelled)
    # NaN/inf weights (flagged in HeadScores.nonfinite): an empty spectrum with a NaN score,
    # like every other score of the head, rather than an error.
    eig = eigenvalues_by_size(fm)
    return Spectrum(
        eigenvalues=readonly(eig, np.complex64),
        score=float(score),
        kind=kind,  # type: ignore[arg-type]
        layer=layer,
        head=head,
    )


@computes(ProfileRequest)
def head_profile(model: LoadedModel, req: ProfileRequest, **_: Any) -> Profile:
    """The head's QK score at each query-key offset Δ of ``req.offsets`` (rotary models)."""
    from headscope.engine.circuits import head_circuits

    values = head_circuits.rotary_profile(model.weights, req.layer, req.head_index, list(req.offsets))
    return Profile(req.layer, req.head_index, req.offsets, readonly(values, np.float32))


@computes(AblationRequest)
def head_ablation(model: LoadedModel, req: AblationRequest, **_: Any) -> float:
    """Loss increase on the seeded repeated sequence when the head's output is zeroed."""
    from headscope.engine.forward import behaviour

    return float(behaviour.ablation_effect(model.weights, req.layer, req.head_index, seed=req.seed))


@computes(DirectionsRequest)
def token_directions(model: LoadedModel, req: DirectionsRequest, **_: Any) -> SingularDirections:
    """The top ``k`` singular directions of the full OV / token QK circuit, ``top`` tokens a
    side."""
    from headscope.engine.circuits import directions, head_circuits

    layer, head, kind, k, top = req.layer, req.head_index, req.kind, req.k, req.top
    w = model.weights
    fm = head_circuits.full_ov(w, layer, head) if kind == "ov" else head_circuits.token_qk(w, layer, head)
    found = directions.signed_directions(fm, k)
    tok = model.tokenizer
    rows = []
    for i in range(found.s.shape[0]):
        in_ids, in_values = directions.top_by_magnitude(found.u[:, i], top)
        out_ids, out_values = directions.top_by_magnitude(found.v[:, i], top)
        rows.append(TokenDirection(
            index=i, sigma=float(found.s[i]),
            in_ids=tuple(in_ids), in_labels=tuple(label(tok, t) for t in in_ids),
            in_values=readonly(in_values, np.float32),
            out_ids=tuple(out_ids), out_labels=tuple(label(tok, t) for t in out_ids),
            out_values=readonly(out_values, np.float32),
            overlap=directions.overlap(in_ids, in_values, out_ids, out_values),
        ))
    overlaps = [d.overlap for d in rows]
    return SingularDirections(
        layer=layer, head=head, kind=kind,  # type: ignore[arg-type]
        singular_values=readonly(found.s, np.float32), directions=tuple(rows),
        overlap=float(np.mean(overlaps)) if overlaps else float("nan"),
    )


def eigenvalues_by_size(fm: Any) -> np.ndarray:
    """The circuit's eigenvalues, largest ``|λ|`` first; none for non-finite weights."""
    try:
        eig = fm.eigenvalues
    except NonFiniteError:
        return np.zeros(0, dtype=np.complex64)
    return eig[np.argsort(-np.abs(eig), kind="stable")]


@computes(PathRequest)
def virtual_heads(model: LoadedModel, req: PathRequest, **_: Any) -> VirtualPath:
    """The V- and K-composition virtual heads of ``req.source → req.target``: spectra and
    scores, a ``rows × cols`` block of the K-path, and its diagonal rate on a seeded sample of
    ``PATH_SAMPLE`` token ids (docs/math.md, "Virtual heads")."""
    from headscope.engine.circuits import directions, spectral
    from headscope.engine.circuits.head_circuits import token_sample

    source, target, rows, cols = req.source, req.target, req.rows, req.cols
    sample = token_sample(model.cfg.d_vocab, PATH_SAMPLE, req.seed)

    w, tok = model.weights, model.tokenizer
    virtual = directions.virtual_ov(w, source, target)
    path = directions.k_path(w, source, target)
    try:
        singular = virtual.S
    except NonFiniteError:
        singular = np.zeros(0)
    block = path.block(list(rows), list(cols))
    return VirtualPath(
        source=source, target=target,
        v_copying_score=float(spectral.copying_score(virtual)),
        v_eigenvalues=readonly(eigenvalues_by_size(virtual), np.complex64),
        v_singular_values=readonly(singular, np.float32),
        k_positivity=float(spectral.qk_positivity(path)),
        k_diagonal=directions.diagonal_rate(path.block(sample, sample)),
        k_eigenvalues=readonly(eigenvalues_by_size(path), np.complex64),
        k_block=readonly(block, np.float32),
        row_ids=tuple(rows), col_ids=tuple(cols),
        row_labels=tuple(label(tok, t) for t in rows),
        col_labels=tuple(label(tok, t) for t in cols),
    )
