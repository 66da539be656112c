"""The explorer, second round (under Textual's Pilot, on the real Engine): data from a
checkpoint is never markup and no control character reaches the terminal (token strings in
the heatmaps and tables, the model's path in the status bar and in notifications); settings
that used to crash the explorer before its first frame are a warning, and it starts with
the defaults.
"""

from __future__ import annotations

import os
import pathlib
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from headscope.tui.app import HeadscopeApp
from headscope.tui.base.settings import Settings
from headscope.tui.screens.dialogs import HelpScreen
from headscope.tui.widgets.head_tree import HeadTree
from tests.conftest import notified
from tests.e2e.test_cli_hostile_args import hostile_vocab  # noqa: F401 (the pytest fixture)
from tests.e2e.test_explorer_hostile import (
    assert_no_crash,
    keys_still_work_then_quit,
    screen_text,
    settle,
)
from tests.tui.test_app import plain

SIZE = (120, 40)
MODEL = "sample_models/attn-only-2l"
PROMPT = "[/] [unused0] [link=https://example.com]x[/link] [/] [unused0]"


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(tmp_path / "out"))


def _no_terminal_controls(app: HeadscopeApp) -> None:
    """Nothing drawn carries a raw control character or a hyperlink."""
    for strip in app.screen._compositor.render_strips():
        for segment in strip:
            assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in segment.text), segment
            assert segment.style is None or not segment.style.link, segment


async def test_hostile_tokens_and_paths_render_literally(hostile_vocab: Path) -> None:  # noqa: F811
    app = HeadscopeApp(hostile_vocab, settings=Settings(), sweep=False, debounce=0.01, prompt=PROMPT)
    async with app.run_test(size=SIZE) as pilot:
        # Heatmap ticks (the first ids are the hostile tokens; every other one is drawn).
        await settle(pilot, app, lambda: "a⇥b" in screen_text(app))
        text = screen_text(app)
        assert "ckpt[v2]" in text  # the status bar names the directory as it is
        assert "[unused…" in text and "[bold·r…" in text and "�evil" in text
        _no_terminal_controls(app)
        await pilot.press("4")
        await settle(pilot, app, lambda: "prompt" in app.explorer.results)
        assert list(app.explorer.results["prompt"].tokens) == PROMPT.split()
        text = screen_text(app)
        for token in ("[/]", "[unused0]", "[link="):
            assert token in text, token
        _no_terminal_controls(app)
        await pilot.press("2")
        await settle(pilot, app, lambda: "top_outputs" in app.explorer.results.get("ov", {}))
        _no_terminal_controls(app)
        assert app.errors == []
        app.explorer.query_one(HeadTree).focus()
        await keys_still_work_then_quit(pilot, app, tabs=False)


async def test_notifications_are_not_markup(tmp_path: Path) -> None:
    broken = tmp_path / "broken[red]" / "ckpt[/]"
    broken.mkdir(parents=True)
    app = HeadscopeApp(broken, settings=Settings(), sweep=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: bool(app.errors))
        assert str(broken) in app.errors[0]
        await pilot.pause(0.1)
        assert all(not n.markup for n in notified(app))
        assert "broken[red]/ckpt[/]" in screen_text(app).replace("\n", "")
        assert_no_crash(app)


# --- settings that used to stop the explorer before its first frame -------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _toml(text: str) -> Any:
    return lambda path: path.write_text(text)


SETTINGS_CASES = {
    "cache_mb_inf": (_toml("cache_mb = inf\n"), "cache_mb must be a whole number"),
    "cache_mb_nan": (_toml("cache_mb = nan\n"), "cache_mb must be a whole number"),
    "cache_mb_fraction": (_toml("cache_mb = 1.5\n"), "cache_mb must be a whole number"),
    "cache_mb_huge": (_toml("cache_mb = 1_000_000_000_000\n"), "cache_mb must be at most"),
    "config_is_fifo": (_fifo, "FIFO"),
    "config_is_directory": (_directory, "a directory"),
    "config_is_dev_zero": (lambda path: path.symlink_to("/dev/zero"), "character device"),
}


async def _starts_with_a_warning(fragment: str) -> None:
    app = HeadscopeApp(MODEL, sweep=False)  # settings from the environment, as a user runs it
    assert app.settings == Settings()  # the defaults
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        assert app.settings_error is not None and fragment in app.settings_error
        warnings = [n.message for n in notified(app) if n.severity == "warning"]
        assert any(fragment in w for w in warnings), warnings
        assert "Layer 1" in screen_text(app)  # the first frame, and the model, are there
        await keys_still_work_then_quit(pilot, app, tabs=False)


@pytest.mark.timeout(60)  # a regression would block on the FIFO: fail, do not hang
@pytest.mark.parametrize("case", list(SETTINGS_CASES))
async def test_bad_settings_file_is_a_warning_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    make, fragment = SETTINGS_CASES[case]
    path = tmp_path / "config.toml"
    make(path)
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(path))
    await _starts_with_a_warning(fragment)


def _deny(monkeypatch: pytest.MonkeyPatch, inside: Path, *, reads_only: bool) -> None:
    """Tests run as root, and root passes permission bits: what the kernel would answer a
    user (EACCES) is simulated. ``reads_only``: the file can be stat'ed but not opened
    (mode 000); otherwise even stat fails below ``inside`` ($HOME without x)."""
    if reads_only:
        real_open = os.open

        def deny_open(path: Any, *args: Any, **kwargs: Any) -> int:
            if Path(os.fsdecode(path)).is_relative_to(inside):
                raise PermissionError(13, "Permission denied", os.fsdecode(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", deny_open)
        return
    real_stat = pathlib.Path.stat

    def deny_stat(self: pathlib.Path, *args: Any, **kwargs: Any) -> os.stat_result:
        if self.is_relative_to(inside) and self != inside:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "stat", deny_stat)


async def test_unreadable_config_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text('theme = "headscope-light"\n')
    if os.geteuid() != 0:
        path.chmod(0)
    else:
        _deny(monkeypatch, path, reads_only=True)
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(path))
    await _starts_with_a_warning("permission denied")


async def test_untraversable_home_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".config" / "headscope").mkdir(parents=True)
    monkeypatch.delenv("HEADSCOPE_CONFIG")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    if os.geteuid() != 0:
        home.chmod(0o600)
    else:
        _deny(monkeypatch, home, reads_only=False)
    try:
        await _starts_with_a_warning("permission denied")
    finally:
        home.chmod(0o700)


def test_no_home_at_all_is_no_settings_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from headscope.tui.base.settings import config_path, load_settings

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    assert config_path({}) is None
    assert load_settings({}) == Settings()


async def test_keymap_and_token_ids_from_the_user_are_not_markup_or_crashes() -> None:
    """A keymap value is shown in the help screen (as typed, never markup); ``#²`` in the
    token chooser is a word to look up, not an id that int() cannot parse."""
    app = HeadscopeApp(MODEL, settings=Settings(keymap={"next-head": "[/],n"}), sweep=False,
                       debounce=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        await pilot.press("question_mark")
        await settle(pilot, app, lambda: isinstance(app.screen, HelpScreen))
        # the help's key table (a section per tab: "Heads" may sit below the first screenful)
        assert "[/] / n" in plain(app.screen.query_one("#help-keys", Static))
        await pilot.press("escape")
        await pilot.press("slash")
        await pilot.press(*"#²", "enter")
        await settle(pilot, app, lambda: app.explorer.choices.tokens_text == "#²")
        assert_no_crash(app)  # int("²") used to kill the worker
        app.explorer.query_one(HeadTree).focus()
        await keys_still_work_then_quit(pilot, app, tabs=False)


@pytest.mark.timeout(60)
async def test_unusable_tokenizer_is_shown_when_the_model_opens(
    tmp_path: Path, gpt2_dir: tuple[Path, Any]
) -> None:
    import shutil

    d = tmp_path / "m"
    shutil.copytree(gpt2_dir[0], d)
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "tokenizer.json")
    app = HeadscopeApp(d, settings=Settings(), sweep=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.model_ready.is_set())
        await pilot.pause(0.1)
        warnings = [n.message for n in notified(app) if n.severity == "warning"]
        assert any("tokenizer.json" in w and "FIFO" in w and "token ids" in w for w in warnings), warnings
        assert_no_crash(app)


async def test_export_to_an_unusable_directory_is_a_notification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HEADSCOPE_OUTPUT_DIR", str(blocker / "out"))
    app = HeadscopeApp(MODEL, settings=Settings(), sweep=False, debounce=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: "qk" in app.explorer.results)
        await pilot.press("e")
        await settle(pilot, app, lambda: bool(app.errors))
        assert "cannot export" in app.errors[0] and str(blocker) in app.errors[0]
        assert_no_crash(app)
        await keys_still_work_then_quit(pilot, app, tabs=False)
