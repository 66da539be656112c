"""Acceptance of `headscope diff` on the bundled attn-only-2l: self-diff, a pruned induction head, and
heads permuted within a layer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from headscope.engine.model.loading import load_model
from headscope.engine.sweeps.diff import diff_models
from tests.conftest import INDUCTION_HEAD as INDUCTION
from tests.conftest import PREV_TOKEN_HEAD as PREV
from tests.conftest import sample_model


def rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a native checkpoint, editing its tensors (config kept in the metadata)."""
    shutil.copytree(src, dst)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k).clone() for k in f.keys()}  # noqa: SIM118
        metadata = f.metadata()
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata=metadata)
    return dst


def permuted_copy(src: Path, dst: Path, perm: list[int]) -> Path:
    """``src`` with every layer's heads permuted: the copy's head i is ``src``'s head perm[i]."""

    def permute(t: dict[str, torch.Tensor]) -> None:
        for key in t:
            if ".attn." in key and key.rsplit(".", 1)[-1] in ("W_Q", "W_K", "W_V", "W_O",
                                                              "b_Q", "b_K", "b_V"):
                t[key] = t[key][perm].contiguous()

    return rewrite(src, dst, permute)


@pytest.fixture(scope="module")
def base() -> Path:
    return sample_model("attn-only-2l")


def test_self_diff_is_identity(base) -> None:
    d = diff_models(load_model(base), load_model(base))
    for row in d.heads:
        assert row["ov_similarity"] == pytest.approx(1.0, abs=1e-5)
        assert row["qk_similarity"] == pytest.approx(1.0, abs=1e-5)
        assert row["copying_score_delta"] == pytest.approx(0.0, abs=1e-6)
        assert row["induction_score_delta"] == pytest.approx(0.0, abs=1e-6)
    for kind in "qkv":
        assert d.composition[kind]["gained"] == d.composition[kind]["lost"] == []


def test_pruned_induction_head_is_named_first_with_its_lost_k_edge(base, tmp_path) -> None:
    layer, head = INDUCTION

    def prune(t: dict[str, torch.Tensor]) -> None:
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            key = f"blocks.{layer}.attn.{name}"
            if key in t:
                t[key][head] = 0

    pruned = rewrite(base, tmp_path / "pruned", prune)
    d = diff_models(load_model(base), load_model(pruned))
    first = d.biggest_changes[0]
    assert (first["layer"], first["head"]) == INDUCTION
    lost = d.composition["k"]["lost"]
    assert lost, "pruning the induction head loses K-composition edges"
    assert (tuple(lost[0]["source"]), tuple(lost[0]["target"])) == (PREV, INDUCTION)


def test_permuted_heads_are_matched_back(base, tmp_path) -> None:
    n_heads = load_model(base).cfg.n_heads
    perm = [(i + 1) % n_heads for i in range(n_heads)]  # B's head i is A's head perm[i]
    shuffled = permuted_copy(base, tmp_path / "shuffled", perm)
    d = diff_models(load_model(base), load_model(shuffled), match_heads=True)
    inverse = [perm.index(h) for h in range(n_heads)]  # A's head h sits at B's head inverse[h]
    assert d.matching == [inverse, inverse]
    for row in d.heads:
        assert row["ov_similarity"] == pytest.approx(1.0, abs=1e-5)
        assert row["copying_score_delta"] == pytest.approx(0.0, abs=1e-5)
    assert all(d.composition[k]["lost"] == [] for k in "qkv")
