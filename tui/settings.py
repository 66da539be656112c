"""User settings: a small TOML file plus environment overrides.

Where: ``$HEADSCOPE_CONFIG`` if set, else ``$XDG_CONFIG_HOME/headscope/config.toml``
(``~/.config/headscope/config.toml``). Every key is optional::

    theme = "headscope-dark"        # headscope-dark | headscope-light | headscope-contrast
    colormap = "diverging"          # diverging | colorblind
    colors = "256"                  # truecolor | 256 | 16 | none (default: detected)
    cache_mb = 256                  # engine cache budget per open model
    tokens = ["Mary", "John"]       # default token set for the QK/OV heatmaps
    [keymap]                        # binding id = keys (see `?` in the explorer)
    "next-head" = "n"

Environment variables override the file: ``HEADSCOPE_THEME``, ``HEADSCOPE_COLORMAP``,
``HEADSCOPE_CACHE_MB``, ``HEADSCOPE_COLORS``. A malformed file is a one-line ConfigError naming it.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headscope.engine.errors import ConfigError

DEFAULT_THEME = "headscope-dark"
COLORMAPS = ("diverging", "colorblind")
COLOR_MODES = ("truecolor", "256", "16", "none")  # as tui/colormap.COLOR_MODES


@dataclass(frozen=True)
class Settings:
    theme: str = DEFAULT_THEME
    colormap: str = "diverging"
    colors: str = ""  # "" = detect from the terminal
    cache_mb: int = 256
    tokens: tuple[str, ...] = ()
    keymap: dict[str, str] = field(default_factory=dict)
    source: str | None = None  # the file these came from, if any


def config_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if env.get("HEADSCOPE_CONFIG"):
        return Path(env["HEADSCOPE_CONFIG"])
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "headscope" / "config.toml"


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Read the config file (absent is fine) and apply environment overrides."""
    env = dict(os.environ) if env is None else env
    path = config_path(env)
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(path, f"not valid TOML: {err}") from None
    if "HEADSCOPE_THEME" in env:
        data["theme"] = env["HEADSCOPE_THEME"]
    if "HEADSCOPE_COLORMAP" in env:
        data["colormap"] = env["HEADSCOPE_COLORMAP"]
    if env.get("HEADSCOPE_COLORS"):
        data["colors"] = env["HEADSCOPE_COLORS"]
    if "HEADSCOPE_CACHE_MB" in env:
        data["cache_mb"] = env["HEADSCOPE_CACHE_MB"]
    return _validate(data, path if path.is_file() else None)


def _validate(data: dict[str, Any], path: Path | None) -> Settings:
    where = path or "settings"
    unknown = set(data) - {"theme", "colormap", "colors", "cache_mb", "tokens", "keymap"}
    if unknown:
        raise ConfigError(where, f"unknown setting(s): {', '.join(sorted(unknown))}")
    theme = str(data.get("theme", DEFAULT_THEME))
    colormap = str(data.get("colormap", "diverging"))
    if colormap not in COLORMAPS:
        raise ConfigError(where, f"colormap must be one of {', '.join(COLORMAPS)}, not {colormap!r}")
    colors = str(data.get("colors", ""))
    if colors and colors not in COLOR_MODES:
        raise ConfigError(where, f"colors must be one of {', '.join(COLOR_MODES)}, not {colors!r}")
    try:
        cache_mb = int(data.get("cache_mb", 256))
    except (TypeError, ValueError):
        raise ConfigError(where, f"cache_mb must be a whole number, not {data['cache_mb']!r}") from None
    if cache_mb <= 0:
        raise ConfigError(where, f"cache_mb must be positive, not {cache_mb}")
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ConfigError(where, "tokens must be a list of strings")
    keymap = data.get("keymap", {})
    if not isinstance(keymap, dict) or not all(isinstance(v, str) for v in keymap.values()):
        raise ConfigError(where, 'keymap must be a table of binding-id = "keys"')
    return Settings(
        theme=theme,
        colormap=colormap,
        colors=colors,
        cache_mb=cache_mb,
        tokens=tuple(tokens),
        keymap=dict(keymap),
        source=str(path) if path else None,
    )
