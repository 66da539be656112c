"""`headscope info`: the structure a checkpoint's config and headers give, without torch."""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.test_cli import REPO, run_json


def test_info_reports_the_structure(capsys, gpt2_dir) -> None:
    path, hf = gpt2_dir
    info = run_json(capsys, "info", str(path))
    assert (info["family"], info["n_layers"], info["n_heads"], info["d_model"], info["d_vocab"]) == (
        "gpt2", hf.config.n_layer, hf.config.n_head, hf.config.n_embd, hf.config.vocab_size)
    assert info["n_params"] == sum(p.numel() for p in hf.parameters())
    assert info["positional"] == "learned"
    assert info["tied_unembed"] is True  # GPT-2 stores no lm_head: W_U is W_Eᵀ


def test_info_does_not_import_torch(gpt2_dir) -> None:
    path, _ = gpt2_dir
    code = (
        f"import sys; from headscope.tui.cli.main import main; rc = main(['info', {str(path)!r}, '--json']);"
        "sys.stdout.flush(); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)
