"""The "why" view (tui/widgets/why.py) mounted in a tiny app, on a real QK attribution:
attn-only-2l's induction head L1.H2 on a repeated random sequence, at the induction cell.

What is asserted is what the screen shows (the compositor's lines, as the terminal gets them),
the messages the view posts, and the codes it writes in 256 colours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any

import numpy as np
import pytest
import textual.constants
from textual.app import App, ComposeResult
from textual.message import Message
from textual.widgets import DataTable
from textual.worker import WorkerCancelled

from headscope.engine.core.attribution import QKAttribution
from headscope.engine.forward.behaviour import repeated_tokens
from headscope.engine.forward.qk_attribution import qk_attribution
from headscope.engine.model.loading import load_model
from headscope.tui.base.colormode import detect_color_mode
from headscope.tui.base.messages import WhyHeadSelected, WhyKeyMoved
from headscope.tui.plots.why import num
from headscope.tui.widgets.chart import Chart
from headscope.tui.widgets.why import IDLE, WhyView
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model

HALF, QUERY = 20, 25
KEY = QUERY - HALF + 1  # the induction cell: after the query token's first occurrence
PREVIOUS = "a{}.h{}".format(*PREV_TOKEN_HEAD)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TRUECOLOR = re.compile(r"\x1b\[[0-9;]*?[34]8;2;")


@pytest.fixture(scope="module")
def model_tokens() -> tuple[Any, list[int]]:
    model = load_model(sample_model("attn-only-2l"))
    tokens = repeated_tokens(model.cfg.d_vocab, model.cfg.n_ctx, seed=0, seq_len=HALF,
                             batch=1)[0].tolist()
    return model, tokens


@pytest.fixture(scope="module")
def row(model_tokens: tuple[Any, list[int]]) -> QKAttribution:
    model, tokens = model_tokens
    return qk_attribution(model.weights, tokens, *INDUCTION_HEAD, QUERY)


class WhyApp(App[None]):
    """The view alone; records the messages it posts."""

    colormap_name = "red-blue"

    def __init__(self, mode: str | None = None) -> None:
        super().__init__()
        self.mode = mode
        self.posted: list[Message] = []

    @property
    def color_mode(self) -> str:
        return self.mode or detect_color_mode(self.console.color_system, os.environ)

    def compose(self) -> ComposeResult:
        yield WhyView()

    def on_why_head_selected(self, message: WhyHeadSelected) -> None:
        self.posted.append(message)

    def on_why_key_moved(self, message: WhyKeyMoved) -> None:
        self.posted.append(message)


def screen_lines(app: App[Any]) -> list[str]:
    """The screen as the terminal shows it: the compositor's full update, codes removed."""
    update = app.screen._compositor.render_update(full=True)
    out = ANSI.sub("", update.render_segments(app.console))
    return [line.rstrip() for line in out.split("\n")][: app.size.height]


async def drawn(pilot: Any, app: WhyApp) -> None:
    """Until the grid's figure is built (a worker thread) and painted."""
    chart = app.query_one("#why-grid", Chart)
    for _ in range(400):
        await pilot.pause(0.02)
        # a build cancelled by a newer one (its exclusive group) has finished too: look again
        with contextlib.suppress(WorkerCancelled):
            await app.workers.wait_for_complete()
        if chart.figure is None or chart.rendered is not None:
            break
    await pilot.pause()


def screen_words(app: App[Any]) -> str:
    """The screen's words, one space between them (a wrapped line joins the next)."""
    return " ".join(" ".join(screen_lines(app)).split())


def totals_rows(lines: list[str], side: str) -> list[str]:
    """The rows of one side's totals table, as on screen (the part of each line under its
    header)."""
    header = next(i for i, line in enumerate(lines) if f"{side} side" in line and "total" in line)
    col = lines[header].index(f"{side} side") - 1
    end = lines[header].index("key side") - 1 if side == "query" else None
    return [line[col:end].strip() for line in lines[header + 1:] if line[col:end].strip()]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_induction_cell_names_the_previous_token_head_first(
        row: QKAttribution, model_tokens: tuple[Any, list[int]], size: tuple[int, int]) -> None:
    app = WhyApp()
    async with app.run_test(size=size) as pilot:
        view = app.query_one(WhyView)
        view.show(row, key=KEY, tokens=[f"tok{t}" for t in model_tokens[1]])
        await drawn(pilot, app)
        lines = screen_lines(app)
        score = float(row.score[row.column(KEY)])
        assert lines[0] == f"why L1.H2 attends q={QUERY} → k={KEY}: score {num(score)}"
        assert f"q={QUERY} 'tok{model_tokens[1][QUERY]}' → k={KEY} 'tok{model_tokens[1][KEY]}'" \
            in lines[1]
        key_side = totals_rows(lines, "key")
        _, key_totals = row.totals(KEY)
        assert key_side[0].split()[:2] == [PREVIOUS, num(key_totals[PREVIOUS])]
        assert "█" in key_side[0]  # its bar
        # the grid: the key-side column of the previous-token head comes first
        grid = next(line for line in lines if "query ↓ × key →" in line)
        header = lines[lines.index(grid) + 1].split()
        assert header[0] == PREVIOUS
        # the ranked list starts with the largest term
        q, k, v = row.ranked_terms(KEY, 1)[0]
        assert any(line.split()[-3:] == [q, k, num(v)] for line in lines), (q, k, v)
        assert all(len(line) <= size[0] for line in lines)


async def test_moving_the_key_reslices_the_cached_row(row: QKAttribution) -> None:
    app = WhyApp()
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one(WhyView)
        view.show(row, key=KEY)
        await drawn(pilot, app)
        app.query_one("#why-terms", DataTable).focus()  # ← → move the key from a list too
        await pilot.press("right")
        await drawn(pilot, app)
        lines = screen_lines(app)
        new = KEY + 1
        assert lines[0] == f"why L1.H2 attends q={QUERY} → k={new}: " \
                           f"score {num(float(row.score[row.column(new)]))}"
        assert view.attribution is row and view.key == new  # the same row: no recomputation
        _, key_totals = row.totals(new)
        first = max(key_totals, key=lambda c: abs(key_totals[c]))
        assert totals_rows(lines, "key")[0].split()[:2] == [first, num(key_totals[first])]
        q, k, v = row.ranked_terms(new, 1)[0]
        assert any(line.split()[-3:] == [q, k, num(v)] for line in lines)
        assert app.posted == [WhyKeyMoved(INDUCTION_HEAD, QUERY, new)]
        await pilot.press("left", "left")
        await pilot.pause()
        assert view.key == KEY - 1 and f"→ k={KEY - 1}:" in screen_lines(app)[0]
        await pilot.press("home")
        await pilot.pause()
        assert view.key == 0
        await pilot.press("left")  # the row's first key: stays
        await pilot.press("end")
        await pilot.pause()
        assert view.key == QUERY  # the last key of a causal row: the query's own
        await pilot.press("right")
        await pilot.pause()
        assert view.key == QUERY
        assert [m.key for m in app.posted if isinstance(m, WhyKeyMoved)] == [
            new, KEY, KEY - 1, 0, QUERY]


async def test_enter_on_a_source_head_asks_to_jump_to_it(row: QKAttribution) -> None:
    app = WhyApp()
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.query_one(WhyView)
        view.show(row, key=KEY)
        await drawn(pilot, app)
        key_totals = app.query_one("#why-key-totals", DataTable)
        key_totals.focus()
        await pilot.pause()
        assert f"{PREVIOUS}, key side · enter: go to L0.H1" in view.status
        await pilot.press("enter")
        await pilot.pause()
        assert app.posted == [WhyHeadSelected(PREV_TOKEN_HEAD, "key")]
        # the ranked list: embed × a0.h1 links to its key side's head
        app.posted.clear()
        app.query_one("#why-terms", DataTable).focus()
        await pilot.pause()
        q, k, _ = row.ranked_terms(KEY, 1)[0]
        assert (q, k) == ("embed", PREVIOUS) and "(key side)" in view.status
        await pilot.press("enter")
        await pilot.pause()
        assert app.posted == [WhyHeadSelected(PREV_TOKEN_HEAD, "key")]
        # a source that is not a head goes nowhere: the query side's first row is embed
        app.posted.clear()
        app.query_one("#why-query-totals", DataTable).focus()
        await pilot.pause()
        assert view.status.endswith("embed, query side · not a head")
        await pilot.press("enter")
        await pilot.pause()
        assert app.posted == []
        # the query side's first head, further down: its row links to it, side "query"
        q_totals = row.totals(KEY)[0]
        order = sorted(q_totals, key=lambda c: -abs(q_totals[c]))
        i, name = next((i, c) for i, c in enumerate(order) if c.startswith("a0.h"))
        assert i > 0
        await pilot.press(*["down"] * i)
        await pilot.pause()
        assert view.status.endswith(f"{name}, query side · enter: go to L0.H{name[4:]}")
        await pilot.press("enter")
        await pilot.pause()
        assert app.posted == [WhyHeadSelected((0, int(name[4:])), "query")]


async def test_states_say_what_is_there(row: QKAttribution, model_tokens: tuple[Any, list[int]]) -> None:
    model, tokens = model_tokens
    app = WhyApp()
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one(WhyView)
        await pilot.pause()
        assert view.state == "idle" and IDLE in screen_words(app)
        view.show_computing(1, 2, QUERY)
        await pilot.pause()
        assert f"computing why L1.H2 attends from q={QUERY}… (one pass to layer 1)" in screen_words(app)
        view.show_error("[bold]key 30[/] is after query 25")  # data: never markup
        await pilot.pause()
        screen = screen_words(app)
        assert view.state == "error" and "error: [bold]key 30[/] is after query 25" in screen
        view.show_out_of_scope("its scores are soft-capped (±50 tanh): not a sum of terms")
        await pilot.pause()
        screen = screen_words(app)
        assert view.state == "unsupported" and "not decomposed" in screen
        assert "soft-capped (±50 tanh)" in screen and "score +" not in screen
        # layer 0: only the embeddings and the biases, said so
        first = qk_attribution(model.weights, tokens, 0, 1, 5)
        view.show(first, key=3, tokens=["[link=x]", "[/]", "a\nb", "d", "e", "f"])
        await drawn(pilot, app)
        screen = screen_words(app)
        assert "why L0.H1 attends q=5 → k=3" in screen
        assert "layer 0 reads the embeddings only: embed, pos, bias" in screen
        assert "k=3 'd'" in screen
        view.set_key(1)
        await drawn(pilot, app)
        assert "k=1 '[/]'" in screen_words(app)
        view.set_key(0)
        await drawn(pilot, app)
        assert "k=0 '[link=x]'" in screen_words(app)
        # a non-finite activation: flagged
        terms = np.array(row.terms)
        terms[0, 1, row.column(KEY)] = np.nan
        view.show(dataclasses.replace(row, terms=terms, nonfinite=True), key=KEY)
        await drawn(pilot, app)
        screen = screen_words(app)
        assert "non-finite activations" in screen and "nan" in screen


async def test_256_colours_write_no_truecolor_codes(row: QKAttribution,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(textual.constants, "COLOR_SYSTEM", "256")  # the app's console
    app = WhyApp()  # the mode detected from the console, as the explorer does
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.console.color_system == "256" and app.color_mode == "256"
        view = app.query_one(WhyView)
        view.show(row, key=KEY)
        await drawn(pilot, app)
        for keys in ((), ("right",), ("left", "left")):
            await pilot.press(*keys)
            await drawn(pilot, app)
            update = app.screen._compositor.render_update(full=True)
            out = update.render_segments(app.console)
            assert "38;5;" in out and not TRUECOLOR.search(out), keys
            assert "█" in ANSI.sub("", out)


def test_every_key_has_an_id_and_a_tooltip() -> None:
    """Users remap keys by id (tui/base/keymap.py); the help screen shows the tooltips."""
    ids = [b.id for b in WhyView.BINDINGS]
    assert ids == ["why-prev-key", "why-next-key", "why-first-key", "why-last-key"]
    assert all(b.tooltip and b.tooltip.startswith("Why view:") for b in WhyView.BINDINGS)


async def test_the_exact_column_fills_when_the_removals_arrive(row: QKAttribution,
                                                               model_tokens: tuple[Any, list[int]]) -> None:
    """"exact" beside each total: "…" while the explorer's confirm request runs, then the drop
    with the norm's scale recomputed; the status line of a totals row gives both drops. A
    result for another row is ignored. At 80×24 the column is on screen."""
    from headscope.tui.widgets.why import TOTALS_TOP

    model, tokens = model_tokens
    confirmed = qk_attribution(model.weights, tokens, *INDUCTION_HEAD, QUERY, confirm=TOTALS_TOP)
    other = qk_attribution(model.weights, tokens, *INDUCTION_HEAD, QUERY - 1, confirm=1)
    app = WhyApp()
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one(WhyView)
        view.show(row, key=KEY)
        view.expect_exact()
        await drawn(pilot, app)
        lines = screen_lines(app)
        assert "exact" in next(line for line in lines if "key side" in line and "total" in line)
        assert totals_rows(lines, "key")[0].split()[:3] == [PREVIOUS, num(row.totals(KEY)[1][PREVIOUS]), "…"]
        view.show_exact(other)  # another query's row: not this one's column
        assert view.exact is None and view.exact_pending
        view.show_exact(confirmed)
        await pilot.pause()
        exact = confirmed.exact(KEY)["key"][PREVIOUS]
        key_side = totals_rows(screen_lines(app), "key")
        assert key_side[0].split()[:3] == [PREVIOUS, num(row.totals(KEY)[1][PREVIOUS]), num(exact["recomputed"])]
        app.query_one("#why-key-totals", DataTable).focus()
        await pilot.pause()
        assert (f"{PREVIOUS}, key side · removed exactly: {num(exact['frozen'])} scale frozen (the total), "
                f"{num(exact['recomputed'])} recomputed · enter: go to L0.H1") in view.status
        assert num(exact["frozen"]) == num(row.totals(KEY)[1][PREVIOUS])
        app.query_one("#why-terms", DataTable).focus()  # (its status line says "key side ... total")
        await pilot.press("right")  # the removals cover each side's top sources at every key
        await pilot.pause()
        _, key_totals = row.totals(KEY + 1)
        first = max(key_totals, key=lambda c: abs(key_totals[c]))
        assert totals_rows(screen_lines(app), "key")[0].split()[2] == \
            num(confirmed.exact(KEY + 1)["key"][first]["recomputed"])


async def test_the_selected_totals_row_keeps_its_bar_colour_readable_on_every_theme(
        row: QKAttribution) -> None:
    """The totals table's cursor row drew its bar in the cursor's text colour (grey, issue 39
    §3): it keeps the colour map's hue, readable (AA, 4.5:1) on the cursor's background, on
    every theme, in truecolor and in the 256-colour downgrade."""
    from textual.color import Color

    from headscope.themes import COLORMAPS, THEMES
    from headscope.tui.base.contrast import contrast, in_256
    from headscope.tui.widgets.chart import _theme_variables
    from tests.tui.base.test_contrast import screen_segments

    app = WhyApp(mode="truecolor")
    async with app.run_test(size=(100, 30)) as pilot:
        for theme in THEMES:
            app.register_theme(theme)
        for theme in THEMES:
            app.theme = theme.name
            app.colormap_name = theme.variables["heatmap"]
            view = app.query_one(WhyView)
            view.show(row, key=KEY)  # the totals at once (the grid's figure is a worker's)
            app.query_one("#why-query-totals", DataTable).focus()
            await pilot.pause()
            variables = _theme_variables(app.current_theme)
            cursor_bg = Color.parse(variables["block-cursor-background"]).rgb
            on_cursor = [seg for seg in screen_segments(app) if seg.style and seg.style.bgcolor
                         and seg.style.bgcolor.get_truecolor() == cursor_bg]
            bars = [seg.style for seg in on_cursor if "█" in seg.text]
            # the cursor's text colour: the row's name and numbers
            grey = next(tuple(seg.style.color.get_truecolor()) for seg in on_cursor
                        if any(ch.isdigit() for ch in seg.text))
            assert bars, theme.name
            neg, _, pos = COLORMAPS[theme.variables["heatmap"]]
            for style in bars:
                fg = tuple(style.color.get_truecolor())
                assert fg != grey, theme.name
                # the map's hue: nearer one of its ends than the cursor's text colour is
                assert min(sum((a - b) ** 2 for a, b in zip(fg, end, strict=True)) for end in (neg, pos)) \
                    < sum((a - b) ** 2 for a, b in zip(fg, grey, strict=True)), (theme.name, fg)
                for shown, bg in ((fg, cursor_bg), (in_256(fg), in_256(cursor_bg))):
                    assert contrast(shown, bg) >= 4.5, (theme.name, fg, shown)
