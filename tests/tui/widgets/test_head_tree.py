"""The head tree (tui/widgets/head_tree.py): badges of the planted heads, the score filter."""

from __future__ import annotations

from headscope.tui.base.labels import FILTER_THRESHOLD
from headscope.tui.widgets.head_tree import HeadTree
from tests.fake_engine import FakeEngine
from tests.tui import test_app
from tests.tui.test_app import make_app, settle

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


async def test_badges_mark_the_planted_heads() -> None:
    app, _ = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        assert " P" in tree.badge_text((0, 1))  # planted previous-token head
        assert tree.badge_text((1, 2)).endswith("I")  # planted induction head
        assert "P" not in tree.badge_text((1, 0))


async def test_filter_keeps_heads_with_a_score_above_the_threshold() -> None:
    app, engine = make_app(FakeEngine(n_layers=3, n_heads=5))
    engine._behaviour[3, 2, 4] = 0.7  # an attention-sink head (the fake has none by default)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        heads = [(la, h) for la in range(3) for h in range(5)]
        assert set(tree.head_nodes) == set(heads)
        scores = {hd: engine._scores(*hd) for hd in heads}
        for key, label in (("induction_score", "induction"), ("prev_token_score", "prev-token"),
                           ("copying_score", "copying"), ("attention_sink_score", "sink")):
            await pilot.press("f")
            await settle(pilot, app)
            want = {hd for hd in heads if getattr(scores[hd], key) >= FILTER_THRESHOLD}
            # the focused head stays in the tree (and under the cursor) whatever the filter
            assert want and set(tree.head_nodes) == want | {app.explorer.head}
            assert str(tree.border_title) == f"{label} ≥ {FILTER_THRESHOLD:.2f}: {len(want)}"
            some = min(want)
            assert f"{getattr(scores[some], key):.2f}" in tree.badge_text(some)
        await pilot.press("f")
        await settle(pilot, app)
        assert app.explorer.choices.tree_filter is None and set(tree.head_nodes) == set(heads)
