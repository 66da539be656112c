"""Reading a head in the explorer (tui/reading_screens.py): ``v`` opens the focused head's
singular directions (``{`` ``}`` step, ``x`` switches OV/QK) or, on the composition tab, the
highlighted edge's virtual heads (``g`` focuses the later head)."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from headscope.tui.reading_screens import DirectionsScreen, PathScreen
from headscope.tui.widgets.chart import Chart
from tests.test_tui_app import make_app, plain, settle, wait_until


async def test_v_opens_the_directions_and_the_keys_step_through_them() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("2")  # the OV tab
        await settle(pilot, app)
        head = app.explorer.head
        await pilot.press("v")
        await wait_until(pilot, lambda: isinstance(app.screen, DirectionsScreen), "the directions")
        await settle(pilot, app)
        found = await engine.singular_directions(*head, "ov", k=8, top=10)
        table = plain(app.screen.query_one("#directions-table", Static))
        first = found.directions[0]
        assert f"direction 1/{len(found.directions)}" in table
        assert repr(first.in_labels[0])[1:-1] in table and repr(first.out_labels[0])[1:-1] in table
        await pilot.press("right_curly_bracket")
        await settle(pilot, app)
        table = plain(app.screen.query_one("#directions-table", Static))
        assert f"direction 2/{len(found.directions)}" in table and f"{found.directions[1].sigma:.3g}" in table
        await pilot.press("left_curly_bracket", "left_curly_bracket")
        await settle(pilot, app)
        assert f"direction {len(found.directions)}/" in plain(app.screen.query_one("#directions-table", Static))
        await pilot.press("x")
        await settle(pilot, app)
        assert app.screen.kind == "qk" and "query token" in plain(app.screen.query_one("#directions-table", Static))
        await pilot.press("escape")
        await settle(pilot, app)
        assert not isinstance(app.screen, DirectionsScreen)


async def test_v_on_a_composition_edge_opens_its_virtual_heads() -> None:
    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("c")
        await settle(pilot, app)
        comp = await engine.composition("k")
        app.query_one("#comp-edges", DataTable).focus()
        await pilot.press("down")
        await settle(pilot, app)
        l1, h1, l2, h2, _ = comp.top_edges[1]
        await pilot.press("v")
        await wait_until(pilot, lambda: isinstance(app.screen, PathScreen), "the path screen")
        await settle(pilot, app)
        path = await engine.virtual_path((l1, h1), (l2, h2))
        summary = plain(app.screen.query_one("#path-summary", Static))
        assert f"L{l1}.H{h1} → L{l2}.H{h2}" in summary
        assert f"{path.k_positivity:+.3f}" in summary and f"{path.v_copying_score:+.3f}" in summary
        chart = app.screen.query_one("#path-heatmap", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None, "the K-path heatmap")
        assert "K-path" in chart.rendered.plain
        await pilot.press("g")
        await settle(pilot, app)
        assert not isinstance(app.screen, PathScreen) and app.explorer.head == (l2, h2)


async def test_the_filtered_tree_says_how_far_each_score_is_above_random_heads() -> None:
    from headscope.tui.adapt import z_score
    from headscope.tui.widgets.head_tree import HeadTree

    app, engine = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        await pilot.press("f")  # induction ≥ 0.3
        await settle(pilot, app)
        tree = app.explorer.query_one(HeadTree)
        null = await engine.score_null()
        scores = await engine.head_scores(1, 2)
        z = z_score(null, scores, "induction_score")
        assert z == pytest.approx((scores.induction_score - 0.05) / 0.02, rel=1e-5)  # fake null
        assert f"{scores.induction_score:.2f} z={z:.0f}" in tree.badge_text((1, 2))


async def test_attention_sink_heads_get_a_badge_and_only_they() -> None:
    from headscope.tui.widgets.head_tree import HeadTree

    app, engine = make_app()
    engine._behaviour[3, 0, 2] = 0.7  # a sink head (the fake's sink scores are all < 0.25)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.explorer.query_one(HeadTree)
        for head in tree.head_nodes:
            sink = (await engine.head_scores(*head)).attention_sink_score
            assert tree.badge_text(head).endswith(" S") == (sink >= 0.3), (head, sink)
        assert any(tree.badge_text(h).endswith(" S") for h in tree.head_nodes)
