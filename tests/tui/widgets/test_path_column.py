"""The composition path column (tui/widgets/path_column.py) is on screen at 80x24."""

from __future__ import annotations

from textual.widgets import DataTable

from tests.e2e import test_explorer_small_terminal
from tests.tui.test_app import make_app, settle

_quiet_env = test_explorer_small_terminal._quiet_env  # test_explorer_small_terminal's autouse fixture


async def test_the_composition_path_column_is_on_screen_at_80x24() -> None:
    """At 80×24 the edge list showed source, target and s−base, and the path column (the
    path-patching effect beside the weight score) was past the right edge. Packed (no cell
    padding, a narrower graph), every column, `+0.00 unused` included, is inside the list."""
    app, engine = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("5")
        await settle(pilot, app)
        pane = app.explorer.query_one("#composition-pane")
        table = app.explorer.query_one("#comp-edges", DataTable)
        assert pane.compact and len(engine.path_requests) == 1
        inside = table.scrollable_content_region.width
        widths = [column.get_render_width(table) for column in table.columns.values()]
        assert sum(widths) <= inside, (widths, inside)
        assert table.max_scroll_x == 0
        labels = [str(column.label).strip() for column in table.columns.values()]
        assert labels == ["from", "to", "s−base", "path"]
        cells = [str(table.get_row_at(i)[3]) for i in range(table.row_count)]
        assert any(c.endswith("unused") for c in cells), cells
        for i, edge in enumerate(pane.edges):  # each row: its edge, score and path effect
            row = [str(c).strip() for c in table.get_row_at(i)]
            assert row[:3] == [f"L{edge[0]}.H{edge[1]}", f"L{edge[2]}.H{edge[3]}",
                               f"{edge[4]:+.3f}"]
            effect = pane.paths.get(((edge[0], edge[1]), (edge[2], edge[3])))
            if effect is not None:
                assert row[3].startswith(f"{effect:+.2f}")
        # the cursor's edge stays selected through a resize (the columns are rebuilt)
        table.focus()
        await pilot.press("down", "down")
        await settle(pilot, app)
        selected = pane.selected
        await pilot.resize_terminal(120, 40)
        await settle(pilot, app)
        assert not pane.compact and pane.selected == selected
        assert [str(c.label) for c in table.columns.values()] == ["source", "target", "s−base",
                                                                   "path"]
        assert tuple(pane.edges[table.cursor_row][:4]) == tuple(selected)
