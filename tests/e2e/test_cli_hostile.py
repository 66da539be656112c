"""The CLI on hostile and broken inputs.

Every broken checkpoint of the corpus (tests/engine/test_hostile.py ``BROKEN``) through
``headscope info`` and ``headscope heads``: exit code 1, exactly one line on stderr naming
the file and the problem, no traceback, nothing on stdout, and nothing written anywhere
near the checkpoint (the whole test directory and the working directory are compared
before and after, names, sizes and mtimes). Then resource limits and prompts: an
over-limit circuit block and an over-long or empty prompt are one-line refusals; NaN
weights are not an error.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import headscope.engine.core.validation as requests_module
from headscope.engine.core.requests import PromptRequest
from headscope.tui.cli.main import EXIT_MODEL_ERROR, main
from tests.engine import test_hostile
from tests.engine.test_hostile import (
    BROKEN,
    NAN_HEAD,
    NAN_LAYER,
    Sources,
    build_broken,
    nan_weights,
)
from tests.hf_fixtures import N_CTX, VOCAB

corpus_sources = test_hostile.corpus_sources  # the corpus' pytest fixture
REPO = Path(__file__).resolve().parents[2]

Listing = dict[str, tuple[int, int, int]]


def listing(root: Path) -> Listing:
    """Every entry under ``root`` (symlinks not followed): (mode, size, mtime in ns)."""
    out: Listing = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: nothing may appear in it either."""
    d = tmp_path / "cwd"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what building the fixtures printed (progress bars)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_refusal(err: str, names: str, fragment: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err  # exactly one line
    line = err.rstrip("\n")
    assert line.startswith("headscope: "), line
    assert "Traceback" not in line
    assert names in line, line  # names the file at fault
    assert re.search(fragment, line), line  # and the problem
    return line


@pytest.mark.parametrize("command", ["info", "heads"])
@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_checkpoint_is_one_line_exit_1_and_writes_nothing(
    tmp_path: Path,
    cwd: Path,
    corpus_sources: Sources,
    capsys: pytest.CaptureFixture[str],
    case: str,
    command: str,
) -> None:
    broken = build_broken(case, tmp_path / "corpus", corpus_sources)
    before = listing(tmp_path)
    code, out, err = run(capsys, command, str(broken.path))
    assert code == EXIT_MODEL_ERROR == 1
    assert out == ""
    assert_one_line_refusal(err, broken.names, broken.fragment)
    assert listing(tmp_path) == before  # checkpoint, its neighbours and the cwd untouched


@pytest.mark.parametrize(
    ("case", "command"), [("truncated", "info"), ("missing_tensor", "heads")]
)
def test_as_a_real_process_stderr_is_one_line(
    tmp_path: Path, corpus_sources: Sources, case: str, command: str
) -> None:
    """The same through ``python -m headscope.tui.cli.main``: what a shell sees, warnings and all."""
    broken = build_broken(case, tmp_path / "corpus", corpus_sources)
    work = tmp_path / "cwd"
    work.mkdir()
    before = listing(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HEADSCOPE_CONFIG": str(tmp_path / "none")}
    proc = subprocess.run(
        [sys.executable, "-m", "headscope.tui.cli.main", command, str(broken.path)],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert_one_line_refusal(proc.stderr, broken.names, broken.fragment)
    assert listing(tmp_path) == before


# --- NaN weights: not an error, flagged ------------------------------------------------------


def test_heads_on_nan_weights_succeeds_and_writes_nothing(
    tmp_path: Path, cwd: Path, corpus_sources: Sources, capsys: pytest.CaptureFixture[str]
) -> None:
    path = nan_weights(tmp_path, corpus_sources)
    before = listing(tmp_path)
    code, out, err = run(capsys, "heads", str(path), "--json", "--sort", "induction_score")
    assert (code, err) == (0, "")
    rows = {(r["layer"], r["head"]): r for r in json.loads(out)}
    assert len(rows) == 8
    bad = rows[(NAN_LAYER, NAN_HEAD)]
    # Every score of a head with non-finite weights is NaN (null in strict JSON), even the
    # copying score of its intact OV circuit: the head is flagged, not half-trusted.
    assert bad["nonfinite"] is True
    assert all(v is None for k, v in bad.items() if k not in ("layer", "head", "nonfinite")), bad
    for head, row in rows.items():
        if head != (NAN_LAYER, NAN_HEAD):
            assert row["nonfinite"] is False
            # (the delimiter sink: null where the vocabulary has no punctuation, as here)
            assert all(isinstance(v, float) and math.isfinite(v) for k, v in row.items()
                       if k not in ("layer", "head", "nonfinite", "delimiter_sink_score",
                                    "delimiter_sink_score_z")), row  # fmt: skip
    assert list(rows)[-1] == (NAN_LAYER, NAN_HEAD)  # NaN sorts last
    assert listing(tmp_path) == before


def test_forward_on_nan_weights_names_the_positions_and_predicts_nothing(
    tmp_path: Path, cwd: Path, corpus_sources: Sources, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One NaN weight made every logit NaN and `forward` named token 0 "predicted next"
    everywhere, exit 0, no word. Now: one warning line naming the file, the positions and the
    head whose attention is not finite; no prediction there (`-`, null in the JSON)."""
    path = nan_weights(tmp_path, corpus_sources)
    code, out, err = run(capsys, "forward", str(path), "--tokens", "1,2,3,4", "--json")
    assert code == 0
    report = json.loads(out)  # strict JSON: no NaN
    assert len(report["logits"]) == 4 and all(None in row for row in report["logits"])
    assert len(err.splitlines()) == 1 and str(path) in err
    assert "logits not finite at positions 0–3 of 4" in err
    assert f"L{NAN_LAYER}.H{NAN_HEAD}" in err and "no prediction" in err
    code, out, err = run(capsys, "forward", str(path), "--tokens", "1,2,3,4")  # TSV
    assert code == 0 and len(err.splitlines()) == 1
    rows = [line.split("\t") for line in out.splitlines()[1:]]
    assert [r[2:] for r in rows] == [["-", "-"]] * 4
    # a terminal table too, and a finite model still predicts
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, err = run(capsys, "forward", str(corpus_sources.gpt2), "--tokens", "1,2,3,4")
    assert code == 0 and err == "" and " - " not in out


# --- resource limits and prompts -------------------------------------------------------------


def test_circuit_block_over_the_limit_is_refused_in_one_line(
    cwd: Path,
    corpus_sources: Sources,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(corpus_sources.gpt2)
    # The fixture's vocabulary (96) keeps a full vocab × vocab block under the real limit;
    # lower it so the same request is an over-limit one.
    monkeypatch.setattr(requests_module, "MAX_RESULT_BYTES", 4000)  # 1000 float32 cells
    code, out, err = run(
        capsys, "circuit", path, "0", "0", "--kind", "qk", "--rows", f"0:{VOCAB}", "--cols", f"0:{VOCAB}"
    )
    assert (code, out) == (1, "")
    assert_one_line_refusal(
        err, path, rf"a {VOCAB}×{VOCAB} block would materialise 36\.0 KiB, over the limit of 3\.9 KiB"
    )
    # A block within the limit still works, and the limit counts cells, not the request text.
    code, out, err = run(capsys, "circuit", path, "0", "0", "--kind", "ov",
                         "--rows", "0:20", "--cols", "0:50", "--json")  # fmt: skip
    assert (code, err) == (0, "")
    assert len(json.loads(out)["values"]) == 20


def test_prompts_empty_are_refused_and_longer_than_the_context_truncated(
    cwd: Path, corpus_sources: Sources, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(corpus_sources.gpt2)
    for prompt in ("", "   \t "):
        code, out, err = run(capsys, "forward", path, "--prompt", prompt)
        assert (code, out) == (1, "")
        assert_one_line_refusal(err, path, "empty prompt")
    # A prompt is cut to the context with a one-line notice; explicit token ids are refused.
    long_prompt = " ".join(["the cat sat"] * N_CTX)
    code, out, err = run(capsys, "forward", path, "--prompt", long_prompt, "--json")
    assert code == 0 and len(json.loads(out)["tokens"]) == N_CTX
    assert_one_line_refusal(err, path, rf"prompt truncated from {3 * N_CTX} to the context of {N_CTX}")
    ids = ",".join(["1"] * (N_CTX + 1))
    code, out, err = run(capsys, "forward", path, "--tokens", ids)
    assert (code, out) == (1, "")
    assert_one_line_refusal(err, path, rf"{N_CTX + 1} tokens exceed the context of {N_CTX}")
    code, out, err = run(capsys, "forward", path, "--tokens", "1,2,100000")
    assert (code, out) == (1, "")
    assert_one_line_refusal(err, path, rf"token 100000 out of range 0\.\.{VOCAB - 1}")


def test_engine_run_prompt_truncates_to_the_context(corpus_sources: Sources) -> None:
    """What the TUI's Prompt tab shows: the Engine cuts the prompt at n_ctx and says so."""
    import asyncio

    from headscope.engine.core.errors import PromptError
    from headscope.engine.service.engine import Engine

    async def go() -> None:
        eng = Engine(corpus_sources.gpt2)
        try:
            await eng.ready()
            view = (await eng.get(PromptRequest.of(eng.structure, " ".join(["the cat sat"] * N_CTX), limit=eng.max_block_bytes))).view(0, 0)
            assert view.truncated and len(view.ids) == len(view.tokens) == N_CTX
            assert view.pattern.shape == (N_CTX, N_CTX)
            short = (await eng.get(PromptRequest.of(eng.structure, "the cat sat", limit=eng.max_block_bytes))).view(0, 0)
            assert not short.truncated and len(short.ids) == 3
            with pytest.raises(PromptError, match=str(corpus_sources.gpt2)):
                (await eng.get(PromptRequest.of(eng.structure, "", limit=eng.max_block_bytes))).view(0, 0)
        finally:
            await eng.aclose()

    asyncio.run(go())


# --- a checkpoint that changes on disk while it is open ---------------------------------------

_CHANGED_UNDER_US = """
import sys
from headscope.engine.core.errors import HeadscopeError
from headscope.engine.model.loading import load_model

path = sys.argv[1]
m = load_model(path, raw=True)
m.weights.get_head("blocks.0.attn.W_Q", 0)  # the file is now open (mmap)
f = m.path / "model.safetensors"
size = f.stat().st_size
with open(f, "r+b") as fh:  # e.g. save_pretrained overwriting the checkpoint in place
    fh.truncate(size // 3)
try:
    for layer in range(m.cfg.n_layers):
        for head in range(m.cfg.n_heads):
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                m.weights.get_head(f"blocks.{layer}.attn.{name}", head)
    m.weights.get("embed.W_E")
except HeadscopeError as e:
    print(type(e).__name__, e)
"""


def test_checkpoint_truncated_while_open_is_an_error_not_a_crash(
    tmp_path: Path, corpus_sources: Sources
) -> None:
    d = tmp_path / "m"
    d.mkdir()
    for f in corpus_sources.gpt2.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    proc = subprocess.run(
        [sys.executable, "-c", _CHANGED_UNDER_US, str(d)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"died with {proc.returncode}: {proc.stderr[-300:]}"
    # CheckpointChangedError is the CorruptFileError that says the file changed under us.
    assert proc.stdout.split()[0] in ("CorruptFileError", "CheckpointChangedError"), proc.stdout
    assert str(d / "model.safetensors") in proc.stdout
