"""`headscope open` (and a bare path): the options reach the app; malformed ones are one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.tui import test_app
from tests.tui.widgets.test_compare import MODEL

_quiet_env = test_app._quiet_env  # test_app's autouse fixture


def test_cli_head_option_reaches_the_app_and_rejects_malformed_values(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import headscope.tui.app as tui_app
    from headscope.tui.cli.main import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(tui_app, "run_app", lambda path, **kw: seen.update(kw))
    assert main(["sample_models/attn-only-2l", "--head", "1.2"]) == 0
    assert seen["head"] == (1, 2)
    for bad in ("1", "a.b", "1.2.3", "-1.0"):
        with pytest.raises(SystemExit) as exit_info:
            main(["sample_models/attn-only-2l", "--head", bad])
        assert exit_info.value.code == 2 and "--head" in capsys.readouterr().err


def test_cli_passes_compare_through_to_run_app(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    import headscope.tui.app as tui_app
    from headscope.tui.cli.main import main

    seen: dict[str, object] = {}
    monkeypatch.setattr(tui_app, "run_app", lambda path, **kw: seen.update(path=path, **kw))
    shutil.copytree(MODEL, tmp_path / "b")  # B must exist (and share A's layout) to open
    assert main([str(MODEL), "--compare", str(tmp_path / "b")]) == 0
    assert seen["path"] == MODEL and seen["compare"] == str(tmp_path / "b")
    assert "match_heads" not in seen
    assert main([str(MODEL), "--compare", str(tmp_path / "b"), "--match-heads"]) == 0
    assert seen["match_heads"] is True


def test_cli_match_heads_without_compare_is_a_one_line_error(capsys) -> None:
    from headscope.tui.cli.main import main

    assert main([str(MODEL), "--match-heads"]) == 1
    err = capsys.readouterr().err
    assert "--match-heads needs --compare" in err and err.count("\n") == 1
