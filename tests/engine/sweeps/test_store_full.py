"""Running out of disk space or memory in the middle of a sweep (issue #30, "Bad input"): one
line naming the file (or the command), no partial file, and the parts stored before it are
kept and read back by the next run."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headscope.engine.circuits import spectral as spectral_module
from headscope.engine.model.loading import load_model
from headscope.engine.sweeps import scores as score_sweeps
from headscope.engine.sweeps import store as store_module
from headscope.engine.sweeps.store import ResultStore
from headscope.tui.cli.main import main
from tests.engine.sweeps.test_store import (
    N_LAYERS,
    deep_gpt2,  # noqa: F401 (the pytest fixture: a sharded 5-layer GPT-2)
)


def stored_parts(root: Path, name: str) -> list[str]:
    return sorted(p.name for p in root.rglob(f"{name}.*.hsr"))


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp-*")]


def test_a_full_disk_midway_is_one_line_naming_the_file_and_keeps_what_was_stored(
        deep_gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    expected = score_sweeps.weight_scores(load_model(deep_gpt2))
    real_fsync = os.fsync
    writes = [0]

    def fsync(fd: int) -> None:
        writes[0] += 1
        if writes[0] > 5:  # entry.json, then both scores of layers 0 and 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    warnings: list[str] = []
    store = ResultStore(tmp_path / "store", warn=warnings.append)
    model = load_model(deep_gpt2)
    with monkeypatch.context() as patched:
        patched.setattr(store_module.os, "fsync", fsync)
        found = score_sweeps.weight_scores(model, store=store.for_model(model))
    for name in ("copying_score", "qk_positivity"):  # the sweep finished without the store
        assert np.asarray(found[name]).tobytes() == np.asarray(expected[name]).tobytes()
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "no space left" in warnings[0] and "copying_score.2.hsr" in warnings[0]
    assert "already stored are kept" in warnings[0]
    assert temporaries(tmp_path / "store") == []  # no partial file
    assert stored_parts(tmp_path / "store", "copying_score") == ["copying_score.0.hsr", "copying_score.1.hsr"]

    # the disk has room again: the next run reads the two layers back and computes the rest
    again = ResultStore(tmp_path / "store")
    model = load_model(deep_gpt2)
    entry = again.for_model(model)
    found = score_sweeps.weight_scores(model, store=entry)
    assert entry.loaded == 4 and entry.computed == 2 * (N_LAYERS - 2) + 1  # + the flags
    for name in ("copying_score", "qk_positivity"):
        assert np.asarray(found[name]).tobytes() == np.asarray(expected[name]).tobytes()


def test_out_of_memory_in_a_layer_is_one_line_and_the_next_run_resumes(
        deep_gpt2: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(os.environ["HEADSCOPE_CACHE_DIR"])  # conftest: a fresh store per test
    real = spectral_module.layer_spectral_scores
    calls = [0]

    def layer(w: Any, index: int, middles: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise MemoryError()
        return real(w, index, middles)

    with monkeypatch.context() as patched:
        patched.setattr(spectral_module, "layer_spectral_scores", layer)
        code = main(["heads", str(deep_gpt2), "--no-behaviour", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "out of memory" in lines[0] and "Traceback" not in err
    assert stored_parts(root, "copying_score") == ["copying_score.0.hsr", "copying_score.1.hsr"]
    assert temporaries(root) == []

    computed: list[int] = []

    def counted(w: Any, index: int, middles: Any) -> Any:
        computed.append(index)
        return real(w, index, middles)

    monkeypatch.setattr(spectral_module, "layer_spectral_scores", counted)
    assert main(["heads", str(deep_gpt2), "--no-behaviour", "--json"]) == 0
    assert sorted(computed) == list(range(2, N_LAYERS))  # layers 0 and 1 came from the store
