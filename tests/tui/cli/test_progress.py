"""Progress bars of the CLI (tui/cli/progress.py): data shown as text on a terminal, an ETA that keeps moving."""

from __future__ import annotations

import io

from headscope.tui.cli.progress import progress_bar


def test_progress_bar_on_a_forced_terminal_shows_data_as_text() -> None:
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with progress_bar("heads [red]model[/red]", console=console) as progress:
        assert progress is not None
        progress(0.5)
        progress(1.0)
    drawn = buffer.getvalue()
    assert "[red]model[/red]" in drawn  # a name is never read as markup
    with progress_bar("x", quiet=True, console=console) as none:
        assert none is None


def test_the_eta_keeps_moving_between_reports() -> None:
    """`heads gpt2-mini --no-cache --ablation` sat at `35% ETA 0:00:02`: the weight sweep
    reported 35 % in 30 ms, then torch's import and the first forward pass reported nothing
    for seconds, and Rich's rate-of-the-last-reports estimate froze. The bar's ETA is
    measured from the first report and recomputed at each refresh: a silent stretch makes
    it grow, and the next report brings it down again."""
    from rich.console import Console

    from headscope.tui.cli.progress import eta_column

    now = [0.0]
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with progress_bar("heads", console=console, clock=lambda: now[0]) as progress:
        assert progress is not None
        column = eta_column(progress.eta)
        shown = lambda: column.render(None).plain  # noqa: E731
        assert shown() == "-:--:--"  # no report yet
        progress(0.0)
        assert shown() == "-:--:--"  # nothing done yet: no rate
        now[0] = 0.03
        progress(0.35)
        seen = [shown()]
        for t in (1.0, 2.0, 4.0):  # no report: the estimate grows with the silence
            now[0] = t
            seen.append(shown())
        assert seen == ["0:00:00", "0:00:02", "0:00:04", "0:00:07"]
        now[0] = 5.0
        progress(0.9)  # 0.9 done in 5 s: 0.1 left at that rate
        assert shown() == "0:00:01"
        progress(1.0)
        assert shown() == "0:00:00"
