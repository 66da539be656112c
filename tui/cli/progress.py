"""Progress bars of the command line: on stderr, only when it is a terminal.

A command that can take more than a second wraps its work in ``progress_bar``: a Rich
progress bar with the elapsed time and an ETA, drawn on stderr and erased when done
(``transient``). Nothing is drawn when stderr is not a terminal or with ``--quiet``; stdout
(``--json``, tables, TSV) is never touched: the bar neither writes to it nor redirects it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

Progress = Callable[[float], None]


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
    description: str, *, quiet: bool = False, determinate: bool = True, console: Any = None
) -> Iterator[Progress | None]:
    """Yield ``progress(fraction)`` driving a bar on stderr, or None when there is no bar;
    ``progress.note(text)`` shows ``text`` after the description (partial results).

    ``determinate=False``: work without a fraction (one forward pass, one circuit block) shows
    a pulsing bar and the elapsed time. ``console``: a Rich console to draw on (tests force a
    terminal with it); by default stderr's, when it is a terminal.
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
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    console = console or Console(stderr=True)
    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn()]
    if determinate:
        columns += [TaskProgressColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    else:
        columns += [TimeElapsedColumn()]
    bar = RichProgress(
        *columns, console=console, transient=True, redirect_stdout=False, redirect_stderr=False
    )
    with bar:
        task = bar.add_task(description, total=1.0 if determinate else None)

        def update(fraction: float) -> None:
            bar.update(task, completed=min(1.0, max(0.0, float(fraction))))

        def note(text: str) -> None:
            """What is known so far, after the description (e.g. the best edges yet)."""
            bar.update(task, description=f"{description} · {text}" if text else description)

        update.note = note  # type: ignore[attr-defined]
        yield update
