"""The CLI, second round: arguments that used to crash or mislead, ``export --out``
destinations that cannot take a file, and data that must never be Rich markup or reach the
terminal as control characters (token strings, paths). Run through ``main([...])`` as a
user runs it; bad arguments are usage errors (exit 2) before any model is opened or any
sweep runs, one line naming the argument.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len

import headscope.engine.api.report as report_module
import headscope.engine.core.export as export_module
from headscope.tui.cli.main import main
from tests import hf_fixtures as hf

MODEL = "sample_models/attn-only-2l"

# Vocabulary entries that are markup, links, escape sequences or layout breakers.
HOSTILE_TOKENS = [
    "[/]",
    "[unused0]",
    "[link=https://example.com]x[/link]",
    "[bold red]loud",
    "\x1b[31mred",
    "a\tb",
    "line\nbreak",
    "\u202eevil",
    "bell\x07",
    "\x9bcsi",
]
WORDS = ["<unk>", *HOSTILE_TOKENS, *hf.WORDS[1 + len(HOSTILE_TOKENS):]]
HOSTILE_IDS = ",".join(str(i) for i in range(1, 1 + len(HOSTILE_TOKENS)))
_SGR = re.compile(r"\x1b\[[0-9;]*m")  # Rich's own styling


@pytest.fixture(scope="module")
def hostile_vocab(tmp_path_factory: pytest.TempPathFactory, gpt2_dir: tuple[Path, Any]) -> Path:
    """The tiny GPT-2 with a WordLevel vocabulary holding ``HOSTILE_TOKENS`` (ids 1..10), in
    a directory whose name is markup too."""
    d = tmp_path_factory.mktemp("vocab") / "ckpt[v2]"
    shutil.copytree(gpt2_dir[0], d)
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    return d


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse: usage errors
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(err: str) -> str:
    """argparse's usage block then one ``error:`` line; no traceback."""
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error: argument" in last, err
    return last


@pytest.fixture
def no_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any sweep starting is a test failure: argument errors come first."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a sweep ran before the arguments were checked")

    for name in ("head_table", "composition_report", "circuit_report"):
        monkeypatch.setattr(report_module, name, refuse)


BAD_ARGUMENTS = {
    "rows_superscript": (["circuit", MODEL, "0", "0", "--kind", "qk", "--rows", "²"], "--rows", "ASCII"),
    "rows_superscript_range": (["circuit", MODEL, "0", "0", "--kind", "qk", "--rows", "1:³"], "--rows", "ASCII"),
    "rows_reversed": (["circuit", MODEL, "0", "0", "--kind", "qk", "--rows", "10:2"], "--rows", "empty"),
    "rows_empty_range": (["circuit", MODEL, "0", "0", "--kind", "qk", "--cols", "4:4"], "--cols", "empty"),
    "rows_nothing": (["circuit", MODEL, "0", "0", "--kind", "qk", "--rows", ","], "--rows", "no rows"),
    "negative_layer": (["circuit", MODEL, "-1", "0", "--kind", "qk"], "layer", "between 0"),
    "arabic_digit_head": (["circuit", MODEL, "0", "٣", "--kind", "qk"], "head", "not a whole number"),
    "huge_offset": (["circuit", MODEL, "0", "0", "--kind", "qk", "--offset", "1" + "0" * 30], "--offset", "between"),
    "huge_seed": (["heads", MODEL, "--seed", str(2**64)], "--seed", "between 0"),
    "negative_seed": (["heads", MODEL, "--seed", "-1"], "--seed", "between 0"),
    "negative_top": (["composition", MODEL, "--kind", "k", "--top", "-5"], "--top", "between 0"),
    "port_too_big": (["serve", MODEL, "--port", "99999"], "--port", "between 1 and 65535"),
    "port_zero": (["serve", MODEL, "--port", "0"], "--port", "between 1 and 65535"),
    "threshold_nan": (["diff", MODEL, MODEL, "--threshold", "nan"], "--threshold", "not a finite"),
    "threshold_inf": (["diff", MODEL, MODEL, "--threshold=-inf"], "--threshold", "not a finite"),
    "export_seed": (["export", MODEL, "--what", "heads", "--seed", "1e3"], "--seed", "not a whole"),
    "export_layer": (["export", MODEL, "--what", "circuit", "--kind", "qk", "--layer", "-2",
                      "--head", "0"], "--layer", "between 0"),
    "tokens_superscript": (["forward", MODEL, "--tokens", "3,²"], "--tokens", "not a token id"),
    "tokens_arabic_digit": (["forward", MODEL, "--tokens", "٣"], "--tokens", "not a token id"),
    "tokens_none": (["forward", MODEL, "--tokens", ", ,"], "--tokens", "no token ids"),
    "out_dev_null": (["export", MODEL, "--what", "heads", "--out", "/dev/null"], "--out", "character device"),
    "sort_typo": (["heads", MODEL, "--sort", "inducton_score"], "--sort", "did you mean induction_score?"),
    "sort_typo_weights": (["heads", MODEL, "--no-behaviour", "--sort", "copyng_score"], "--sort",
                          "did you mean copying_score?"),
    "sort_unknown": (["heads", MODEL, "--sort", "nonsense"], "--sort", "unknown sort key 'nonsense'"),
    "export_composition_no_kind": (["export", MODEL, "--what", "composition"], "--kind",
                                   "--what composition needs --kind q|k|v"),
    "export_circuit_no_head": (["export", MODEL, "--what", "circuit", "--kind", "ov", "--layer", "1"],
                               "--head", "--what circuit needs --head"),
}


# --- export --out ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "file_parent"])
def test_export_out_that_is_a_file_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweeps: None, kind: str
) -> None:
    target = tmp_path / "results.json"
    target.write_text("keep me")
    out = target if kind == "file" else target / "sub"
    code, stdout, err = run(capsys, "export", MODEL, "--what", "heads", "--out", str(out))
    assert code == 2 and not stdout
    assert "not a directory" in usage_error(err)
    assert target.read_text() == "keep me"


def test_export_out_without_space_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweeps: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full disk, simulated: statvfs reports no free block."""
    real = os.statvfs

    class Full:
        def __init__(self, path: Any) -> None:
            self._st = real(path)
            self.f_bavail = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._st, name)

    monkeypatch.setattr(os, "statvfs", Full)
    code, _, err = run(capsys, "export", MODEL, "--what", "heads", "--out", str(tmp_path))
    assert code == 2 and "no space left" in usage_error(err)


def test_export_out_unwritable_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweeps: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root writes anywhere, so a directory without write permission is simulated through
    access() when running as root; as another user chmod does it for real."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != locked and real(p, mode, **kw))
    else:
        locked.chmod(0o500)
    code, _, err = run(capsys, "export", MODEL, "--what", "heads", "--out", str(locked))
    assert code == 2 and "permission denied" in usage_error(err)
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("out", ["missing", "missing/deeper"])
def test_export_out_that_does_not_exist_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_sweeps: None, out: str
) -> None:
    """README: --out names an existing directory; a typo in it is not a new directory."""
    code, stdout, err = run(capsys, "export", MODEL, "--what", "heads", "--out", str(tmp_path / out))
    assert code == 2 and not stdout
    assert "no such directory" in usage_error(err)
    assert list(tmp_path.iterdir()) == []


def test_disk_full_during_the_write_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module.os, "fsync", no_space)
    out = tmp_path / "out"
    out.mkdir()
    # --no-cache: the full disk would also (rightly) cost the results store one warning line.
    code, stdout, err = run(capsys, "export", MODEL, "--what", "composition", "--kind", "k",
                            "--out", str(out), "--no-cache")
    assert code == 1 and not stdout
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "no space left" in lines[0] and str(out) in lines[0]
    assert list(out.iterdir()) == []  # no temporary file left behind


def test_export_replaces_an_existing_file_atomically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "attn-only-2l-k-composition.json"
    target.write_text("old")
    code, stdout, _ = run(capsys, "export", MODEL, "--what", "composition", "--kind", "k",
                          "--out", str(tmp_path))
    assert code == 0 and stdout.strip() == str(target)
    assert json.loads(target.read_text())["kind"] == "k"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


# --- data is never markup; control characters never reach the terminal ----------------------


def _as_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout looks like a terminal: the CLI prints Rich tables (captured by capsys)."""
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")


def _check_table(out: str) -> str:
    plain = _SGR.sub("", out)
    assert "\x1b" not in plain and "\x07" not in plain and "\x9b" not in plain
    assert "\u202e" not in plain
    widths = {cell_len(line) for line in plain.splitlines() if line.strip()}
    assert len(widths) == 1, plain  # no token shifted the layout
    return plain


def test_tokens_in_cli_tables_are_shown_literally(
    hostile_vocab: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_terminal(monkeypatch)
    code, out, err = run(capsys, "circuit", str(hostile_vocab), "0", "0", "--kind", "qk",
                         "--rows", HOSTILE_IDS, "--cols", "1,2,3")
    assert code == 0, err
    plain = _check_table(out)
    for shown in ("[/]", "[unused0]", "[link=https://example.com]x[/link]", "[bold red]loud",
                  "␛[31mred", "a⇥b", "line⏎break", "bell␇"):
        assert shown in plain, shown
    code, out, err = run(capsys, "forward", str(hostile_vocab), "--tokens", HOSTILE_IDS)
    assert code == 0, err
    assert "[unused0]" in _check_table(out)


def test_paths_are_not_markup(
    hostile_vocab: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_terminal(monkeypatch)
    code, out, _ = run(capsys, "info", str(hostile_vocab))
    assert code == 0 and "ckpt[v2]" in _check_table(out)


def test_control_characters_in_a_path_do_not_reach_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "info", str(tmp_path / "evil\x1b]8;;https:x\x07dir"))
    assert code == 1
    assert "\x1b" not in err and "\x07" not in err
    assert "evil\\x1b]8;;https:x\\x07dir" in err


def test_escape_codes_in_a_path_do_not_reach_stderr_through_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """forward's "prompt truncated" and "unknown tokens" lines and timeline's "identical
    weights" warning went out raw (issue #29): every message goes through one escaping."""
    evil = "evil\x1b]0;pwned\x07\x1b[31m"
    model = tmp_path / f"{evil}model"
    shutil.copytree(MODEL, model)
    long_prompt = "qqqzzz " + " ".join(["the"] * 80)  # n_ctx is 64; one unknown word
    code, _, err = run(capsys, "forward", str(model), "--prompt", long_prompt)
    assert code == 0 and "truncated" in err and "unknown" in err
    assert "\x1b" not in err and "\x07" not in err
    steps = tmp_path / f"{evil}steps"
    for name in ("step-000000", "step-000100"):  # the same weights twice
        shutil.copytree("sample_models/attn-only-2l-training/step-000000", steps / name)
    code, _, err = run(capsys, "timeline", str(steps), "--json", "--no-cache")
    assert code == 0 and "identical weights" in err
    assert "\x1b" not in err and "\x07" not in err
