"""The focus line (tui/widgets/focus_line.py) keeps the strongest scores and their z at 80 columns."""

from __future__ import annotations

from tests.e2e import test_explorer_small_terminal
from tests.tui.test_app import make_app, settle

_quiet_env = test_explorer_small_terminal._quiet_env  # test_explorer_small_terminal's autouse fixture


async def test_the_focus_line_keeps_the_strongest_scores_z_at_80_columns() -> None:
    """At 80 columns the focus line kept `QK+` and `prev` and dropped the z of `ind +0.95`;
    now the weaker parts go first and the strongest score keeps its z."""
    import math

    from textual.widgets import Static

    from headscope.engine.core.requests import ScoreNullRequest
    from headscope.tui.base.labels import SHORT, z_score, z_text
    from headscope.tui.widgets.focus_line import SHORT_LABELS, score_texts

    app, engine = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        line = app.query_one("#focus-line", Static)
        shown = str(line.render())
        row = engine._scores(0, 0)
        null = await engine.get(ScoreNullRequest())
        keys = ["copying_score", "qk_positivity", "prev_token_score", "duplicate_token_score",
                "induction_score"]
        top = max(keys, key=lambda k: z_score(null, row, k))
        name = {**SHORT, **SHORT_LABELS}[top]
        value = getattr(row, top)
        assert f"{name} {value:+.2f} {z_text(z_score(null, row, top))}" in shown, shown
        assert len(shown) <= line.content_size.width
        # every candidate with a z comes before the ones without any
        has_z = ["z=" in t.plain for t in score_texts(row, null, math.nan)]
        assert has_z == sorted(has_z, reverse=True)
