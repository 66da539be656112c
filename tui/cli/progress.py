"""Progress bars of the command line: on stderr, only when it is a terminal.

A command that can take more than a second wraps its work in ``progress_bar``: a Rich
progress bar with the elapsed time and an ETA, drawn on stderr and erased when done
(``transient``). Nothing is drawn when stderr is not a terminal or with ``--quiet``; stdout
(``--json``, tables, TSV) is never touched: the bar neither writes to it nor redirects it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from headscope.engine.core.eta import Eta
from headscope.engine.core.progress import Progress


def eta_text(seconds: float | None) -> str:
    """``0:01:05`` (``-:--:--`` while there is no estimate yet)."""
    if seconds is None:
        return "-:--:--"
    whole = int(seconds + 0.5)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def wants_progress(quiet: bool, stream: Any = None) -> bool:
    """Draw a bar: not ``--quiet`` and stderr is a terminal."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced stream
        return False


@contextlib.contextmanager
def progress_bar(
    description: str, *, quiet: bool = False, determinate: bool = True, console: Any = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Progress | None]:
    """Yield ``progress(fraction)`` driving a bar on stderr, or None when there is no bar;
    ``progress.note(text)`` shows ``text`` after the description (partial results).

    ``determinate=False``: work without a fraction (one forward pass, one circuit block) shows
    a pulsing bar and the elapsed time. ``console``: a Rich console to draw on (tests force a
    terminal with it); by default stderr's, when it is a terminal. ``clock``: the ETA's
    clock (tests pass a fake one).

    The ETA is ``engine.core.eta.Eta`` (time since the first report × work left / work
    done), recomputed at every refresh. Rich's own ``TimeRemainingColumn`` only changes when a
    report arrives, from the rate of the last few reports: a sweep whose cheap first part
    (the weight algebra, milliseconds) is followed by a silent one (torch's import and the
    first forward pass, seconds) sat at ``35% ETA 0:00:02`` for seconds. Measured from the
    first report, the estimate grows while no report comes, instead of freezing.
    """
    if console is None and not wants_progress(quiet):
        yield None
        return
    if quiet:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress

    console = console or Console(stderr=True)
    eta = Eta(clock)
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn()]
    if determinate:
        columns += [TaskProgressColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                    eta_column(eta)]
    else:
        columns += [TimeElapsedColumn()]
    bar = RichProgress(
        *columns, console=console, transient=True, redirect_stdout=False, redirect_stderr=False
    )
    with bar:
        task = bar.add_task(description, total=1.0 if determinate else None)

        def update(fraction: float) -> None:
            fraction = min(1.0, max(0.0, float(fraction)))
            eta.update(fraction)
            bar.update(task, completed=fraction)

        def note(text: str) -> None:
            """What is known so far, after the description (e.g. the best edges yet)."""
            bar.update(task, description=f"{description} · {text}" if text else description)

        update.note = note  # type: ignore[attr-defined]
        update.eta = eta  # type: ignore[attr-defined]
        yield update


def eta_column(eta: Eta) -> Any:
    """A Rich column showing ``eta``'s seconds left, recomputed at each refresh."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class EtaColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(eta_text(eta.seconds_left()), style="progress.remaining")

    return EtaColumn()
