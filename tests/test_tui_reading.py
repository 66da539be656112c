"""Reading a head in the explorer (tui/reading_screens.py): ``v`` opens the focused head's
singular directions (``{`` ``}`` step, ``x`` switches OV/QK) or, on the composition tab, the
highlighted edge's virtual heads (``g`` focuses the later head)."""

from __future__ import annotations

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


async def test_z_scores_sink_badges_and_the_sink_filter() -> None:
    """The z's the focus line, the Summary and the filtered tree show are the engine's null
    applied to the engine's scores; S marks the heads with either sink score ≥ 0.3, and the
    sink filter keeps those (and the focused head) only."""
    from headscope.engine.requests import SCORE_NAMES
    from headscope.tui.adapt import SCORES, z_text
    from headscope.tui.widgets.head_tree import HeadTree

    app, engine = make_app()
    engine._behaviour[3, 0, 2] = 0.7  # a first-token sink (the fake's sink scores are < 0.25)
    engine._behaviour[4, 1, 0] = 0.6  # a delimiter sink
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.explorer.query_one(HeadTree)
        null, table = await engine.score_null(), await engine.all_head_scores()
        z = {name: null.z(name, getattr(table, name)) for name in SCORE_NAMES}  # = heads --json
        sinks = {h for h in tree.head_nodes
                 if max(table.attention_sink_score[h], table.delimiter_sink_score[h]) >= 0.3}
        assert sinks == {(0, 2), (1, 0)}
        for head in tree.head_nodes:
            assert tree.badge_text(head).endswith(" S") == (head in sinks), head
        app.explorer.goto_head((1, 2), immediate=True)
        await pilot.press("6")
        await settle(pilot, app)
        focus = plain(app.query_one("#focus-line", Static))
        assert f"ind {table.induction_score[1, 2]:+.2f} {z_text(z['induction_score'][1, 2])}" in focus
        summary = app.query_one("#summary-table", DataTable)
        for layer, head in tree.head_nodes:
            cells = [str(c) for c in summary.get_row(f"{layer}.{head}")[1:len(SCORES) + 1]]
            assert cells == [f"{getattr(table, k)[layer, head]:+.3f}\n{z_text(z[k][layer, head])}"
                             for k, _ in SCORES]
        await pilot.press("f")  # induction ≥ 0.3, with each head's z
        await settle(pilot, app)
        value = table.induction_score[1, 2]
        assert f"{value:.2f} {z_text(z['induction_score'][1, 2])}" in tree.badge_text((1, 2))
        await pilot.press("f", "f", "f")  # → prev-token → copying → sink
        await settle(pilot, app)
        assert tree.filter is not None and tree.filter[1] == "sink"
        assert {h for h in tree.head_nodes if tree.meets(h)} == sinks
        assert set(tree.head_nodes) <= sinks | {app.explorer.head}
        assert f"{table.delimiter_sink_score[1, 0]:.2f} {z_text(z['delimiter_sink_score'][1, 0])}" \
            in tree.badge_text((1, 0))
