"""Reading and writing files (engine/core/files.py): special files refused, sizes capped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headscope.engine.core import files
from headscope.engine.core.errors import (
    ConfigError,
)


@pytest.mark.timeout(30)
def test_read_bytes_refuses_special_files_and_caps_size(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        files.read_bytes(fifo, 100, ConfigError, "config.json")
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="character device"):
        files.read_bytes(zero, 100, ConfigError, "config.json")
    with pytest.raises(ConfigError, match="a directory"):
        files.read_bytes(tmp_path, 100, ConfigError, "config.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 101)
    with pytest.raises(ConfigError, match="over the 100-byte limit"):
        files.read_bytes(big, 100, ConfigError, "config.json")
    big.write_bytes(b" " * 100)
    assert files.read_bytes(big, 100, ConfigError, "config.json") == b" " * 100
