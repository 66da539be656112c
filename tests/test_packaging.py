"""`pip install .` claims only the `headscope` name in site-packages, and the installed CLI runs.

A non-editable install of this checkout (no dependencies: the test venv has them) into a
fresh target directory, imported from a directory where the checkout is not on sys.path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pip_install_claims_only_the_headscope_namespace(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    top = sorted(p.name for p in target.iterdir()
                 if not p.name.endswith((".dist-info", ".egg-info")) and p.name != "bin")
    assert top == ["headscope"], top
    installed = target / "headscope"
    assert {"engine", "tui", "themes", "sample_models"} <= {p.name for p in installed.iterdir()}
    assert (installed / "sample_models" / "attn-only-2l" / "model.safetensors").is_file()
    # The checkpoint series `headscope timeline` shows, one level deeper (*/*/... patterns).
    series = ROOT / "sample_models" / "attn-only-2l-training"
    for f in series.rglob("*"):
        if f.is_file():
            assert (installed / "sample_models" / f.relative_to(ROOT / "sample_models")).is_file(), f
    assert (installed / "themes" / "headscope.tcss").is_file()
    assert not (installed / "tui" / "screenshots.py").exists(), "a docs tool in the UI package"

    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = subprocess.run(
        [sys.executable, "-c", "import headscope.engine, headscope.tui.cli.main as c; "
         "print(headscope.engine.__file__); raise SystemExit(c.main(['--help']))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.splitlines()[0].startswith(str(installed)), "imported the checkout"
    assert "usage: headscope" in probe.stdout
    # The bundled model is found inside the installed package, not the checkout.
    info = subprocess.run(
        [sys.executable, "-m", "headscope.tui.cli.main", "info", "--json",
         str(installed / "sample_models" / "attn-only-2l")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert info.returncode == 0, info.stderr[-2000:]
    bundled = subprocess.run(
        [sys.executable, "-c", "from headscope.sample_models import bundled_model; print(bundled_model())"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert bundled.stdout.strip() == str((installed / "sample_models" / "attn-only-2l").resolve())
    for name in ("engine", "tui", "themes", "sample_models"):
        assert not (target / name).exists()
