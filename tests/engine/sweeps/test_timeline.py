"""Training dynamics (`engine/timeline.py`, `headscope timeline`): step discovery, phase
changes on synthetic curves, fingerprints, the JSON, and the bundled checkpoint series."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from headscope.engine.api.report import head_table
from headscope.engine.core.errors import (
    InvalidRequestError,
    UnsupportedFormatError,
)
from headscope.engine.core.validation import SCORE_NAMES as HEAD_SCORE_KEYS
from headscope.engine.model.loading import load_model
from headscope.engine.sweeps import timeline as tl
from headscope.sample_models import corpus
from headscope.sample_models.export import write_native
from headscope.sample_models.model import ModelShape, TinyTransformer
from headscope.tui.cli.main import main
from tests import weight_algebra as algebra
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, SAMPLE_MODELS

SERIES = SAMPLE_MODELS / "attn-only-2l-training"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- discovery


def _fake_checkpoints(root: Path, names: list[str]) -> None:
    """Directories that look like checkpoints (discovery reads no weights)."""
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "model.safetensors").write_bytes(b"")


@pytest.mark.parametrize(
    ("names", "steps"),
    [
        (["step-002000", "step-000500", "step-001000"], [500, 1000, 2000]),
        (["step10000", "step500", "step1000"], [500, 1000, 10000]),  # numbers, not text order
        (["checkpoint-1500", "checkpoint-500", "checkpoint-1000"], [500, 1000, 1500]),
        (["global_step900", "global_step90", "global_step9"], [9, 90, 900]),
        (["run2-step300", "run2-step100", "run2-step200"], [100, 200, 300]),  # the last number
    ],
)
def test_a_directory_of_checkpoints_is_ordered_by_the_number_in_each_name(
    tmp_path: Path, names: list[str], steps: list[int]
) -> None:
    _fake_checkpoints(tmp_path, names)
    (tmp_path / "logs").mkdir()  # no weights: not a step
    (tmp_path / ".cache" / "x").mkdir(parents=True)
    (tmp_path / ".cache" / "model.safetensors").write_bytes(b"")  # hidden: not a step
    (tmp_path / "README.md").write_text("a file, not a step")
    sources, notes = tl.discover_steps([tmp_path])
    assert [s.step for s in sources] == steps
    assert [s.path for s in sources] == [tmp_path / n for n in sorted(names, key=tl.step_number)]
    assert notes == []


def test_names_without_numbers_are_positions_in_name_order(tmp_path: Path) -> None:
    _fake_checkpoints(tmp_path, ["c-final", "a-early", "b-middle"])
    sources, notes = tl.discover_steps([tmp_path])
    assert [s.path.name for s in sources] == ["a-early", "b-middle", "c-final"]
    assert [s.step for s in sources] == [0, 1, 2]
    assert notes and "positions" in notes[0]


def test_unnumbered_names_follow_the_numbered_ones(tmp_path: Path) -> None:
    _fake_checkpoints(tmp_path, ["final", "step200", "step100", "best"])
    sources, notes = tl.discover_steps([tmp_path])
    assert [s.path.name for s in sources] == ["step100", "step200", "best", "final"]
    assert [s.step for s in sources] == [0, 1, 2, 3] and notes


def test_several_paths_keep_the_order_given(tmp_path: Path) -> None:
    _fake_checkpoints(tmp_path, ["step100", "step300", "base", "tuned"])
    sources, notes = tl.discover_steps([tmp_path / "step100", tmp_path / "step300"])
    assert [(s.step, s.path.name) for s in sources] == [(100, "step100"), (300, "step300")]
    assert notes == []
    # A weights file names its step through its directory.
    sources, _ = tl.discover_steps([tmp_path / "step100" / "model.safetensors",
                                    tmp_path / "step300" / "model.safetensors"])
    assert [s.step for s in sources] == [100, 300]
    # Given out of numeric order, or unnumbered: kept as given, steps are positions.
    sources, notes = tl.discover_steps([tmp_path / "step300", tmp_path / "step100"])
    assert [(s.step, s.path.name) for s in sources] == [(0, "step300"), (1, "step100")] and notes
    sources, notes = tl.discover_steps([tmp_path / "tuned", tmp_path / "base"])
    assert [(s.step, s.path.name) for s in sources] == [(0, "tuned"), (1, "base")] and notes


def test_discovery_errors_are_one_line_and_typed(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedFormatError, match="no such file"):
        tl.discover_steps([tmp_path / "missing"])
    _fake_checkpoints(tmp_path / "one", ["step-000100"])
    with pytest.raises(InvalidRequestError, match="a single step"):
        tl.discover_steps([tmp_path / "one"])
    _fake_checkpoints(tmp_path, ["lone"])
    with pytest.raises(InvalidRequestError, match="a single checkpoint, not a series"):
        tl.discover_steps([tmp_path / "lone"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsupportedFormatError, match="no checkpoint subdirectories"):
        tl.discover_steps([tmp_path / "empty"])
    with pytest.raises(InvalidRequestError, match="a single step"):
        tl.discover_steps([tmp_path / "lone" / "model.safetensors"])


# ----------------------------------------------------------------------------- phase changes

STEPS = list(range(0, 2100, 100))  # 21 steps, window 200


def test_a_step_function_is_found_at_its_step_with_its_levels() -> None:
    values = [0.1] * 8 + [0.9] * 13  # jumps at step 800
    pc = tl.find_phase_change(STEPS, values, 0.2)
    assert pc is not None
    assert (pc.step, pc.before, pc.after) == (800, 0.1, 0.9)
    assert pc.size == pytest.approx(0.8)
    assert (pc.start_step, pc.end_step) == (700, 800)  # the shortest window holding the jump


def test_a_fall_is_found_with_a_negative_size() -> None:
    values = [0.95] * 12 + [0.3] * 9
    pc = tl.find_phase_change(STEPS, values, 0.2)
    assert pc is not None and (pc.step, pc.before, pc.after) == (1200, 0.95, 0.3)
    assert pc.size < 0


def test_a_sigmoid_is_found_where_it_crosses_its_midpoint() -> None:
    t = np.array(STEPS, dtype=float)
    values = 0.05 + 0.85 / (1 + np.exp(-(t - 1030) / 60))  # half-way at 1030
    pc = tl.find_phase_change(STEPS, values.tolist(), 0.2)
    assert pc is not None
    assert pc.step == 1100  # the first checkpoint past the midpoint of the steepest window
    assert pc.before < 0.3 and pc.after > 0.6


def test_flat_noisy_and_drifting_curves_have_no_phase_change() -> None:
    rng = np.random.default_rng(0)
    assert tl.find_phase_change(STEPS, [0.4] * 21, 0.2) is None
    noisy = (0.5 + rng.uniform(-0.08, 0.08, 21)).tolist()
    assert tl.find_phase_change(STEPS, noisy, 0.2) is None
    spiky = [0.2] * 21
    spiky[7] = 0.9  # one bad checkpoint: the median of three removes it
    assert tl.find_phase_change(STEPS, spiky, 0.2) is None
    drift = np.linspace(0.0, 1.0, 21).tolist()  # 0.1 per window of 200 steps
    assert tl.find_phase_change(STEPS, drift, 0.2) is None
    # Below the threshold, even when sharp.
    assert tl.find_phase_change(STEPS, [0.1] * 8 + [0.25] * 13, 0.2) is None


def test_the_jump_from_the_first_step_does_not_count() -> None:
    # Every score moves most from the initialisation to the next checkpoint: the first
    # step is where a curve starts, not a level it held.
    values = [0.0] + [0.8] * 20
    assert tl.find_phase_change(STEPS, values, 0.2) is None
    values = [0.0] + [0.3] * 10 + [0.9] * 10  # the later jump is the phase change
    pc = tl.find_phase_change(STEPS, values, 0.2)
    assert pc is not None and (pc.step, pc.before, pc.after) == (1100, 0.3, 0.9)


def test_non_finite_values_are_skipped_and_window_follows_the_spacing() -> None:
    values = [0.1] * 8 + [float("nan")] + [0.9] * 12
    pc = tl.find_phase_change(STEPS, values, 0.2)
    assert pc is not None and (pc.step, pc.start_step) == (900, 700)
    assert tl.window_steps([0, 1000, 2000, 3000]) == 1000  # coarse: neighbours still pair
    assert tl.window_steps(STEPS) == 200
    assert tl.window_steps([0, 10, 20, 30, 40, 1000]) == 100


def test_the_model_phase_change_is_where_most_heads_are_changing() -> None:
    def change(layer: int, head: int, score: str, start: int, end: int, step: int) -> dict:
        return {"layer": layer, "head": head, "score": score, "start_step": start,
                "end_step": end, "step": step}

    changes = [change(0, 0, "copying_score", 100, 200, 200),
               change(0, 1, "prev_token_score", 500, 800, 700),
               change(1, 2, "induction_score", 600, 800, 700),
               change(1, 2, "copying_score", 600, 700, 700),
               change(1, 0, "induction_score", 700, 900, 800)]
    m = tl.model_phase_change(STEPS, changes)
    assert m is not None
    # At 700 two heads are changing (0.1, and 1.2 twice); at 800 three (1.0's window opens).
    assert m == {"step": 800, "n_heads": 3, "heads": [[0, 1], [1, 0], [1, 2]],
                 "scores": ["prev_token_score", "induction_score"]}
    assert tl.model_phase_change(STEPS, []) is None
    # Ties on heads: the step inside more changes, then the earlier step.
    tie = [change(0, 0, "copying_score", 100, 200, 200), change(0, 0, "qk_positivity", 100, 200, 200),
           change(1, 1, "induction_score", 500, 600, 600)]
    assert tl.model_phase_change(STEPS, tie)["step"] == 200
    assert tl.model_phase_change(STEPS, tie[1:])["step"] == 200
    assert tl.model_phase_change(STEPS, tie[2:])["step"] == 600


# ----------------------------------------------------------------------------- synthetic series

TINY = ModelShape(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=len(corpus.VOCAB),
                  n_ctx=16, layer_norm=True)


def _write_step(path: Path, seed: int, shape: ModelShape = TINY) -> None:
    model = TinyTransformer(shape)
    model.init_weights(torch.Generator().manual_seed(seed), 0.1)
    write_native(model, corpus.VOCAB, path)


@pytest.fixture
def tiny_series(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    for i, step in enumerate((0, 100, 200)):
        _write_step(root / f"checkpoint-{step}", seed=i)
    return root


def test_scores_per_step_are_the_heads_table(tiny_series: Path) -> None:
    t = tl.compute_timeline([tiny_series])
    assert t.steps == [0, 100, 200]
    for i, path in enumerate(t.paths):
        rows = head_table(load_model(path))
        for r in rows:
            for key in HEAD_SCORE_KEYS:
                assert t.series[key][i, r["layer"], r["head"]] == pytest.approx(r[key], abs=1e-7)
    # Composition maxima: layer-0 heads as sources, layer-1 heads as targets, above baseline.

    k = algebra.composition_scores(load_model(t.paths[1]).weights, "k")
    above = k.scores.numpy() - k.baseline
    assert t.series["k_composition_max"][1, 0, 1] == pytest.approx(above[0, 1, 1, :].max(), abs=1e-6)
    assert t.series["k_composition_max"][1, 1, 0] == pytest.approx(above[0, :, 1, 0].max(), abs=1e-6)
    assert t.warnings == []
    assert len(set(t.fingerprints)) == 3


def test_a_series_scored_again_is_read_from_the_results_store(tiny_series: Path, capsys) -> None:
    """The steps' sweeps go through the results store (conftest points it at a temp dir), as
    `heads` and `composition` do: the second run computes no spectral sweep and no
    composition tile, and prints the same JSON; `--no-cache` computes again."""
    from unittest import mock

    from headscope.engine.circuits import composition, spectral

    argv = ["timeline", str(tiny_series), "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    with mock.patch.object(spectral, "_batched_spectral_score", side_effect=AssertionError("recomputed")), \
            mock.patch.object(composition, "_pair_squares", side_effect=AssertionError("recomputed")):
        assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == first
    with mock.patch.object(spectral, "_batched_spectral_score", wraps=spectral._batched_spectral_score) as sweep:
        assert main([*argv, "--no-cache"]) == 0
    assert sweep.call_count == 2 * 2 * 3  # copying and QK positivity, 2 layers, 3 steps
    assert json.loads(capsys.readouterr().out) == first


def test_identical_checkpoints_are_warned(tiny_series: Path, capsys) -> None:
    shutil.copytree(tiny_series / "checkpoint-100", tiny_series / "checkpoint-300")
    t = tl.compute_timeline([tiny_series])
    assert t.fingerprints[1] == t.fingerprints[3] != t.fingerprints[2]
    assert tl.identical_steps([tl.StepScores(s, Path(p), 2, 2, f, {}) for s, p, f in
                               zip(t.steps, t.paths, t.fingerprints, strict=True)]) == [[100, 300]]
    assert len(t.warnings) == 1 and "steps 100" in t.warnings[0] and "300" in t.warnings[0]
    code, out, err = run_cli(capsys, "timeline", str(tiny_series), "--json")
    assert code == 0
    assert "identical weights" in err and err.count("\n") == 1
    assert json.loads(out)["warnings"] == t.warnings
    # The same weights with other metadata (another file, bytes and all) are the same weights.
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    copy = tiny_series / "checkpoint-300" / "model.safetensors"
    with safe_open(str(copy), "pt") as f:
        metadata = {**f.metadata(), "note": "copied"}
    save_file(load_file(str(copy)), str(copy), metadata=metadata)
    again = tl.compute_timeline([tiny_series])
    assert again.fingerprints[3] == t.fingerprints[1] and len(again.warnings) == 1


def test_steps_run_in_a_pool_with_progress(tiny_series: Path) -> None:
    seen: list[tuple[int, int, int]] = []
    t = tl.compute_timeline([tiny_series], workers=2,
                            progress=lambda done, total, r: seen.append((done, total, r.step)))
    assert sorted(step for _, _, step in seen) == [0, 100, 200]
    assert [done for done, _, _ in seen] == [1, 2, 3] and {total for _, total, _ in seen} == {3}
    serial = tl.compute_timeline([tiny_series])
    for key in serial.series:
        np.testing.assert_array_equal(t.series[key], serial.series[key])
    from headscope.engine.core.errors import CancelledError

    with pytest.raises(CancelledError):
        tl.compute_timeline([tiny_series], cancelled=lambda: True)


def test_sparkline_scales_and_samples() -> None:
    from headscope.tui.cli.commands.timeline import sparkline

    assert sparkline([0.0, 0.5, 1.0], 0.0, 1.0) == "▁▅█"
    assert sparkline([0.3, float("nan")], 0.3, 0.3) == "▁·"
    assert len(sparkline([float(i) for i in range(100)], 0, 99)) == 24


# ----------------------------------------------------------------------------- the bundled series


@pytest.fixture(scope="module")
def bundled() -> dict:
    """``headscope timeline sample_models/attn-only-2l-training --json``, run once."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["timeline", str(SERIES), "--json"])
    assert code == 0
    return json.loads(out.getvalue())


def test_the_bundled_series_is_small_and_dense_around_the_phase_change() -> None:
    sources, notes = tl.discover_steps([SERIES])
    steps = [s.step for s in sources]
    assert len(steps) >= 10 and notes == []
    assert steps[0] == 0 and steps[-1] == 3000
    assert sum(600 <= s <= 800 for s in steps) >= 5
    size = sum(f.stat().st_size for f in SERIES.rglob("*") if f.is_file())
    assert size < 10 * 2**20, size


def test_the_last_checkpoint_is_the_shipped_model_in_float16() -> None:
    from safetensors.torch import load_file

    shipped = load_file(str(SAMPLE_MODELS / "attn-only-2l" / "model.safetensors"))
    last = load_file(str(SERIES / "step-003000" / "model.safetensors"))
    assert set(last) == set(shipped)
    for name, tensor in shipped.items():
        assert last[name].dtype == torch.float16
        assert torch.equal(last[name], tensor.half()), name


def test_the_bundled_series_shows_the_induction_circuit_forming(bundled: dict) -> None:
    steps = bundled["steps"]
    heads = {(h["layer"], h["head"]): h for h in bundled["heads"]}
    prev = heads[PREV_TOKEN_HEAD]["prev_token_score"]
    induction = heads[INDUCTION_HEAD]["induction_score"]
    # The previous-token head forms: from the ~0.1 of random attention to well above.
    assert prev[0] < 0.2 and prev[-1] > 0.6
    # The induction head jumps from below 0.3 to above 0.8 ...
    below = max(i for i, v in enumerate(induction) if v < 0.3)
    above = min(i for i, v in enumerate(induction) if v > 0.8)
    assert below < above and all(v > 0.8 for v in induction[above:])
    # ... and the phase change is found in 600-800 (the training log's), with its levels:
    # half-way at 675, the first checkpoint where the score (0.57) is past 0.45.
    changes = {(c["layer"], c["head"], c["score"]): c for c in bundled["phase_changes"]}
    jump = changes[(*INDUCTION_HEAD, "induction_score")]
    assert jump["step"] == 675 and (jump["start_step"], jump["end_step"]) == (500, 800)
    assert jump["before"] < 0.3 and jump["after"] > 0.8
    # The previous-token head's score has its phase change in the same window, half-way
    # later (725): docs/math.md "Training dynamics" (it averages over positions that form
    # at different times; see the next test).
    formed = changes[(*PREV_TOKEN_HEAD, "prev_token_score")]
    assert 600 <= formed["step"] <= 800 and formed["after"] - formed["before"] > 0.2
    assert formed["start_step"] <= jump["step"] <= formed["end_step"]
    # The model's phase change is in the same window.
    assert 600 <= bundled["model_phase_change"]["step"] <= 800
    assert bundled["warnings"] == []
    assert len(set(bundled["fingerprints"])) == len(steps)


def test_the_previous_token_head_forms_at_the_first_positions_first() -> None:
    """docs/math.md's account of the previous-token score's late half-way point: at step 800
    L0.H1 attends to t-1 at positions 1-31 and hardly at all at positions 32-63."""
    from headscope.engine.forward.behaviour import repeated_tokens
    from headscope.engine.forward.transformer import run

    model = load_model(SERIES / "step-000800")
    try:
        tokens = repeated_tokens(model.cfg.d_vocab, model.cfg.n_ctx, 0)  # heads' sequences
        pattern = run(model.weights, tokens).patterns[:, PREV_TOKEN_HEAD[0], PREV_TOKEN_HEAD[1]]
    finally:
        model.raw_weights.close()
    q = torch.arange(1, tokens.shape[1])
    to_previous = pattern.float()[:, q, q - 1].mean(0)
    assert to_previous[:31].mean() > 0.7 and to_previous[31:].mean() < 0.1


def test_a_narrow_terminal_keeps_the_most_telling_scores() -> None:
    from headscope.tui.cli.commands.timeline import TEXT_SCORES, fitting_scores

    assert fitting_scores(18, 400) == TEXT_SCORES
    assert [key for _, key in fitting_scores(18, 100)] == ["prev_token_score", "induction_score"]
    assert [key for _, key in fitting_scores(18, 20)] == ["induction_score"]


def test_a_one_layer_series_has_no_composition_edges(tmp_path: Path, capsys) -> None:
    shape = ModelShape(n_layers=1, n_heads=2, d_model=16, d_head=8, d_vocab=len(corpus.VOCAB),
                       n_ctx=16, layer_norm=True)
    for i, step in enumerate((10, 20, 30)):
        _write_step(tmp_path / f"step{step}", seed=i, shape=shape)
    code, out, err = run_cli(capsys, "timeline", str(tmp_path), "--json")
    assert code == 0, err
    heads = json.loads(out)["heads"]
    assert all(h[k] == [None, None, None] for h in heads
               for k in ("q_composition_max", "k_composition_max", "v_composition_max"))
    assert all(None not in h["copying_score"] for h in heads)
