"""The headscope terminal explorer: the app around the explorer screen.

The app holds the settings, themes, colour maps and keymap, opens and closes the engine, and
turns errors into notifications. What is on screen (the head tree, the tabs and their loading)
is the explorer's (tui/screens/explorer.py). The first frame comes before it: the opening screen
(tui/screens/opening.py), drawn with nothing but Textual imported; the explorer is imported after that
frame and pushed over it (docs/internals.md, "First frame").

The app renders what ``engine.service.engine.Engine`` computes and never computes on the UI
thread: every engine call is awaited in an async worker (the engine runs on its own
threads), plots are built in worker threads by ``Chart``. The engine comes from a factory
(``engine_factory(path, raw)``) so tests inject a fake one; whatever the factory returns is
used through ``tui.base.protocols.ExplorerEngine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events
from textual.app import App
from textual.binding import BindingType
from textual.notifications import SeverityLevel

from headscope.engine.core.errors import HeadscopeError
from headscope.sample_models import bundled_model
from headscope.themes import (
    ALIASES,
    COLORMAPS,
    DEFAULT_THEME,
    STYLESHEET,
    THEME_NAMES,
    THEMES,
    colormap_for,
)
from headscope.tui.base.colormode import detect_color_mode
from headscope.tui.base.datatext import printable
from headscope.tui.base.keymap import APP_BINDINGS
from headscope.tui.base.messages import ModelFailed, ModelReady
from headscope.tui.base.settings import Settings, default_export_dir, load_settings
from headscope.tui.screens.opening import READY_ACTIONS, OpeningScreen
from headscope.tui.screens.timeline import TimelineMode
from headscope.tui.session.compare import CompareMode

# First frame (docs/internals.md): this module imports Textual and small modules only. The
# explorer (numpy, plotext, the engine's results) is imported after the first frame is painted.
if TYPE_CHECKING:
    from textual.command import Provider
    from textual.screen import Screen

    from headscope.tui.base.protocols import ExplorerEngine
    from headscope.tui.screens.explorer import ExplorerScreen

__all__ = ["HeadscopeApp", "bundled_model", "run_app"]


def _commands() -> type[Provider]:
    """The command palette's headscope commands (imported when the palette first opens)."""
    from headscope.tui.screens.palette import HeadscopeCommands

    return HeadscopeCommands

Head = tuple[int, int]
EngineFactory = Callable[[str, bool], "ExplorerEngine"]
# Quit feels instant: the engines are told to stop at once (aclose's first step), and the
# wait for a job still running is short; their threads are daemons and end with the process.
QUIT_WAIT = 0.25



async def _in_daemon_thread(work: Callable[[], None]) -> None:
    """``work()`` on a daemon thread: a quit while it runs is not kept waiting for it (the
    default executor's threads are joined when ``asyncio.run`` ends)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            work()
        except BaseException as err:  # re-raised on the loop, in the awaiting worker
            error = err
        with contextlib.suppress(RuntimeError):  # the loop has closed: the app is gone
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="headscope-explorer-import", daemon=True).start()
    await done


def default_engine_factory(path: str, raw: bool, cache_mb: int = 256,
                           cache_disk_mb: int = 0) -> ExplorerEngine:
    from headscope.engine.api.store import default_store
    from headscope.engine.service.engine import Engine

    store = default_store(cache_disk_mb) if cache_disk_mb > 0 else None
    return Engine(path, raw=raw, cache_bytes=cache_mb << 20, store=store)


class HeadscopeApp(App[None]):
    TITLE = "headscope"
    CSS_PATH: ClassVar[list[str | Path]] = [STYLESHEET, Path(__file__).with_name("headscope.tcss")]
    BINDINGS: ClassVar[list[BindingType]] = list(APP_BINDINGS)
    COMMANDS = App.COMMANDS | {_commands}

    def __init__(self, path: str | os.PathLike[str] | None = None, *, raw: bool = False,
                 theme: str | None = None, engine_factory: EngineFactory | None = None,
                 output_dir: str | os.PathLike[str] | None = None,
                 keymap: dict[str, str] | None = None, debounce: float = 0.1,
                 sweep: bool = True, prompt: str = "",
                 compare: str | os.PathLike[str] | None = None, match_heads: bool = False,
                 head: Head | None = None, settings: Settings | None = None,
                 timeline: TimelineMode | None = None, colors: str | None = None) -> None:
        super().__init__()
        # Timeline mode: a series of checkpoints, opened on its last step (tui/screens/timeline.py).
        self.timeline = timeline or TimelineMode()
        if self.timeline.enabled:
            path = self.timeline.path
        self.settings_error: str | None = None
        if settings is None:
            try:
                settings = load_settings()
            except HeadscopeError as err:  # a bad config file must not stop the explorer
                settings, self.settings_error = Settings(), str(err)
        self.settings = settings
        self.path = str(path) if path is not None else str(bundled_model())
        self.raw = raw
        # The real engine starts importing torch on a thread as soon as it exists; that
        # import competes for the GIL, so it is created after the first frame is painted,
        # and the first frame's tree comes from the header (read_structure, no torch).
        self._deferred_engine = engine_factory is None
        self.engine_factory: EngineFactory = engine_factory or (
            lambda p, r: default_engine_factory(p, r, settings.cache_mb, settings.cache_disk_mb))
        theme = theme or settings.theme
        self._initial_theme = ALIASES.get(theme or "", theme) or DEFAULT_THEME
        # Themes are set before the first mount: set in on_mount, the switch from Textual's
        # default theme re-applied the whole stylesheet to every widget (~50 ms of the first
        # frame).
        for t in THEMES:
            self.register_theme(t)
        self.theme = self._initial_theme if self._initial_theme in self.available_themes \
            else DEFAULT_THEME
        self._output_dir = Path(output_dir) if output_dir is not None else None
        self._keymap_arg = {**settings.keymap, **(keymap or {})}
        self.keymap_in_use: dict[str, str] = {}
        # settings.colormap "colorblind": the blue/orange map whatever the theme.
        self.colormap_override: str | None = None
        self._colorblind = settings.colormap == "colorblind"
        # --colors / settings.colors: truecolor | 256 | 16 | none; else detected (color_mode).
        self._colors = colors or settings.colors or None
        self.errors: list[str] = []
        # The engine's lifecycle: opened (deferred past the first frame), ready, closed on q.
        self.engine: ExplorerEngine | None = None
        self.open_error: str | None = None
        self.structure: dict[str, Any] = {"path": self.path}
        self.model_ready = asyncio.Event()
        self.ready_failed = False
        # Compare mode: model B, opened by the same factory; Engine.compare diffs A → B.
        self.compare = CompareMode(str(compare) if compare is not None else None, match_heads,
                                   self.report)
        # The explorer screen is made when first needed: after the first frame (the real
        # engine) or as the first screen (an injected engine factory: tests, bench.stall).
        self._explorer_options: dict[str, Any] = {
            "debounce": debounce, "sweep": sweep, "prompt": prompt, "head": head,
            "tokens_text": " ".join(settings.tokens)}
        self._explorer: ExplorerScreen | None = None
        self.explorer_up = False  # the explorer is mounted (over the opening screen, if any)

    @property
    def explorer(self) -> ExplorerScreen:
        """The explorer screen (imported and made on first use, not necessarily mounted)."""
        if self._explorer is None:
            from headscope.tui.screens.explorer import ExplorerScreen

            self._explorer = ExplorerScreen(**self._explorer_options)
        return self._explorer

    @property
    def default_screen(self) -> Screen:
        """The screen ``app.query``/``app.query_one`` search: the explorer once it is up (it
        sits over the opening screen, which Textual would otherwise keep searching)."""
        if self.explorer_up and self._explorer is not None:
            return self._explorer
        return super().default_screen

    def get_default_screen(self) -> Screen:
        """The first screen. With the real engine: the opening screen (tui/screens/opening.py), drawn
        with nothing but Textual imported; the explorer is pushed over it once imported and
        the model's header read (its tree comes from the header). With an injected engine the
        explorer is the first screen, as the fake engines' structure is at hand."""
        if self._deferred_engine:
            return OpeningScreen(self.path, raw=self.raw, compare=self.compare.path)
        self._open_engine()
        return self.explorer

    async def _load_explorer(self) -> None:
        """After the first frame: import the explorer and read the header off the UI thread,
        then put the explorer over the opening screen."""
        await _in_daemon_thread(self._prepare_explorer)
        # The help or the command palette opened over the opening screen stays on top until
        # it is closed (the explorer would hide it).
        while not self._exit and self.is_running and not isinstance(self.screen, OpeningScreen):
            await asyncio.sleep(0.05)
        if self._exit or not self.is_running:  # quit while it loaded
            return
        # Pushed over the opening screen, which stays below it, suspended (Textual cannot
        # switch away from the first screen).
        await self.push_screen(self.explorer)

    def _prepare_explorer(self) -> None:
        import headscope.tui.screens.explorer  # noqa: F401  (numpy, plotext, the views: ~0.3 s)

        self._read_structure()

    # -- engine ---------------------------------------------------------------------------
    def _open_engine(self) -> None:
        try:
            self.engine = self.engine_factory(self.path, self.raw)
            self.structure = dict(self.engine.structure)
        except HeadscopeError as err:
            self.engine, self.open_error = None, str(err)
        except Exception as err:  # an engine bug must not take the explorer down
            self.engine, self.open_error = None, f"{self.path}: cannot open ({err!r})"
        if self.engine is not None:
            self.compare.open(self.engine_factory, self.raw)

    def _read_structure(self) -> None:
        from headscope.engine.api.model import read_structure  # header + config only: no torch

        try:
            self.structure = dict(read_structure(self.path))
        except HeadscopeError as err:
            self.open_error = str(err)
        except Exception as err:
            self.open_error = f"{self.path}: cannot read ({err!r})"

    @property
    def opening(self) -> bool:
        """The engine exists and is still opening the model."""
        return not self.model_ready.is_set() and self.engine is not None and not self.ready_failed

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, lambda _theme: self._restyle())
        if isinstance(self.screen, OpeningScreen):  # the explorer follows the first frame
            self.screen.when_drawn(lambda: self.run_worker(self._load_explorer,
                                                           group="startup"))
        if self.settings_error:
            self.notify(self.settings_error, severity="warning", timeout=8)
        self.keymap_in_use = dict(self._keymap_arg)
        if self.keymap_in_use:
            self.set_keymap(self.keymap_in_use)

    def explorer_mounted(self) -> None:
        """The explorer is on screen: open the engine (after the explorer's frame is painted)."""
        self.explorer_up = True
        self.refresh_bindings()
        self.timeline.update_status(self)
        if self._deferred_engine and self.open_error is None:
            self.call_after_refresh(lambda: self.set_timer(0.02, self._open_deferred))
            return
        self._after_open()

    def _open_deferred(self) -> None:
        # Quit (q sets _exit) or torn down (a closed terminal, a test's teardown: only
        # is_running says so) before the engine was created: open nothing, leak no threads.
        if self._exit or not self.is_running:
            return
        self._open_engine()
        self._after_open()

    def _after_open(self) -> None:
        if self.engine is None:
            self.report(self.open_error or "cannot open the model")
            self.explorer.post_message(ModelFailed(self.open_error or "",
                                                   "no model: " + (self.open_error or "")))
            return
        self.run_worker(partial(self._startup, self.engine), group="startup", exit_on_error=False)

    async def _startup(self, engine: ExplorerEngine) -> None:
        try:
            await engine.ready()
        except HeadscopeError as err:
            self.ready_failed = True
            self.report(str(err))
            self.explorer.post_message(ModelFailed(str(err), str(err)))
            return
        self.structure = dict(getattr(engine, "structure", self.structure))
        self.model_ready.set()
        for warning in getattr(engine, "warnings", ()):  # e.g. an unusable tokenizer
            self.notify(warning, severity="warning", timeout=8)
        self.explorer.post_message(ModelReady())
        self.timeline.start(self)

    def on_resize(self, event: events.Resize) -> None:
        if self._explorer is not None:
            self._explorer.layout_for(event.size.width)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Until the explorer is up, its keys are shown greyed out (tui/screens/opening.py)."""
        if not self.explorer_up and self._deferred_engine and action not in READY_ACTIONS:
            return None
        return True

    def _restyle(self) -> None:
        if self.explorer_up:
            self.explorer.restyle()

    def action_timeline_step(self, delta: int) -> None:
        """Timeline mode: show the previous or next step of the series."""
        self.timeline.scrub(self, delta)

    # -- themes and colours -----------------------------------------------------------------
    @property
    def colormap_name(self) -> str:
        if self.colormap_override:
            return self.colormap_override
        if self._colorblind:
            return "blue-orange" if self.current_theme.dark else "blue-orange-light"
        return colormap_for(self.theme)

    @property
    def color_mode(self) -> str:
        """How heatmaps are drawn: ``truecolor``, ``256``, ``16`` or ``none`` (tui/base/colormode.py).

        Chosen with ``--colors``, else detected from the terminal (Rich's colour system and
        ``NO_COLOR``); a headless app (tests, SVG screenshots) draws in truecolor."""
        if self._colors:
            return self._colors
        if self.is_headless:
            return "truecolor"
        return detect_color_mode(self.console.color_system, os.environ)

    def action_cycle_theme(self) -> None:
        names = list(THEME_NAMES)
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme {self.theme}", timeout=1.5)

    def set_colormap(self, name: str | None) -> None:
        self.colormap_override = name
        self._restyle()

    def action_cycle_colormap(self) -> None:
        names = list(COLORMAPS)
        i = names.index(self.colormap_name) if self.colormap_name in names else -1
        self.set_colormap(names[(i + 1) % len(names)])
        self.notify(f"colour map {self.colormap_name}", timeout=1.5)

    # -- help, files ----------------------------------------------------------------------
    def action_help(self) -> None:
        from headscope.tui.screens.dialogs import HelpScreen

        self.push_screen(HelpScreen(self.keymap_in_use))

    def output_dir(self) -> Path:
        """Where screenshots and exports go: the directory chosen in the palette ("Set output
        directory…"), else the ``output_dir`` setting (config.toml or
        ``$HEADSCOPE_OUTPUT_DIR``), else ``default_export_dir()`` (``$XDG_DATA_HOME/headscope/
        exports``, not the current directory: after ``make run`` the git checkout); never next
        to the checkpoint (then the temporary directory's ``headscope/``). Every notification
        names it."""
        chosen = (self._output_dir or getattr(self.settings, "output_dir", "")
                  or os.environ.get("HEADSCOPE_OUTPUT_DIR") or default_export_dir())
        out = Path(chosen).expanduser().resolve()
        model = Path(self.path).expanduser().resolve()
        model_dir = model if model.is_dir() else model.parent
        if out == model_dir or model_dir in out.parents:
            out = Path(tempfile.gettempdir()) / "headscope"
        out.mkdir(parents=True, exist_ok=True)
        return out

    def action_choose_output_dir(self) -> None:
        from headscope.tui.screens.dialogs import InputScreen

        def chosen(text: str | None) -> None:
            if text:
                self._output_dir = Path(text)
                self.notify(f"output directory {self.output_dir()}")

        self.push_screen(InputScreen("Output directory for screenshots and exports",
                                     str(self.output_dir())), callback=chosen)

    def stem(self) -> str:
        """File name stem of a screenshot or export: model, tab, head (or the pop-up's
        view), time."""
        name = Path(self.path).name or "model"
        if not self.explorer_up:  # the opening screen
            return f"headscope_{name}_opening_{time.strftime('%Y%m%d-%H%M%S')}"
        # a pop-up over the explorer names what it shows (PathScreen: the edge)
        view = getattr(self.screen, "file_view", None)
        if not isinstance(view, str):
            focused = self.explorer.head
            head = f"_L{focused[0]}H{focused[1]}" if focused else ""
            view = f"{self.explorer.active_tab}{head}"
        return f"headscope_{name}_{view}_{time.strftime('%Y%m%d-%H%M%S')}"

    def action_screenshot_svg(self) -> None:
        from headscope.engine.core.errors import OutputError
        from headscope.engine.core.export import atomic_write_text
        from headscope.tui.session.export import saved_where

        try:
            out = atomic_write_text(self.output_dir() / f"{self.stem()}.svg",
                                    self.export_screenshot())
        except (OSError, OutputError) as err:
            self.report(f"cannot save screenshot: {err}")
            return
        self.notify(saved_where(out), title="screenshot saved")

    def export_screenshot(self, *, title: str | None = None, simplify: bool = False) -> str:
        """The screen as SVG, as Textual's ``export_screenshot`` makes it, on a console that
        renders no colour codes.

        Textual's prints the screen through a truecolor Rich console. Rich caches the SGR
        codes a ``Style`` renders to on the style object itself (``Style._ansi``), whatever
        the colour system, and Textual's own output reuses that cache: after one screenshot
        every style on screen wrote ``38;2;…`` / ``48;2;…`` to a 256-colour terminal. A
        console without a colour system records the same segments (the SVG is identical)
        and renders no codes, so nothing is cached."""
        import io

        from rich.console import Console

        width, height = self.size
        console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                          color_system=None, record=True, legacy_windows=False, safe_box=False)
        # Textual's own export_screenshot reads the screen the same way (no public API)
        update = self.screen._compositor.render_update(
            full=True, screen_stack=self._background_screens, simplify=simplify)
        console.print(update)
        return console.export_svg(title=title or self.title)

    # -- notifications, quitting ------------------------------------------------------------
    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Notifications carry data (paths, token strings, error texts): never markup, and no
        control character reaches the terminal; line breaks stay (a saved file's name and its
        folder on lines of their own)."""
        message = "\n".join(printable(line) for line in message.split("\n"))
        super().notify(message, title=printable(title), severity=severity,
                       timeout=timeout, markup=markup)

    def action_help_quit(self) -> None:
        """``ctrl+c`` (copy in an input, not quit): say which keys quit. Textual's own note is
        markup (``Press [b]ctrl+q[/b] …``), which ``notify`` above shows as text."""
        keys = [self.get_key_display(active.binding) for active in self.active_bindings.values()
                if active.binding.action in ("quit", "app.quit")]
        if keys:
            self.notify(f"Press {' or '.join(dict.fromkeys(keys))} to quit the app",
                        title="Do you want to quit?")

    def report(self, message: str) -> None:
        """Engine errors become notifications; the app keeps running."""
        self.errors.append(message)
        self.notify(message, severity="error", timeout=8)

    async def action_quit(self) -> None:
        self.exit()  # the engines are closed as the app unmounts (on_unmount)

    async def on_unmount(self) -> None:
        """However the app ends (``q``, a closed terminal or websocket, ``run_test`` left, an
        error), its engines stop: their worker threads end and their models are let go, which
        matters where the process lives on (``run_app`` in a notebook, a test session)."""
        for engine in (self.engine, self.compare.engine_b):
            if engine is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(engine.aclose(), timeout=QUIT_WAIT)


def run_app(path: str | os.PathLike[str] | None = None, *, raw: bool = False,
            theme: str | None = None, compare: str | os.PathLike[str] | None = None,
            **options: Any) -> None:
    """Open ``path`` (default: the bundled attn-only-2l) in the explorer; blocks until quit.

    ``compare``: a second checkpoint B of the same architecture, explored alongside (tui/session/compare.py);
    ``match_heads=True`` (in ``options``) pairs B's heads with A's by circuit similarity.
    """
    with screen_off_fd2():
        HeadscopeApp(path, raw=raw, theme=theme, compare=compare, **options).run()


@contextlib.contextmanager
def screen_off_fd2() -> Iterator[None]:
    """Textual draws the screen on ``sys.__stderr__``, i.e. on fd 2, where native libraries
    write too: the text of a Rust panic in ``tokenizers`` (issue #29) landed on the screen.
    While the app runs, it draws on a duplicate of the terminal instead and fd 2 points at
    ``/dev/null``; both are restored afterwards (errors after the app are printed as ever).
    Nothing changes when stderr is not a terminal (tests, pipes)."""
    import sys

    try:
        sys.stderr.flush()
        if not os.isatty(2):
            yield
            return
        screen_fd = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        yield
        return
    saved = sys.__stderr__
    screen = open(screen_fd, "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    original = os.dup(2)
    try:
        sys.__stderr__ = screen
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(original, 2)
        sys.__stderr__ = saved
        with contextlib.suppress(OSError, ValueError):
            screen.close()  # flushes; closes screen_fd
        for fd in (original, null):
            with contextlib.suppress(OSError):
                os.close(fd)
