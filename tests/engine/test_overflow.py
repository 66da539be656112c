"""Finite weights whose float32 products overflow (a head near 1e19) and NaN heads: every
eigen- and singular-value path gets finite input or reports NaN, never crashes the process.

``torch.linalg.eigvals`` on a NaN matrix can kill the process (segfault) in CPU builds, so the
end-to-end checks run in a subprocess: a crash fails the test instead of taking pytest down.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.circuits import composition, spectral
from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.core.numeric import tame
from headscope.engine.model.loading import load_model
from tests.hf_fixtures import D_MODEL, N_HEADS, build_gpt2

REPO = Path(__file__).resolve().parents[2]
LAYER, HEAD = 1, 2
SCALE = 1e19


def scale_head(path: Path, layer: int, head: int, factor: float) -> None:
    """Multiply one GPT-2 head's W_Q, W_K, W_V (c_attn columns) and W_O (c_proj rows)."""
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    t = load_file(str(file))
    prefix = "transformer." if "transformer.wte.weight" in t else ""
    dh = D_MODEL // N_HEADS
    qkv = t[f"{prefix}h.{layer}.attn.c_attn.weight"]
    for i in range(3):
        qkv[:, i * D_MODEL + head * dh : i * D_MODEL + (head + 1) * dh] *= factor
    t[f"{prefix}h.{layer}.attn.c_proj.weight"][head * dh : (head + 1) * dh] *= factor
    save_file(t, str(file), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def huge_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the gpt2 fixture with head (1, 2) scaled by 1e19, the same fixture unscaled)."""
    ref, _ = build_gpt2(tmp_path_factory.mktemp("reference"))
    huge, _ = build_gpt2(tmp_path_factory.mktemp("huge"))
    scale_head(huge, LAYER, HEAD, SCALE)
    return huge, ref


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def assert_clean_exit(proc: subprocess.CompletedProcess[str]) -> None:
    # A segfault is returncode -11: the test fails, pytest lives on.
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"


API_SCRIPT = r"""
import json, math, sys
from headscope.engine.circuits import composition, head_circuits as circuits, spectral
from headscope.engine.forward import behaviour

from headscope.engine.model.loading import load_model

model = load_model(sys.argv[1])
w = model.weights
L, H = int(sys.argv[2]), int(sys.argv[3])
clean = lambda t: [None if math.isnan(v) else v for v in t.flatten().tolist()]
sweep = spectral.spectral_scores(w)
out = {
    "nonfinite": spectral.nonfinite_heads(w),
    "copying": clean(sweep["copying_score"]),
    "positivity": clean(sweep["qk_positivity"]),
    "copying_one": spectral.copying_score(circuits.full_ov(w, L, H)),
    "positivity_one": spectral.qk_positivity(circuits.token_qk(w, L, H)),
    "composition": {k: clean(composition.composition_scores(w, k).scores) for k in "qkv"},
    "induction": clean(behaviour.behaviour_scores(model.weights, seq_len=8)["induction"]),
    "ov_singular": circuits.ov(w, L, H).svd()[1].tolist(),
    "qk_singular": circuits.qk(w, L, H).S.tolist(),
    "ov_eigenvalues": [abs(z) for z in circuits.full_ov(w, L, H).eigenvalues_double().tolist()],
}
print(json.dumps(out))
"""


def _close(got: list[Any], want: list[Any], tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, v in zip(got, want, strict=True):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            assert g is None
        else:
            assert g is not None and abs(g - v) <= tol, (g, v)


def test_huge_head_through_the_api_in_a_subprocess(huge_and_reference: tuple[Path, Path]) -> None:
    huge, ref = huge_and_reference
    proc = run_python(API_SCRIPT, str(huge), str(LAYER), str(HEAD))
    assert_clean_exit(proc)
    got = json.loads(proc.stdout)
    assert got["nonfinite"] == [[LAYER, HEAD]]  # flagged: its forward pass overflows
    # The weight-based scores are scale-free: the 1e19 head scores as the unscaled one.
    w = load_model(ref).weights
    sweep = spectral.spectral_scores(w)
    _close(got["copying"], sweep["copying_score"].flatten().tolist())
    _close(got["positivity"], sweep["qk_positivity"].flatten().tolist())
    assert got["copying_one"] == pytest.approx(
        spectral.copying_score(circuits.full_ov(w, LAYER, HEAD)), abs=1e-4)
    assert got["positivity_one"] == pytest.approx(
        spectral.qk_positivity(circuits.token_qk(w, LAYER, HEAD)), abs=1e-4)
    for kind in "qkv":
        _close(got["composition"][kind], composition.composition_scores(w, kind).scores.flatten().tolist())
    # Its behaviour cannot be computed in float32: NaN (null), flagged above; layer 0 is upstream.
    induction = torch.tensor([math.nan if v is None else v for v in got["induction"]]).view(2, -1)
    assert math.isnan(induction[LAYER, HEAD]) and torch.isfinite(induction[0]).all()
    # Spectra: no crash, no NaN; singular values of a 1e38-scale circuit may be inf in float32.
    for key in ("ov_singular", "qk_singular", "ov_eigenvalues"):
        assert got[key] and not any(math.isnan(v) for v in got[key])
    assert all(math.isfinite(v) for v in got["ov_eigenvalues"])


def test_huge_head_through_the_cli_in_a_subprocess(huge_and_reference: tuple[Path, Path]) -> None:
    huge, ref = huge_and_reference
    proc = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "heads", str(huge), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert_clean_exit(proc)
    rows = {(r["layer"], r["head"]): r for r in json.loads(proc.stdout)}
    row = rows[(LAYER, HEAD)]
    assert row["nonfinite"] is True
    assert sum(r["nonfinite"] for r in rows.values()) == 1
    sweep = spectral.spectral_scores(load_model(ref).weights)
    assert row["copying_score"] == pytest.approx(float(sweep["copying_score"][LAYER, HEAD]), abs=1e-4)
    assert row["qk_positivity"] == pytest.approx(float(sweep["qk_positivity"][LAYER, HEAD]), abs=1e-4)
    assert row["prev_token_score"] is None  # NaN in JSON: the forward pass overflows


def test_realistic_weights_are_not_flagged_or_rescaled(huge_and_reference: tuple[Path, Path]) -> None:
    _, ref = huge_and_reference
    w = load_model(ref).weights
    assert spectral.nonfinite_heads(w) == []
    x = w.get("blocks.0.attn.W_V")
    assert tame(x) is x  # untouched: bit-identical scores for every ordinary model


# -- diff: a NaN head, a huge head, a different d_model/d_head, through the CLI ----------------


def write_model(path: Path, w: Any) -> Path:
    from tests.hf_fixtures import write_native

    fields = {k: v for k, v in w.cfg.to_dict().items() if k not in ("attn_only", "extra")}
    return write_native(path, fields, dict(w._t))


def run_diff(a: Path, b: Path, *flags: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "diff", str(a), str(b), "--json", *flags],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert_clean_exit(proc)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def diff_models_on_disk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.engine.sweeps.test_diff import edited, random_weights

    root = tmp_path_factory.mktemp("diff")
    base = random_weights(0)
    nan_v = edited(base, "W_V", 1, 2, lambda x: x.index_fill_(0, torch.tensor([0]), math.nan))
    huge = edited(edited(base, "W_V", 1, 2, lambda x: x * 1e19), "W_O", 1, 2, lambda x: x * 1e19)
    return {
        "base": write_model(root / "base", base),
        "nan": write_model(root / "nan", nan_v),
        "huge": write_model(root / "huge", huge),
        "distilled": write_model(root / "distilled", random_weights(1, d_model=24, d_head=8)),
    }
