"""tui.settings: config file, defaults and environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from headscope.engine.core.errors import ConfigError
from headscope.tui.base.settings import Settings, config_path, load_settings


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path), **extra}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "headscope" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_without_a_file(tmp_path: Path) -> None:
    assert load_settings(env_for(tmp_path)) == Settings()


def test_file_values_and_env_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, 'theme = "headscope-light"\ncache_mb = 64\ntokens = ["Mary"]\n'
                           '[keymap]\n"next-head" = "n"\n')
    s = load_settings(env_for(tmp_path))
    assert (s.theme, s.cache_mb, s.tokens, s.keymap, s.source) == (
        "headscope-light", 64, ("Mary",), {"next-head": "n"}, str(path))
    s = load_settings(env_for(tmp_path, HEADSCOPE_THEME="headscope-contrast", HEADSCOPE_CACHE_MB="8"))
    assert (s.theme, s.cache_mb) == ("headscope-contrast", 8)


def test_explicit_config_path(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('colormap = "colorblind"\n')
    env = {"HEADSCOPE_CONFIG": str(other)}
    assert config_path(env) == other
    assert load_settings(env).colormap == "colorblind"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("theme = ", "not valid TOML"),
        ("colour = 1", "unknown setting"),
        ('colormap = "rainbow"', "colormap must be one of"),
        ("cache_mb = -1", "must be positive"),
        ('cache_mb = "lots"', "whole number"),
        ("tokens = 3", "list of strings"),
        ("keymap = 3", "keymap must be"),
    ],
)
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=fragment) as info:
        load_settings(env_for(tmp_path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_cluster_setting_is_a_scheduler_address(tmp_path: Path) -> None:
    write(tmp_path, 'cluster = "tcp://node1:8786"\n')
    assert load_settings(env_for(tmp_path)).cluster == "tcp://node1:8786"
    path = write(tmp_path, "cluster = 8786\n")
    with pytest.raises(ConfigError) as err:
        load_settings(env_for(tmp_path))
    assert str(path) in str(err.value) and "cluster" in str(err.value)
