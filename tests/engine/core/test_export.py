"""Exports: JSON/CSV round trips equal the engine's numbers; writes are atomic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headscope.engine.core.export import atomic_write_text
from headscope.engine.model.loading import load_model
from headscope.tui.cli.main import main


def export(tmp_path: Path, path: Path, *argv: str) -> Path:
    out = tmp_path / "out"
    out.mkdir(parents=True)
    assert main(["export", str(path), "--out", str(out), *argv]) == 0
    (written,) = list(out.iterdir())
    return written


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "report.json"
    atomic_write_text(target, "old, complete\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new " * 10_000)
    assert target.read_text() == "old, complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # temp file cleaned up


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_get_the_umask_permissions_not_mkstemps_0600(tmp_path, umask) -> None:
    # What open(path, "w") would give: exports must be readable by whoever can read the
    # directory, as any other file the user writes (mkstemp and safetensors make 0o600).
    from headscope.engine.core.export import file_mode
    from headscope.engine.model.tl_compat import save_native
    from tests.conftest import sample_model

    old = os.umask(umask)
    try:
        assert file_mode() == 0o666 & ~umask
        target = atomic_write_text(tmp_path / "report.json", "{}")
        out = save_native(load_model(sample_model("attn-only-1l")).weights, tmp_path / "m",
                          vocab=["a"])
    finally:
        os.umask(old)
    for path in (target, out / "model.safetensors", out / "headscope.json", out / "vocab.txt"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path
