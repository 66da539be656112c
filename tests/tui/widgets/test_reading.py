"""Reading a head in the explorer (tui/reading_screens.py): the singular-directions panel beside
the QK and OV heatmaps (``(`` ``)`` step, ``v`` shows/hides it) and, on the composition tab,
enter on an edge opens its virtual heads (``g`` focuses the later head)."""

from __future__ import annotations

from textual.widgets import DataTable, Static

from headscope.engine.core.requests import DirectionsRequest, ScoreNullRequest, ScoreTableRequest
from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.screens.path import PathScreen
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.panes import CompositionPane
from headscope.tui.widgets.reading import N_DIRECTIONS, N_TOKENS, DirectionsPanel
from tests import weight_algebra as algebra
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model
from tests.tui.test_app import make_app, plain, settle, wait_until


async def test_directions_panel_and_the_path_of_an_edge_on_attn_only_2l() -> None:
    """The real engine on the bundled model: the panel beside the induction head's full OV
    shows engine/circuits/directions.py's directions, ``)`` steps; enter on the L0.H1 → L1.H2 edge
    shows the K-path's score, ``g`` focuses L1.H2."""
    from headscope.engine.circuits import directions as reading
    from headscope.engine.circuits import head_circuits as circuits
    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps.prompts import label

    path = sample_model("attn-only-2l")
    model = load_model(path)
    w = model.weights
    found = reading.signed_directions(circuits.full_ov(w, *INDUCTION_HEAD), N_DIRECTIONS)
    tops = [(reading.top_by_magnitude(found.u[:, i], N_TOKENS),
             reading.top_by_magnitude(found.v[:, i], N_TOKENS)) for i in range(N_DIRECTIONS)]
    overlaps = [reading.overlap(*ins, *outs) for ins, outs in tops]
    sigma = [f"σ {float(s):.3g}" for s in found.s]
    assert sigma[0] != sigma[1]

    app = HeadscopeApp(path, settings=Settings(), debounce=0.01, sweep=False, head=INDUCTION_HEAD)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, app.model_ready.is_set, "the model", limit=1200)
        await pilot.press("2")
        await settle(pilot, app)
        panel = app.explorer.query_one("#ov-directions", DirectionsPanel)
        heatmap = app.explorer.query_one("#ov-heatmap", Chart)
        assert panel.display and panel.region.width and panel.region.x >= heatmap.region.right
        text = plain(panel)
        (in_ids, in_values), (out_ids, out_values) = tops[0]
        assert f"OV direction 1/{N_DIRECTIONS}" in text and sigma[0] in text
        assert f"overlap {overlaps[0]:+.2f} · head {sum(overlaps) / len(overlaps):+.2f}" in text
        assert f"{label(model.tokenizer, in_ids[0])}" in text and f"{in_values[0]:+.2f}" in text
        assert f"{label(model.tokenizer, out_ids[0])}" in text and f"{out_values[0]:+.2f}" in text
        await pilot.press("right_parenthesis")
        text = plain(panel)
        assert f"OV direction 2/{N_DIRECTIONS}" in text and sigma[1] in text and sigma[0] not in text
        assert f"overlap {overlaps[1]:+.2f}" in text

        await pilot.press("5")  # K-composition: enter on the induction mechanism's edge
        await settle(pilot, app)
        pane = app.explorer.query_one(CompositionPane)
        row = [e[:4] for e in pane.edges].index((*PREV_TOKEN_HEAD, *INDUCTION_HEAD))
        table = app.explorer.query_one("#comp-edges", DataTable)
        table.focus()
        table.move_cursor(row=row)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, PathScreen), "the path view")
        await settle(pilot, app)
        k_path = algebra.qk_positivity(reading.k_path(w, PREV_TOKEN_HEAD, INDUCTION_HEAD))
        v_path = algebra.copying_score(reading.virtual_ov(w, PREV_TOKEN_HEAD, INDUCTION_HEAD))
        summary = plain(app.screen.query_one("#path-summary", Static))
        assert "L0.H1 → L1.H2" in summary and f"K-path positivity {float(k_path):+.3f}" in summary
        assert f"V-path copying {float(v_path):+.3f}" in summary
        chart = app.screen.query_one("#path-heatmap", Chart)
        await wait_until(pilot, lambda: chart.rendered is not None, "the K-path heatmap")
        assert "K-path" in chart.rendered.plain
        await pilot.press("g")
        await settle(pilot, app)
        assert not isinstance(app.screen, PathScreen) and app.explorer.head == INDUCTION_HEAD


async def test_directions_panel_is_off_when_narrow_v_shows_it_and_it_follows_the_head() -> None:
    app, engine = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("2")
        await settle(pilot, app)
        panel = app.explorer.query_one("#ov-directions", DirectionsPanel)
        assert not panel.display or not panel.region.width  # no room: hidden until v
        assert engine.calls.get("singular_directions", 0) == 0  # and not computed
        await pilot.press("v")
        await settle(pilot, app)
        assert panel.region.width and not app.explorer.query_one("#ov-top", Static).region.width
        head = app.explorer.head
        found = await engine.get(DirectionsRequest.of(engine.structure, *head, "ov", k=N_DIRECTIONS, top=N_TOKENS))
        assert f"{found.directions[0].sigma:.3g}" in plain(panel)
        await pilot.press("left_parenthesis")  # cyclic: the last direction
        n = len(found.directions)
        assert f"direction {n}/{n}" in plain(panel)
        await pilot.press("right_square_bracket")  # the next head: its directions, from 1
        await settle(pilot, app)
        other = await engine.get(DirectionsRequest.of(engine.structure, *app.explorer.head, "ov", k=N_DIRECTIONS, top=N_TOKENS))
        assert app.explorer.head != head and f"direction 1/{n}" in plain(panel)
        assert f"{other.directions[0].sigma:.3g}" in plain(panel)
        await pilot.press("left_square_bracket")  # back: from the panel's cache, no worker
        calls = engine.calls["singular_directions"]
        await settle(pilot, app)
        assert engine.calls["singular_directions"] == calls
        await pilot.press("1", "v")  # QK: the panel hides again
        await settle(pilot, app)
        assert not app.explorer.query_one("#qk-directions", DirectionsPanel).region.width


async def test_z_scores_sink_badges_and_the_sink_filter() -> None:
    """The z's the focus line, the Summary and the filtered tree show are the engine's null
    applied to the engine's scores; S marks the heads with either sink score ≥ 0.3, and the
    sink filter keeps those (and the focused head) only."""
    from headscope.engine.core.validation import SCORE_NAMES
    from headscope.tui.base.labels import SCORES, z_text
    from headscope.tui.widgets.head_tree import HeadTree

    app, engine = make_app()
    engine._behaviour[3, 0, 2] = 0.7  # a first-token sink (the fake's sink scores are < 0.25)
    engine._behaviour[4, 1, 0] = 0.6  # a delimiter sink
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.explorer.query_one(HeadTree)
        null, table = await engine.get(ScoreNullRequest()), await engine.get(ScoreTableRequest())
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
