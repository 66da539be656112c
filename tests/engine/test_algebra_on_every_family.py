"""The one (numpy) weight algebra against dense definitions computed in torch from the
processed weights (parity-tested against transformers and TransformerLens), read through the
forward layer's zero-copy torch view, on every family's fixture (processed and raw,
fp32/fp16/bf16, GQA), with non-finite and overflowing heads, and the weight-only commands
checked not to import torch at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from headscope.engine.circuits import composition, spectral
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.loading import load_model
from headscope.engine.sweeps import scores as score_sweeps
from tests import family_fixtures, hf_fixtures, hf_fixtures_phi

BUILDERS = {**hf_fixtures.FAMILIES, **family_fixtures.NEW_FAMILIES, **hf_fixtures_phi.PHI_FAMILIES}
CASES = [(name, None) for name in BUILDERS] + [("llama", "bfloat16"), ("neox", "float16"), ("gpt2", "bfloat16")]
ROOT = Path(__file__).resolve().parents[2]


def _build(name: str, dtype: str | None, tmp_path: Path) -> Path:
    kwargs = {"dtype": dtype} if dtype else {}
    return BUILDERS[name](tmp_path, **kwargs)[0]


def _torch_weights(model) -> dict[str, torch.Tensor]:
    """The reference: ``model.weights`` (``ProcessedWeights``: parity-tested against
    transformers and TransformerLens) as torch tensors (``torch_weights``) in float64, for the
    dense definitions below (torch eigenvalues and norms, not the numpy algebra under test)."""
    w = torch_weights(model.weights)
    names = ["embed.W_E", "unembed.W_U"] + [f"blocks.{layer}.attn.{n}" for layer in range(model.cfg.n_layers)
                                            for n in ("W_Q", "W_K", "W_V", "W_O")]
    return {name: w.get(name).double() for name in names}


def _dense_spectral(t: dict[str, torch.Tensor], cfg) -> dict[str, np.ndarray]:
    """``Σ Re λ / Σ |λ|`` of every head's dense full OV and token QK circuits (vocab × vocab)."""
    w_e, w_u = t["embed.W_E"], t["unembed.W_U"]
    out = {name: np.empty((cfg.n_layers, cfg.n_heads)) for name in ("copying_score", "qk_positivity")}
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}.attn"
        for head in range(cfg.n_heads):
            q, k, v, o = (t[f"{pre}.{n}"][head] for n in ("W_Q", "W_K", "W_V", "W_O"))
            for name, m in (("copying_score", w_e @ v @ o @ w_u), ("qk_positivity", w_e @ q @ k.T @ w_e.T)):
                ev = torch.linalg.eigvals(m) if torch.isfinite(m).all() else torch.full((1,), torch.nan)
                out[name][layer, head] = float(ev.real.sum() / ev.abs().sum())
    return out


def _dense_composition(t: dict[str, torch.Tensor], cfg, kind: str) -> np.ndarray:
    """``‖OV₁ W₂‖ / (‖OV₁‖ ‖W₂‖)`` of every pair from the dense ``d_model × d_model`` circuits."""
    out = np.zeros((cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads))
    for l1 in range(cfg.n_layers):
        for h1 in range(cfg.n_heads):
            ov1 = t[f"blocks.{l1}.attn.W_V"][h1] @ t[f"blocks.{l1}.attn.W_O"][h1]
            for l2 in range(l1 + 1, cfg.n_layers):
                for h2 in range(cfg.n_heads):
                    q, k, v, o = (t[f"blocks.{l2}.attn.{n}"][h2] for n in ("W_Q", "W_K", "W_V", "W_O"))
                    right = {"q": q @ k.T, "k": k @ q.T, "v": v @ o}[kind]
                    out[l1, h1, l2, h2] = float(torch.linalg.norm(ov1 @ right)
                                                / (torch.linalg.norm(ov1) * torch.linalg.norm(right)))
    return out


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_weight_scores_equal_their_dense_definitions_on_every_family(name, dtype, tmp_path):
    """The one weight algebra on ``model.weights`` equals the dense definitions (eigenvalues
    of the vocab × vocab circuits, norms of the dense products, in torch, float64), processed
    and raw. The processed weights themselves are held to TransformerLens' and transformers'
    in tests/engine/model/test_processing.py and the parity tests."""
    path = _build(name, dtype, tmp_path)
    for raw in (False, True):
        model = load_model(path, raw=raw)
        arrays = model.weights
        t = _torch_weights(model)
        found = spectral.spectral_scores(arrays)
        want = _dense_spectral(t, model.cfg)
        for score in ("copying_score", "qk_positivity"):
            np.testing.assert_allclose(found[score], want[score], atol=1e-5, rtol=1e-4, err_msg=score)
        assert not found["nonfinite"].any() and not found["overflow"].any()
        for kind in ("q", "k", "v"):
            got = composition.composition_scores(arrays, kind, seed=3)
            np.testing.assert_allclose(got.scores, _dense_composition(t, model.cfg, kind), atol=1e-5, rtol=1e-4)
            assert got.baseline == composition.composition_baseline(model.cfg.d_model, model.cfg.d_head, 3)


def test_weight_scores_equal_the_score_table(tmp_path):
    model = load_model(_build("llama", "bfloat16", tmp_path))
    table = score_sweeps.score_table(model)
    found = score_sweeps.weight_scores(model)
    np.testing.assert_array_equal(found["copying_score"], table.copying_score)  # one code path
    np.testing.assert_array_equal(found["qk_positivity"], table.qk_positivity)
    np.testing.assert_array_equal(found["nonfinite"], table.nonfinite)


def test_nonfinite_and_overflowing_heads_are_flagged_and_the_others_scored(tmp_path):
    from safetensors.torch import load_file, save_file

    path = _build("gpt2", None, tmp_path)
    file = path / "model.safetensors"
    tensors = load_file(file)
    d_head = 32 // 4
    c_attn = tensors["transformer.h.0.attn.c_attn.weight"].clone()  # [d_model, 3 d_model]: Q | K | V
    c_attn[3, 1 * d_head + 2] = float("nan")  # layer 0, head 1: a NaN in W_Q
    tensors["transformer.h.0.attn.c_attn.weight"] = c_attn
    c_attn = tensors["transformer.h.1.attn.c_attn.weight"].clone()
    c_attn[:, 2 * 32 + 3 * d_head: 2 * 32 + 4 * d_head] *= 1e20  # layer 1, head 3: W_V and W_O
    tensors["transformer.h.1.attn.c_attn.weight"] = c_attn  # near 1e20: their product overflows
    c_proj = tensors["transformer.h.1.attn.c_proj.weight"].clone()  # [heads · d_head, d_model]
    c_proj[3 * d_head: 4 * d_head] *= 1e20
    tensors["transformer.h.1.attn.c_proj.weight"] = c_proj
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    model = load_model(path)
    got = spectral.spectral_scores(model.weights)
    assert got["nonfinite"].nonzero() == (np.array([0]), np.array([1]))
    assert got["overflow"][1, 3] and got["overflow"].sum() == 1
    assert np.isnan(got["copying_score"][0, 1]) and np.isnan(got["qk_positivity"][0, 1])
    # the overflowing head is scored (the scores are scale-free): as its weights / 2**67 score
    t = _torch_weights(model)
    for name in ("blocks.1.attn.W_V", "blocks.1.attn.W_O"):
        t[name] = t[name].clone()
        t[name][3] /= 2.0**67
    want = _dense_spectral(t, model.cfg)
    ok = ~got["nonfinite"]
    np.testing.assert_allclose(got["copying_score"][ok], want["copying_score"][ok], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(got["qk_positivity"][ok], want["qk_positivity"][ok], atol=1e-5, rtol=1e-4)
    comp = composition.composition_scores(model.weights, "v").scores
    t["blocks.0.attn.W_Q"] = torch.nan_to_num(t["blocks.0.attn.W_Q"])
    dense = _dense_composition(t, model.cfg, "v")
    assert np.isnan(comp[0, 1, 1]).all() and not np.isnan(comp[0, 0, 1]).any()
    finite = ~np.isnan(comp)
    np.testing.assert_allclose(comp[finite], dense[finite], atol=1e-5, rtol=1e-4)


def _cli_in_fresh_process(*argv: str) -> tuple[list[str], object]:
    code = (
        "import contextlib, io, json, sys\n"
        "from headscope.tui.cli.main import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    assert main({list(argv)!r}) == 0\n"
        "print(json.dumps([sorted(m for m in sys.modules if m.split('.')[0] == 'torch'), out.getvalue()]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True)
    torch_modules, stdout = json.loads(done.stdout.strip().splitlines()[-1])
    return torch_modules, json.loads(stdout)


def test_a_warm_heads_run_imports_no_torch_and_heads_equals_its_weight_only_run(tmp_path):
    """Every score in the results store: `heads` reads them back without torch. Its weight
    scores come from the numpy sweep `heads --no-behaviour` runs: the same numbers, bit for
    bit, also when both compute them afresh."""
    path = str(_build("llama", "bfloat16", tmp_path))
    cold_modules, cold = _cli_in_fresh_process("heads", path, "--json")
    assert "torch" in cold_modules  # the behavioural forward pass
    warm_modules, warm = _cli_in_fresh_process("heads", path, "--json")
    assert warm_modules == [] and warm == cold
    _, weights = _cli_in_fresh_process("heads", path, "--no-behaviour", "--json", "--no-cache")
    _, fresh = _cli_in_fresh_process("heads", path, "--json", "--no-cache")
    by_head = {(r["layer"], r["head"]): r for r in weights}
    for table in (cold, fresh):
        for row in table:
            for key in ("copying_score", "qk_positivity", "nonfinite"):
                assert row[key] == by_head[(row["layer"], row["head"])][key], key


@pytest.mark.parametrize("argv", [
    ("info", "{path}", "--json"),
    ("heads", "{path}", "--no-behaviour", "--json"),
    ("composition", "{path}", "--kind", "k", "--json"),
    ("circuit", "{path}", "1", "2", "--kind", "qk", "--offset", "2", "--json"),
    ("circuit", "{path}", "0", "3", "--kind", "ov", "--rows", "5,1,2:4", "--json"),
    ("diff", "{path}", "{path}", "--no-behaviour", "--json"),
])
def test_weight_only_commands_do_not_import_torch(argv, tmp_path):
    path = _build("llama", "bfloat16", tmp_path)
    modules, out = _cli_in_fresh_process(*(a.format(path=path) for a in argv))
    assert modules == []
    if argv[0] == "circuit":
        want = _dense_block(load_model(path), int(argv[2]), int(argv[3]), argv[5], "token",
                            out["rows"], out["cols"], out["offset"] or 0)
        np.testing.assert_allclose(np.array(out["values"]), want, atol=1e-5, rtol=1e-4)
    if argv[0] == "diff":
        assert all(abs(r["ov_similarity"] - 1) < 1e-5 and r["copying_score_delta"] == 0 for r in out["heads"])
        assert "induction_score_delta" not in out["heads"][0]
    if argv[0] == "heads":
        want = score_sweeps.weight_scores(load_model(path))
        assert [r["copying_score"] for r in out] == pytest.approx(want["copying_score"].ravel().tolist())
        assert set(out[0]) == {"layer", "head", "copying_score", "qk_positivity", "nonfinite"}
    if argv[0] == "composition":
        model = load_model(path)
        want = _dense_composition(_torch_weights(model), model.cfg, "k")
        np.testing.assert_allclose(np.array(out["scores"]), want, atol=1e-5)


def test_composition_streams_each_layer_pair_before_the_result(tmp_path):
    model = load_model(_build("llama", "bfloat16", tmp_path))
    seen: list[tuple[int, int, np.ndarray]] = []
    comp = score_sweeps.composition(model, "q", on_tile=lambda s, t, v: seen.append((s, t, v.copy())))
    assert sorted((s, t) for s, t, _ in seen) == sorted(composition.composition_pairs(model.cfg.n_layers))
    for source, target, values in seen:
        np.testing.assert_array_equal(values, comp.scores[source, :, target, :])


def test_no_behaviour_refuses_behavioural_sort_keys_and_ablation(capsys):
    from headscope.tui.cli.main import main

    path = str(ROOT / "sample_models" / "attn-only-2l")
    assert main(["heads", path, "--no-behaviour", "--sort", "induction_score"]) != 0
    assert "unknown sort key 'induction_score'" in capsys.readouterr().err
    assert main(["heads", path, "--no-behaviour", "--ablation"]) != 0
    assert "--no-behaviour" in capsys.readouterr().err
    assert main(["heads", path, "--no-behaviour", "--sort", "copying_score", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["copying_score"] for r in rows] == sorted((r["copying_score"] for r in rows), reverse=True)


def _dense_block(model, layer: int, head: int, kind: str, basis: str, rows, cols, offset: int) -> np.ndarray:
    """The block from the processed weights in torch (``torch_weights``), RoPE by the forward
    pass's torch rotation (``forward.transformer.torch_apply_rotary``, parity-tested against
    transformers), not the numpy ``model.rotary`` the circuits use."""
    from headscope.engine.forward.transformer import (
        rotary_scale,
        torch_apply_rotary,
        torch_rotary_inv_freq,
    )
    from headscope.engine.model.rotary import layer_config

    w = torch_weights(model.weights)
    get = lambda name: w.get(f"blocks.{layer}.attn.{name}")[head].double()  # noqa: E731
    rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
    if basis == "position":
        w_pos = w.get("pos_embed.W_pos").double()
        return ((w_pos[rows] @ get("W_Q")) @ (w_pos[cols] @ get("W_K")).T).numpy()
    w_e = w.get("embed.W_E").double()
    if kind == "ov":
        return ((w_e[rows] @ get("W_V")) @ (get("W_O") @ w.get("unembed.W_U").double()[:, cols])).numpy()
    w_q = get("W_Q")
    if model.cfg.positional == "rotary":
        lc = layer_config(model.cfg, layer)
        d = lc.d_head
        inv = torch_rotary_inv_freq(lc, seq_len=offset + 1).double()
        rot = torch_apply_rotary(torch.eye(d, dtype=torch.float64), torch.full((d, 1), float(offset),
                           dtype=torch.float64) * inv, rotary_scale(lc))
        w_q = w_q @ rot
    return ((w_e[rows] @ w_q) @ (w_e[cols] @ get("W_K")).T).numpy()


@pytest.mark.parametrize(("name", "dtype"), [("gpt2", None), ("llama3_rope", None), ("gemma3", "bfloat16"),
                                             ("phi3", None)])
def test_circuit_blocks_equal_dense_products_and_the_forward_rotation(name, dtype, tmp_path):
    from headscope.engine.circuits import head_circuits

    model = load_model(_build(name, dtype, tmp_path))
    arrays, cfg = model.weights, model.cfg
    rows, cols = [5, 0, 3, 3, 9], [cfg.d_vocab - 1, 2, 3, 4]
    cases = [("ov", "token", 0), ("qk", "token", 0), ("qk", "token", -3), ("qk", "token", 17)]
    if cfg.positional == "learned":
        cases.append(("qk", "position", 0))
    for layer, head in ((0, 0), (cfg.n_layers - 1, cfg.n_heads - 1)):
        for kind, basis, offset in cases:
            c = cols if basis == "token" else [cfg.n_ctx - 1, 2]
            got = head_circuits.circuit_block(arrays, layer, head, kind, basis, rows, c, offset)
            want = _dense_block(model, layer, head, kind, basis, rows, c, offset)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def _dense_similarity(ta: dict[str, torch.Tensor], tb: dict[str, torch.Tensor], cfg, kind: str) -> np.ndarray:
    """``⟨C_A, C_B⟩_F / (‖C_A‖ ‖C_B‖)`` of the dense vocab × vocab circuits, every head pair."""
    out = np.empty((cfg.n_layers, cfg.n_heads, cfg.n_heads))

    def circuit(t: dict[str, torch.Tensor], layer: int, head: int) -> torch.Tensor:
        q, k, v, o = (t[f"blocks.{layer}.attn.{n}"][head] for n in ("W_Q", "W_K", "W_V", "W_O"))
        w_e = t["embed.W_E"]
        return w_e @ v @ o @ t["unembed.W_U"] if kind == "ov" else w_e @ q @ k.T @ w_e.T

    for layer in range(cfg.n_layers):
        for ha in range(cfg.n_heads):
            ca = circuit(ta, layer, ha)
            for hb in range(cfg.n_heads):
                cb = circuit(tb, layer, hb)
                out[layer, ha, hb] = float((ca * cb).sum() / (ca.norm() * cb.norm()))
    return out


def _dense_cosines(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean cosine of the principal angles between the column spaces (torch QR and SVD)."""
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return float("nan")
    qx, qy = torch.linalg.qr(x)[0], torch.linalg.qr(y)[0]
    return float(torch.linalg.svdvals(qx.T @ qy).clamp(max=1.0).mean())


def test_diff_equals_the_dense_definitions(tmp_path):
    """The diff's similarities and subspace cosines against their dense definitions, between a
    model and an edited copy with a NaN head; the weight-only diff gives the same numbers."""
    from safetensors.torch import load_file, save_file

    from headscope.engine.circuits.similarity import circuit_similarity
    from headscope.engine.sweeps.diff import diff_models

    a_path = _build("gpt2", None, tmp_path / "a")
    b_path = _build("gpt2", None, tmp_path / "b")
    file = b_path / "model.safetensors"
    tensors = load_file(file)
    g = torch.Generator().manual_seed(1)
    for name in ("transformer.h.1.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight"):
        tensors[name] = tensors[name] + 0.3 * torch.randn(tensors[name].shape, generator=g)
    tensors["transformer.h.0.attn.c_attn.weight"][3, 2 * 32 + 1] = float("nan")  # L0.H0's W_V
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    a, b = load_model(a_path), load_model(b_path)
    ov, qk = circuit_similarity(a.weights, b.weights)
    ta, tb = _torch_weights(a), _torch_weights(b)
    for got, kind in ((ov, "ov"), (qk, "qk")):
        want = _dense_similarity(ta, tb, a.cfg, kind)
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.isnan(ov[0, :, 0]).all() and np.isnan(ov[0]).sum() == a.cfg.n_heads  # B's L0.H0

    got = diff_models(a, b, match_heads=True).to_dict()
    weight_only = diff_models(a, b, match_heads=True, behaviour=False).to_dict()
    for mine, weights in zip(got["heads"], weight_only["heads"], strict=True):
        layer, head, hb = mine["layer"], mine["head"], mine["matched_head"]
        assert mine["ov_similarity"] == pytest.approx(float(ov[layer, head, hb]), abs=0, nan_ok=True)
        pre = f"blocks.{layer}.attn"
        read = _dense_cosines(ta[f"{pre}.W_V"][head], tb[f"{pre}.W_V"][hb])
        write = _dense_cosines(ta[f"{pre}.W_O"][head].T, tb[f"{pre}.W_O"][hb].T)
        assert mine["read_subspace_cos"] == pytest.approx(read, abs=1e-5, nan_ok=True)
        assert mine["write_subspace_cos"] == pytest.approx(write, abs=1e-5, nan_ok=True)
        assert set(weights) < set(mine)
        for key in weights:
            if key not in ("nonfinite", "change"):  # these see behaviour too
                assert weights[key] == pytest.approx(mine[key], abs=0, nan_ok=True), key
