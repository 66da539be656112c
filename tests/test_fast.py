"""The torch-free weight-only path (engine/fast.py) against the torch path, on every family's
fixture (processed and raw, fp32/fp16/bf16, GQA), with non-finite and overflowing heads, and
the weight-only commands checked not to import torch at all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from headscope.engine.circuits import fast, scores
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.model.loading import open_model
from headscope.engine.sweeps import compute
from tests import family_fixtures, hf_fixtures, hf_fixtures_phi

BUILDERS = {**hf_fixtures.FAMILIES, **family_fixtures.NEW_FAMILIES, **hf_fixtures_phi.PHI_FAMILIES}
CASES = [(name, None) for name in BUILDERS] + [("llama", "bfloat16"), ("neox", "float16"), ("gpt2", "bfloat16")]
ROOT = Path(__file__).resolve().parent.parent


def _build(name: str, dtype: str | None, tmp_path: Path) -> Path:
    kwargs = {"dtype": dtype} if dtype else {}
    return BUILDERS[name](tmp_path, **kwargs)[0]


def _spectral_equal(got: dict[str, np.ndarray], want: dict[str, torch.Tensor]) -> None:
    for name in ("copying_score", "qk_positivity"):
        np.testing.assert_allclose(got[name], want[name].numpy(), atol=1e-5, rtol=1e-4)
    for name in ("nonfinite", "overflow"):
        np.testing.assert_array_equal(got[name], want[name].numpy())


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_numpy_path_equals_the_torch_path(name, dtype, tmp_path):
    path = _build(name, dtype, tmp_path)
    for raw in (False, True):
        model = open_model(path, raw=raw)
        arrays = fast.numpy_weights(model)
        assert arrays is not None
        _spectral_equal(fast.spectral_scores(arrays), scores.spectral_scores(torch_weights(model.weights)))
        for kind in ("q", "k", "v"):
            got, baseline = fast.composition_scores(arrays, kind, seed=3)
            want = scores.composition_scores(torch_weights(model.weights), kind, seed=3)
            np.testing.assert_allclose(got, want.scores.numpy(), atol=1e-5, rtol=1e-4)
            assert baseline == want.baseline


def test_weight_scores_equal_the_score_table(tmp_path):
    model = open_model(_build("llama", "bfloat16", tmp_path))
    table = compute.score_table(model)
    found = compute.weight_scores(model)
    np.testing.assert_allclose(found["copying_score"], table.copying_score, atol=1e-5)
    np.testing.assert_allclose(found["qk_positivity"], table.qk_positivity, atol=1e-5)
    np.testing.assert_array_equal(found["nonfinite"], table.nonfinite)


def test_nonfinite_and_overflowing_heads_match_the_torch_path(tmp_path):
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
    model = open_model(path)
    got = fast.spectral_scores(fast.numpy_weights(model))
    want = scores.spectral_scores(torch_weights(model.weights))
    assert got["nonfinite"].nonzero() == (np.array([0]), np.array([1]))
    assert got["overflow"][1, 3]
    _spectral_equal(got, want)
    comp, _ = fast.composition_scores(fast.numpy_weights(model), "v")
    np.testing.assert_allclose(comp, scores.composition_scores(torch_weights(model.weights), "v").scores.numpy(),
                               atol=1e-5, rtol=1e-4)
    assert np.isnan(comp[0, 1, 1]).all() and not np.isnan(comp[0, 0, 1]).any()


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
        from headscope.engine.circuits import head_circuits as circuits

        m = open_model(path)
        want = circuits.circuit_block(torch_weights(m.weights), int(argv[2]), int(argv[3]), argv[5], "token",
                                      out["rows"], out["cols"], out["offset"] or 0)
        np.testing.assert_allclose(np.array(out["values"]), want.numpy(), atol=1e-5, rtol=1e-4)
    if argv[0] == "diff":
        assert all(abs(r["ov_similarity"] - 1) < 1e-5 and r["copying_score_delta"] == 0 for r in out["heads"])
        assert "induction_score_delta" not in out["heads"][0]
    if argv[0] == "heads":
        want = compute.weight_scores(open_model(path))
        assert [r["copying_score"] for r in out] == pytest.approx(want["copying_score"].ravel().tolist())
        assert set(out[0]) == {"layer", "head", "copying_score", "qk_positivity", "nonfinite"}
    if argv[0] == "composition":
        want = scores.composition_scores(torch_weights(open_model(path).weights), "k")
        np.testing.assert_allclose(np.array(out["scores"]), want.scores.numpy(), atol=1e-5)


@pytest.mark.parametrize("torch_free", [True, False])
def test_composition_streams_each_layer_pair_before_the_result(torch_free, tmp_path, monkeypatch):
    if not torch_free:
        monkeypatch.setattr(fast, "numpy_weights", lambda model: None)
    model = open_model(_build("llama", "bfloat16", tmp_path))
    seen: list[tuple[int, int, np.ndarray]] = []
    comp = compute.composition(model, "q", on_tile=lambda s, t, v: seen.append((s, t, v.copy())))
    assert sorted((s, t) for s, t, _ in seen) == sorted(scores.composition_pairs(model.cfg.n_layers))
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


@pytest.mark.parametrize(("name", "dtype"), [("gpt2", None), ("llama3_rope", None), ("gemma3", "bfloat16")])
def test_circuit_blocks_equal_the_torch_path(name, dtype, tmp_path):
    from headscope.engine.circuits import head_circuits as circuits

    model = open_model(_build(name, dtype, tmp_path))
    arrays, cfg = fast.numpy_weights(model), model.cfg
    rows, cols = [5, 0, 3, 3, 9], [cfg.d_vocab - 1, 2, 3, 4]
    cases = [("ov", "token", 0), ("qk", "token", 0), ("qk", "token", -3), ("qk", "token", 17)]
    if cfg.positional == "learned":
        cases.append(("qk", "position", 0))
    for layer, head in ((0, 0), (cfg.n_layers - 1, cfg.n_heads - 1)):
        for kind, basis, offset in cases:
            c = cols if basis == "token" else [cfg.n_ctx - 1, 2]
            got = fast.circuit_block(arrays, layer, head, kind, basis, rows, c, offset)
            want = circuits.circuit_block(torch_weights(model.weights), layer, head, kind, basis, rows, c, offset)
            np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-4)
    if cfg.positional == "rotary":
        lc = model.weights.cfg
        np.testing.assert_allclose(fast.rotary_matrix(lc, 5), circuits.rotary_matrix(lc, 5).numpy(), atol=1e-6)


def test_diff_equals_the_torch_path(tmp_path):
    """The numpy diff (similarities, subspace cosines, weight scores, composition) against
    the torch path, between a model and an edited copy with a NaN head."""
    from safetensors.torch import load_file, save_file

    from headscope.engine.sweeps.diff import circuit_similarity, diff_models, similarity_arrays

    a_path = _build("gpt2", None, tmp_path / "a")
    b_path = _build("gpt2", None, tmp_path / "b")
    file = b_path / "model.safetensors"
    tensors = load_file(file)
    g = torch.Generator().manual_seed(1)
    for name in ("transformer.h.1.attn.c_attn.weight", "transformer.h.0.attn.c_proj.weight"):
        tensors[name] = tensors[name] + 0.3 * torch.randn(tensors[name].shape, generator=g)
    tensors["transformer.h.0.attn.c_attn.weight"][3, 2 * 32 + 1] = float("nan")  # L0.H0's W_V
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    a, b = open_model(a_path), open_model(b_path)
    ov, qk = similarity_arrays(fast.numpy_weights(a), fast.numpy_weights(b))
    want = circuit_similarity(torch_weights(a.weights), torch_weights(b.weights))
    np.testing.assert_allclose(ov, want.ov.numpy(), atol=1e-5)
    np.testing.assert_allclose(qk, want.qk.numpy(), atol=1e-5)
    assert np.isnan(ov[0, :, 0]).all() and np.isnan(ov[0]).sum() == a.cfg.n_heads  # B's L0.H0

    got = diff_models(a, b, match_heads=True).to_dict()
    weight_only = diff_models(a, b, match_heads=True, behaviour=False).to_dict()
    real = fast.numpy_weights
    fast.numpy_weights = lambda model: None  # type: ignore[assignment]
    try:
        expected = diff_models(a, b, match_heads=True).to_dict()
    finally:
        fast.numpy_weights = real  # type: ignore[assignment]
    assert got["matching"] == expected["matching"]
    for mine, theirs, weights in zip(got["heads"], expected["heads"], weight_only["heads"], strict=True):
        assert set(mine) == set(theirs) and set(weights) < set(mine)
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, abs=1e-4, nan_ok=True), key
            if key in weights and key not in ("nonfinite", "change"):  # these see behaviour too
                assert weights[key] == pytest.approx(mine[key], abs=1e-6, nan_ok=True), key
    for kind, edges in expected["composition"].items():
        for status in ("gained", "lost"):
            assert [(e["source"], e["target"]) for e in got["composition"][kind][status]] == \
                [(e["source"], e["target"]) for e in edges[status]]
