"""The composition path column (tui/widgets/path_column.py) is on screen at 80x24."""

from __future__ import annotations

import re

import pytest
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
        assert any(c.rstrip().endswith("unused") for c in cells), cells
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


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_every_path_cell_puts_its_value_in_the_same_columns(size: tuple[int, int]) -> None:
    """The path column mixed three formats: `+0.72 used` and `+0.00 unused` right-aligned
    beside bare `+0.00`s, so the values sat 5 and 7 columns apart down the column. As the
    table draws it, every value starts where the header's `path` does, its word after it."""
    app, _ = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app)
        await pilot.press("5")
        await settle(pilot, app)
        # edges drawn (strong: "used" or "unused") and edges below the threshold (a bare value)
        await pilot.press(*">" * 3)
        await settle(pilot, app)
        pane = app.explorer.query_one("#composition-pane")
        table = app.explorer.query_one("#comp-edges", DataTable)
        assert pane.paths_state == "done"
        widths = [column.get_render_width(table) for column in table.columns.values()]
        start, width = sum(widths[:3]), widths[3]

        def path_of(y: int) -> str:  # the path column of the table's line y, as drawn
            return table.render_line(y).text[start:start + width]

        header = path_of(0)
        cells = [path_of(1 + i) for i in range(table.row_count)]
        found = [re.search(r"[+-]\d\.\d\d", c) for c in cells]
        assert sum(m is not None for m in found) >= 3, cells
        columns = {m.start() for m in found if m is not None}
        assert columns == {header.index("path")}, (header, cells)
        words = {c[m.end():].strip() for c, m in zip(cells, found, strict=True) if m is not None}
        assert {"used", "unused", ""} <= words, cells  # all three kinds are in the list
