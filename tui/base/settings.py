"""User settings: a small TOML file plus environment overrides.

Where: ``$HEADSCOPE_CONFIG`` if set, else ``$XDG_CONFIG_HOME/headscope/config.toml``
(``~/.config/headscope/config.toml``). Every key is optional::

    theme = "headscope-dark"        # headscope-dark | headscope-light | headscope-contrast
    colormap = "diverging"          # diverging | colorblind
    colors = "256"                  # truecolor | 256 | 16 | none (default: detected)
    cache_mb = 256                  # engine cache budget per open model
    cache_disk_mb = 512             # results store on disk (0: do not persist results)
    tokens = ["Mary", "John"]       # default token set for the QK/OV heatmaps
    cluster = "tcp://host:8786"     # Dask scheduler for the sweeping commands (headscope[cluster])
    output_dir = "~/headscope-out"  # where `s` and `e` write (default: default_export_dir())
    [keymap]                        # binding id = keys (see `?` in the explorer)
    "next-head" = "n"

Environment variables override the file: ``HEADSCOPE_THEME``, ``HEADSCOPE_COLORMAP``,
``HEADSCOPE_CACHE_MB``, ``HEADSCOPE_CACHE_DISK_MB``, ``HEADSCOPE_COLORS``, ``HEADSCOPE_OUTPUT_DIR``.
A malformed file is a one-line ConfigError naming it.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headscope.engine.core.errors import ConfigError
from headscope.engine.core.files import os_reason, read_text

DEFAULT_THEME = "headscope-dark"
COLORMAPS = ("diverging", "colorblind")
MAX_SETTINGS_BYTES = 1_000_000
MAX_CACHE_MB = 1 << 20  # 1 TiB
COLOR_MODES = ("truecolor", "256", "16", "none")  # the one list (tui/base/colormode.py re-exports it)


@dataclass(frozen=True)
class Settings:
    theme: str = DEFAULT_THEME
    colormap: str = "diverging"
    colors: str = ""  # "" = detect from the terminal
    cache_mb: int = 256
    cache_disk_mb: int = 512  # the on-disk results store (engine.api.store); 0 turns it off
    tokens: tuple[str, ...] = ()
    keymap: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None  # a Dask scheduler address (tui/cli/cluster.py)
    output_dir: str = ""  # screenshots and exports of the explorer ("" = default_export_dir())
    source: str | None = None  # the file these came from, if any


def config_path(env: dict[str, str] | None = None) -> Path | None:
    """Where the settings file is; ``None`` if there is no home to look in."""
    env = dict(os.environ) if env is None else env
    if env.get("HEADSCOPE_CONFIG"):
        return Path(env["HEADSCOPE_CONFIG"])
    base = env.get("XDG_CONFIG_HOME")
    if not base:
        try:
            base = str(Path.home() / ".config")
        except (RuntimeError, KeyError):  # no $HOME and no password entry
            return None
    return Path(base) / "headscope" / "config.toml"


def default_export_dir(env: dict[str, str] | None = None) -> Path:
    """Where ``s`` and ``e`` write unless told otherwise: ``$XDG_DATA_HOME/headscope/exports``
    (``~/.local/share/headscope/exports``). Not the current directory: after ``make run``
    that is the git checkout, which collected ``?? headscope_…svg`` files. Without a home,
    the temporary directory's ``headscope/exports``."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_DATA_HOME")
    if not base:
        try:
            base = str(Path.home() / ".local" / "share")
        except (RuntimeError, KeyError):  # no $HOME and no password entry
            import tempfile

            base = tempfile.gettempdir()
    return Path(base) / "headscope" / "exports"


def _file_exists(path: Path) -> bool:
    """Whether there is something at ``path``; a directory on the way that cannot be
    searched ($HOME without x permission) is a ConfigError, not a traceback."""
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as err:
        reason = os_reason(err) if isinstance(err, OSError) else str(err)
        raise ConfigError(path, f"cannot read the settings file: {reason}") from None
    return True


def read_settings_file(path: Path) -> dict[str, Any]:
    """The TOML table in ``path`` (a regular file of at most ``MAX_SETTINGS_BYTES``)."""
    text = read_text(path, MAX_SETTINGS_BYTES, ConfigError, "settings file")
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise ConfigError(path, f"not valid TOML: {err}") from None


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Read the config file (absent is fine) and apply environment overrides.

    Anything wrong with the file, including a directory, a FIFO or an unreadable file at
    its path, is a one-line ConfigError (the explorer shows it and starts with defaults).
    """
    env = dict(os.environ) if env is None else env
    path = config_path(env)
    data: dict[str, Any] = {}
    exists = path is not None and _file_exists(path)
    if path is not None and exists:
        data = read_settings_file(path)
    if "HEADSCOPE_THEME" in env:
        data["theme"] = env["HEADSCOPE_THEME"]
    if "HEADSCOPE_COLORMAP" in env:
        data["colormap"] = env["HEADSCOPE_COLORMAP"]
    if env.get("HEADSCOPE_COLORS"):
        data["colors"] = env["HEADSCOPE_COLORS"]
    if "HEADSCOPE_CACHE_MB" in env:
        data["cache_mb"] = env["HEADSCOPE_CACHE_MB"]
    if "HEADSCOPE_CACHE_DISK_MB" in env:
        data["cache_disk_mb"] = env["HEADSCOPE_CACHE_DISK_MB"]
    if env.get("HEADSCOPE_OUTPUT_DIR"):
        data["output_dir"] = env["HEADSCOPE_OUTPUT_DIR"]
    return _validate(data, path if exists else None)


def _validate(data: dict[str, Any], path: Path | None) -> Settings:
    where = path or "settings"
    unknown = set(data) - {"theme", "colormap", "colors", "cache_mb", "cache_disk_mb", "tokens",
                           "keymap", "cluster", "output_dir"}
    if unknown:
        raise ConfigError(where, f"unknown setting(s): {', '.join(sorted(unknown))}")
    theme = str(data.get("theme", DEFAULT_THEME))
    colormap = str(data.get("colormap", "diverging"))
    if colormap not in COLORMAPS:
        raise ConfigError(where, f"colormap must be one of {', '.join(COLORMAPS)}, not {colormap!r}")
    colors = str(data.get("colors", ""))
    if colors and colors not in COLOR_MODES:
        raise ConfigError(where, f"colors must be one of {', '.join(COLOR_MODES)}, not {colors!r}")
    cache_mb = _cache_mb(data.get("cache_mb", 256), where)
    cache_disk_mb = _cache_mb(data.get("cache_disk_mb", 512), where, "cache_disk_mb", minimum=0)
    tokens = data.get("tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ConfigError(where, "tokens must be a list of strings")
    keymap = data.get("keymap", {})
    if not isinstance(keymap, dict) or not all(isinstance(v, str) for v in keymap.values()):
        raise ConfigError(where, 'keymap must be a table of binding-id = "keys"')
    cluster = data.get("cluster")
    if cluster is not None and (not isinstance(cluster, str) or "://" not in cluster):
        raise ConfigError(where, 'cluster must be a scheduler address like "tcp://host:8786"')
    output_dir = data.get("output_dir", "")
    if not isinstance(output_dir, str):
        raise ConfigError(where, f"output_dir must be a directory path, not {output_dir!r}")
    return Settings(
        theme=theme,
        colormap=colormap,
        colors=colors,
        cache_mb=cache_mb,
        cache_disk_mb=cache_disk_mb,
        tokens=tuple(tokens),
        keymap=dict(keymap),
        cluster=cluster,
        output_dir=output_dir,
        source=str(path) if path else None,
    )


def _cache_mb(value: Any, where: Path | str, key: str = "cache_mb", minimum: int = 1) -> int:
    """A whole number of MiB in ``[minimum, MAX_CACHE_MB]`` (TOML ``inf``, ``nan``, ``1.5``,
    ``true`` and ``"lots"`` are refused, not crashed on)."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(where, f"{key} must be a whole number, not {value!r}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(where, f"{key} must be a whole number, not {value!r}")
    if value < minimum:
        raise ConfigError(where, f"{key} must be {'positive' if minimum == 1 else f'{minimum} or more'}, not {value}")
    if value > MAX_CACHE_MB:
        raise ConfigError(where, f"{key} must be at most {MAX_CACHE_MB} (1 TiB), not {value}")
    return value
