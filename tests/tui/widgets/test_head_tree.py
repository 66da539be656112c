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


def test_the_narrow_filter_title_reads_in_full() -> None:
    """Issue 39 §3: at 80×24 the filtered tree's title (`induction ≥ 0.30: 3`) was cut before
    its count. Narrow (18 columns, 12 for the title), every filter's title fits, count kept."""
    from headscope.tui.session.choices import TREE_FILTERS
    from headscope.tui.widgets.head_tree import NARROW_TITLE, filter_title

    for _, label in TREE_FILTERS:
        for n in (0, 7, 144, 9216):
            title = filter_title(label, FILTER_THRESHOLD, n, compact=True)
            assert len(title) <= NARROW_TITLE and title.endswith(f": {n}"), title
    assert filter_title("induction", 0.3, 3, compact=True) == "ind ≥0.3: 3"
    assert filter_title("induction", 0.3, 3, compact=False) == "induction ≥ 0.30: 3"


async def test_the_narrow_tree_has_room_for_its_title() -> None:
    """The 12 columns the narrow title assumes: the tree's width less its corners and gaps."""
    from headscope.tui.widgets.head_tree import NARROW_TITLE

    app, _ = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, app)
        await pilot.press("f")
        await settle(pilot, app)
        tree = app.query_one(HeadTree)
        title = str(tree.border_title)
        assert title.startswith("ind") and len(title) <= NARROW_TITLE
        assert tree.outer_size.width - 6 >= NARROW_TITLE
