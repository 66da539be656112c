"""`headscope serve`: its port option, installed with the app."""

from __future__ import annotations

import pytest

from headscope.tui.cli.main import main
from tests.tui.cli.test_main import REPO


def test_serve_port_has_help_and_its_default(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--port PORT TCP port to listen on (default 8000)" in out


def test_serve_is_installed_with_the_app() -> None:
    """`make run` installs the main dependencies: serve must not need an extra."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("textual-serve") for d in project["dependencies"])
    assert "serve" not in project.get("optional-dependencies", {})
