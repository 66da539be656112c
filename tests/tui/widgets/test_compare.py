"""Compare mode (the TUI part): ``headscope A --compare B``.

Fake engines first (fast): B is A with one head pruned, so every number the views show can
be checked against the fakes' own dense circuits. Then the real thing: the bundled
attn-only-2l against a copy whose induction head is zeroed (safetensors load/save),
through ``Engine.compare`` (engine.sweeps.diff.diff_models on A's workers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from textual.widgets import DataTable, Static

from headscope.engine.core.requests import CompositionRequest
from headscope.engine.sweeps.diff import EDGE_THRESHOLD
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.head_tree import HeadTree
from headscope.tui.widgets.status import StatusBar
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, notified
from tests.engine.sweeps.test_diff_sample_models import permuted_copy
from tests.fake_engine import FakeEngine
from tests.tui.test_app import chart_text, plain, settle

MODEL = Path(__file__).resolve().parents[3] / "sample_models" / "attn-only-2l"


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


def fake_pair(pruned: tuple[int, int] = (1, 2)) -> tuple[HeadscopeApp, FakeEngine, FakeEngine]:
    a = FakeEngine("fake/attn-only-2l")
    b = FakeEngine("fake/attn-only-2l-pruned").prune(*pruned)
    engines = {a.path: a, b.path: b}
    app = HeadscopeApp(a.path, compare=b.path, engine_factory=lambda p, _r: engines[p],
                       settings=Settings(), debounce=0.02)
    return app, a, b


async def test_changes_tab_names_the_pruned_head_first_and_its_lost_edges() -> None:
    app, a, _ = fake_pair()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert a.calls["compare"] == 1 and app.compare.diff is not None
        assert "vs attn-only-2l-pruned" in app.query_one(StatusBar).render().plain
        await pilot.press("7")
        await settle(pilot, app)
        table = app.query_one("#changes-table", DataTable)
        assert table.row_count == a.L * a.H
        assert str(table.get_row_at(0)[0]) == "L1.H2"
        # the pruned head's circuits are gone: similarity 0; an untouched head's are equal
        row = {r["head"]: r for r in app.compare.diff.heads if r["layer"] == 1}
        assert row[2]["ov_similarity"] == 0.0 and row[0]["ov_similarity"] == pytest.approx(1.0)
        # lost K-composition edges: every edge into L1.H2 that was above threshold in A
        comp = await a.get(CompositionRequest.of(a.structure, "k"))
        want = {(l1, h1) for l1, h1, l2, h2, s in comp.top_edges
                if (l2, h2) == (1, 2) and s > EDGE_THRESHOLD}
        assert want
        listing = plain(app.query_one("#changes-edges", Static))
        for l1, h1 in want:
            assert f"K lost    L{l1}.H{h1}→L1.H2" in listing
        assert f"{len(want)} lost" in chart_text(app, "changes-graph")
        await pilot.press("c")  # K → V: the pruned head also loses its V-composition edges
        await settle(pilot, app)
        assert app.compare.changes_kind == "v" and "V-composition diff" in chart_text(app, "changes-graph")
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("enter")
        await settle(pilot, app)
        assert app.explorer.head == (1, 2)
        focus = plain(app.query_one("#focus-line", Static))
        ind = next(r for r in app.compare.diff.heads if (r["layer"], r["head"]) == (1, 2))
        assert f"ind {ind['induction_score_a']:+.2f}→{ind['induction_score_b']:+.2f}" in focus
        assert "B sim OV +0.00" in focus


async def test_tree_badges_show_which_heads_changed() -> None:
    app, _, _ = fake_pair()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        assert tree.badge_text((1, 2)).endswith("Δ")
        unchanged = [hd for hd in tree.head_nodes if hd != (1, 2)]
        assert all(tree.badge_text(hd).endswith("=") for hd in unchanged)


async def test_heatmaps_of_a_and_b_side_by_side_or_their_difference() -> None:
    app, _, b = fake_pair(pruned=(0, 0))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert app.explorer.head == (0, 0)
        assert app.query_one("#qk-token-b", Chart).display
        assert not app.query_one("#qk-position", Chart).display
        assert "B token QK L0.H0" in chart_text(app, "qk-token-b")
        block_a, block_b = app.explorer.results["qk"]["token"], app.explorer.results["qk"]["token_b"]
        assert block_b.row_ids == block_a.row_ids
        assert np.allclose(block_b.values, 0)  # B's pruned head has no QK circuit
        # side by side: one colour range for both, A's
        fig_a = app.query_one("#qk-token", Chart).figure
        fig_b = app.query_one("#qk-token-b", Chart).figure
        assert fig_a.vmax == fig_b.vmax == pytest.approx(float(np.abs(block_a.values).max()))
        await pilot.press("d")
        await settle(pilot, app)
        assert app.compare.view == "diff"
        assert "B − A" in chart_text(app, "qk-token-b")
        fig_b = app.query_one("#qk-token-b", Chart).figure
        assert np.allclose(fig_b.values, np.asarray(block_b.values) - np.asarray(block_a.values))
        await pilot.press("2")
        await settle(pilot, app)
        assert "B − A" in chart_text(app, "ov-heatmap-b")
        full_b = b.full_ov(0, 0)
        assert np.allclose(app.explorer.results["ov"]["full_ov_b"].values, full_b[:24, :24])


async def test_compare_mode_at_80x24_still_fits() -> None:
    app, _, _ = fake_pair()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        for line in chart_text(app, "qk-token-b").splitlines():
            assert len(line) <= app.query_one("#qk-token-b", Chart).size.width
        await pilot.press("7")
        await settle(pilot, app)
        assert str(app.query_one("#changes-table", DataTable).get_row_at(0)[0]) == "L1.H2"


async def test_without_b_the_compare_keys_only_explain() -> None:
    a = FakeEngine()
    app = HeadscopeApp(a.path, engine_factory=lambda _p, _r: a, settings=Settings())
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("7", "d")
        await settle(pilot, app)
        assert app.explorer.active_tab == "qk" and a.calls["compare"] == 0
        assert any("--compare" in n.message for n in notified(app))


# -- the real engine --------------------------------------------------------------------------


async def wait_for_diff(pilot, app: HeadscopeApp) -> None:
    """Until Engine.compare has scored both models (a few seconds on the real engine)."""
    for _ in range(40):
        await settle(pilot, app, rounds=1)
        if app.compare.diff is not None or app.errors:
            break
    assert not app.errors and app.compare.diff is not None


def zeroed_copy(tmp: Path, names: tuple[str, ...]) -> Path:
    """attn-only-2l with ``names`` of its induction head set to zero (safetensors)."""
    from tools.screenshots import pruned_copy

    return pruned_copy(MODEL, tmp, *INDUCTION_HEAD, names)


IND = "L{}.H{}".format(*INDUCTION_HEAD)
EDGE = "L{}.H{}→{}".format(*PREV_TOKEN_HEAD, IND)


async def test_real_engine_pruned_induction_head_and_its_lost_k_edge(tmp_path: Path) -> None:
    # Zeroing only W_O leaves the induction head's QK circuit, which is what K-composition
    # reads: pruning the whole head is what loses the edge (see the W_O-only test below).
    pruned = zeroed_copy(tmp_path, ("W_Q", "W_K", "W_V", "W_O"))
    app = HeadscopeApp(MODEL, compare=pruned, settings=Settings(), sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_diff(pilot, app)
        await pilot.press("7")
        await settle(pilot, app)
        assert str(app.query_one("#changes-table", DataTable).get_row_at(0)[0]) == IND
        listing = plain(app.query_one("#changes-edges", Static)).splitlines()
        assert listing[0].split()[:3] == ["K", "lost", EDGE]
        assert "K-composition diff" in chart_text(app, "changes-graph")
        assert app.query_one(HeadTree).badge_text(INDUCTION_HEAD).endswith("Δ")


async def test_real_engine_compare_with_w_o_zeroed(tmp_path: Path) -> None:
    from headscope.engine.service.engine import Engine

    a, b = Engine(MODEL), Engine(zeroed_copy(tmp_path, ("W_O",)))
    try:
        diff = await a.compare(b)
    finally:
        await a.aclose()
        await b.aclose()
    first = max(diff.heads, key=lambda r: r["change"])
    assert (first["layer"], first["head"]) == INDUCTION_HEAD
    assert first["ov_similarity"] == pytest.approx(0.0, abs=1e-6)
    assert first["qk_similarity"] == pytest.approx(1.0, abs=1e-5)  # QK untouched
    assert diff.composition["k"]["lost"] == []  # K-composition reads its QK, not its OV
    others = [r for r in diff.heads if (r["layer"], r["head"]) != INDUCTION_HEAD]
    assert all(r["change"] < 1e-4 for r in others)


@pytest.mark.parametrize("match_heads", [True, False])
async def test_real_engine_match_heads_pairs_permuted_heads(tmp_path: Path, match_heads: bool) -> None:
    layer, head = INDUCTION_HEAD
    n_heads = json.loads((MODEL / "headscope.json").read_text())["n_heads"]
    perm = [(i + 1) % n_heads for i in range(n_heads)]
    matched = perm.index(head)  # where A's induction head sits in B
    b = permuted_copy(MODEL, tmp_path / "attn-only-2l-shuffled", perm)
    app = HeadscopeApp(MODEL, compare=b, match_heads=match_heads, settings=Settings(), sweep=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for_diff(pilot, app)
        app.explorer.goto_head(INDUCTION_HEAD, immediate=True)
        await pilot.press("2")
        await settle(pilot, app)
        a_block, b_block = app.explorer.results["ov"]["full_ov"], app.explorer.results["ov"]["full_ov_b"]
        focus = plain(app.query_one("#focus-line", Static))
        if match_heads:
            # B's view shows the head matched to A's: the same circuit, so B − A is zero
            assert app.compare.diff.matching[layer][head] == matched and app.compare.head_b(INDUCTION_HEAD) == (layer, matched)
            assert (b_block.layer, b_block.head) == (layer, matched)
            np.testing.assert_allclose(b_block.values, a_block.values, atol=1e-5)
            assert f"≙ B H{matched}" in focus and "OV +1.00" in focus
            assert f"L{layer}.H{matched} (matched)" in chart_text(app, "ov-heatmap-b")
        else:  # head h of B is another head of A: a different circuit
            assert app.compare.diff.matching is None and (b_block.layer, b_block.head) == INDUCTION_HEAD
            assert not np.allclose(b_block.values, a_block.values, atol=1e-2)
            assert "≙" not in focus
        # Spectrum and Prompt show B too: eigenvalues overlaid, B's pattern beside A's
        await pilot.press("3")
        await settle(pilot, app)
        spectra = app.explorer.results["spectrum"]
        assert (spectra["ov_b"].layer, spectra["ov_b"].head) == (b_block.layer, b_block.head)
        assert "→ B" in chart_text(app, "spectrum-ov")
        same_ov = np.allclose(np.sort_complex(spectra["ov"].eigenvalues),
                              np.sort_complex(spectra["ov_b"].eigenvalues), atol=1e-3)
        assert same_ov == match_heads
        app.explorer.choices.prompt_text = "When Mary and John went to the store , John gave a drink to Mary"
        await pilot.press("4")
        await settle(pilot, app)
        views = app.explorer.results["prompt"]
        assert (views["b"].layer, views["b"].head) == (b_block.layer, b_block.head)
        assert "B attention" in chart_text(app, "prompt-pattern-b")
        assert np.allclose(views["a"].pattern, views["b"].pattern, atol=1e-5) == match_heads


@pytest.mark.parametrize("ending", ["q", "torn down"])
async def test_both_engines_are_closed_however_the_app_ends(ending: str) -> None:
    """`q`, or an end without it (a closed terminal or websocket, ``run_test`` left): A's and
    B's engines are closed, so their workers end where the process lives on."""
    app, a, b = fake_pair()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        assert not a.closed and not b.closed
        if ending == "q":
            await pilot.press("q")
    assert a.closed and b.closed
    assert a.calls["aclose"] == b.calls["aclose"] == 1
