"""Hostile files and resources, second round (engine and API): the files around a
checkpoint that are special files or JSON bombs, a checkpoint rewritten while open, Rust
tokenizer panics, running out of memory, non-finite outputs of finite weights, and
directories that cannot be searched. The broken checkpoints of this round that are plain
refusals are in the shared corpus (tests/engine/test_hostile.py), so the CLI and the explorer
open them too; this module covers what is not "opening fails".

No test here can hang: FIFOs are never opened for reading by the test itself, and every
test touching one has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import struct
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st
from safetensors.torch import load_file, save

import headscope.engine.api.report as report_module
from headscope.engine.api.model import open_model, read_structure
from headscope.engine.core.errors import (
    CheckpointChangedError,
    ConfigError,
    CorruptFileError,
    PromptError,
    ResourceLimitError,
    UnsupportedFormatError,
)
from headscope.engine.core.requests import CircuitRequest, ScoreTableRequest
from headscope.engine.formats.tokenizer import IdTokenizer
from headscope.engine.service.engine import Engine
from headscope.tui.cli.main import main
from tests import hf_fixtures as hf

ALLOCATOR_ERROR = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)"
)


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- engine.files: regular files only, at most the cap ------------------------------------


def _special(kind: str, path: Path) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_special_tokenizer_json_falls_back_to_ids_and_prompts_say_why(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], kind: str
) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    _special(kind, d / "tokenizer.json")
    m = open_model(d)
    assert isinstance(m.tokenizer, IdTokenizer)
    assert "tokenizer.json" in m.warnings[0]
    assert m.tokenizer.encode("3 14") == [3, 14]
    # Where the user meets the missing tokenizer, the reason is repeated.
    with pytest.raises(PromptError, match=r"tokenizer is unusable .*tokenizer\.json.* type token ids"):
        m.tokenizer.encode("the cat")


def test_the_tokenizer_is_read_when_first_used_and_its_warning_said_then(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Opening a model reads no tokenizer (``LazyTokenizer``): weight-only work never meets a
    broken one, and says nothing of it; the first token read falls back to ids and warns,
    once, for every copy of the model (``with_raw``) and in the CLI's closing lines."""
    from headscope.engine.circuits.composition import composition_scores

    d = copy_of(gpt2_dir[0], tmp_path / "m")
    (d / "tokenizer.json").write_text("{not json")
    m = open_model(d)
    composition_scores(m.weights, "k")
    assert not m.lazy_tokenizer.loaded and m.warnings == ()
    raw = m.with_raw(True)
    assert isinstance(raw.tokenizer, IdTokenizer)  # the raw copy reads it: for both
    assert m.lazy_tokenizer.loaded and m.tokenizer is raw.tokenizer
    assert len(m.warnings) == 1 and "tokenizer.json" in m.warnings[0] and m.warnings == raw.warnings

    assert main(["composition", str(d), "--kind", "k", "--no-cache", "--json", "--quiet"]) == 0
    assert "tokenizer" not in capsys.readouterr().err  # no token shown: nothing to say
    assert main(["circuit", str(d), "0", "0", "--kind", "ov", "--rows", "0:2", "--cols", "0:2",
                 "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count("tokenizer.json") == 1 and "showing token ids instead" in err, err

    async def explorer_engine_warnings() -> tuple[str, ...]:  # the explorer shows tokens
        engine = Engine(d)
        try:
            await engine.ready()
            return engine.warnings
        finally:
            await engine.aclose()

    said = asyncio.run(explorer_engine_warnings())
    assert len(said) == 1 and "tokenizer.json" in said[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer_config.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_special_bert_tokenizer_files_do_not_hang(
    tmp_path: Path, bert_base_dir: tuple[Path, Any], name: str, kind: str
) -> None:
    d = copy_of(bert_base_dir[0], tmp_path / "m")
    (d / "vocab.txt").write_text("\n".join(hf.WORDS) + "\n")
    _special(kind, d / name)
    m = open_model(d)
    if name == "vocab.txt":
        assert isinstance(m.tokenizer, IdTokenizer) and "vocab.txt" in m.warnings[0]
    else:  # unreadable tokenizer_config.json: the WordPiece vocabulary, lowercased (default)
        assert m.tokenizer.encode("The cat") == [1, 2]


# --- JSON that would cost many times its size as Python objects ---------------------------


def _peak_bytes(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_container_dense_json_files_are_refused_before_parsing(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], name: str
) -> None:
    if name == "config.json":
        d = copy_of(gpt2_dir[0], tmp_path / "m")
    else:
        d = hf.build_gpt2(tmp_path / "sharded", shard=True, tokenizer=False)[0]
    body = b"[" + b"[]," * 1_000_000 + b"[]]"
    (d / name).write_bytes(body)

    def attempt() -> None:
        with pytest.raises((ConfigError, CorruptFileError), match="nests") as info:
            read_structure(d)
        assert str(d / name) in str(info.value)

    assert _peak_bytes(attempt) < 3 * len(body)


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,12}(\.[a-z0-9_]{1,12}){0,5}", fullmatch=True)


# --- a checkpoint rewritten while it is open -----------------------------------------------


def _rewritten_bytes(path: Path, scale: float) -> bytes:
    """The same checkpoint with every tensor scaled: same header, same size, new weights."""
    tensors = {k: v * scale for k, v in load_file(str(path)).items()}
    return save(tensors, metadata={"format": "pt"})


def _rewrite_in_place(path: Path, blob: bytes) -> None:
    """What ``save_pretrained`` over an open checkpoint does: same inode, same size."""
    before = path.stat()
    assert len(blob) == before.st_size
    with open(path, "r+b") as f:
        f.write(blob)
    # The next epoch's save is seconds later; mtime ticks are coarse (a few ms), so a
    # rewrite within the same tick as the first save is stamped one second later here.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))


def test_same_size_rewrite_in_place_is_detected(tmp_path: Path, gpt2_dir: tuple[Path, Any]) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    f = d / "model.safetensors"
    m = open_model(d, raw=True)
    old = m.weights.get_head("blocks.0.attn.W_Q", 0).copy()
    _rewrite_in_place(f, _rewritten_bytes(f, 2.0))
    with pytest.raises(CheckpointChangedError, match=r"changed on disk .*modification time.*reopen") as info:
        m.weights.get_head("blocks.0.attn.W_Q", 1)
    assert str(f) in str(info.value)
    assert np.array_equal(m.weights.get_head("blocks.0.attn.W_Q", 0), old)  # cached: still the old
    fresh = open_model(d, raw=True)  # reopening reads the new weights
    assert np.allclose(fresh.weights.get_head("blocks.0.attn.W_Q", 0), 2 * old)


def test_checkpoint_replaced_by_rename_is_detected(tmp_path: Path, gpt2_dir: tuple[Path, Any]) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    f = d / "model.safetensors"
    m = open_model(d, raw=True)
    m.weights.get_head("blocks.0.attn.W_Q", 0)
    (d / "new.tmp").write_bytes(_rewritten_bytes(f, 2.0))
    os.replace(d / "new.tmp", f)
    with pytest.raises(CheckpointChangedError, match="inode"):
        m.weights.get("blocks.1.attn.W_O")


def test_rewrite_between_open_and_first_read_is_detected(
    tmp_path: Path, gpt2_dir: tuple[Path, Any]
) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    f = d / "model.safetensors"
    m = open_model(d, raw=True)  # headers validated, no tensor read yet
    _rewrite_in_place(f, _rewritten_bytes(f, 2.0))
    with pytest.raises(CheckpointChangedError, match="changed on disk"):
        m.weights.get_head("blocks.0.attn.W_Q", 0)


def test_engine_never_mixes_old_and_new_weights(tmp_path: Path, gpt2_dir: tuple[Path, Any]) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    f = d / "model.safetensors"

    async def go() -> None:
        engine = Engine(d, raw=True, prefetch=False)
        try:
            await engine.ready()
            first = await engine.get(CircuitRequest.of(engine.structure, 0, 0, "ov", "token", rows=[1, 2], cols=[1, 2], limit=engine.max_block_bytes))
            _rewrite_in_place(f, _rewritten_bytes(f, 2.0))
            # a head of another layer: its weights are not cached yet, so they are read (the
            # engine reads a layer's attention weights whole: layer 0's other heads are cached
            # old weights, which mix nothing)
            with pytest.raises(CheckpointChangedError, match="reopen"):
                await engine.get(CircuitRequest.of(engine.structure, 1, 1, "ov", "token", rows=[1, 2], cols=[1, 2], limit=engine.max_block_bytes))
            again = await engine.get(CircuitRequest.of(engine.structure, 0, 0, "ov", "token", rows=[1, 2], cols=[1, 2], limit=engine.max_block_bytes))
            assert (again.values == first.values).all()  # the cached old result, not a mix
        finally:
            await engine.aclose()

    asyncio.run(go())


# --- tokenizers that panic in Rust ---------------------------------------------------------


def _panic_exception() -> type[BaseException]:
    """The real ``pyo3_runtime.PanicException`` (a BaseException), from a real panic."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    tok.enable_padding(length=2**62)
    try:
        tok.encode("a")
    except BaseException as e:  # a panic is not an Exception: that is the point
        assert not isinstance(e, Exception)
        return type(e)
    pytest.skip("this tokenizers version no longer panics on a huge fixed padding")


def test_tokenizer_json_settings_that_panic_are_ignored(tmp_path: Path, gpt2_dir: tuple[Path, Any]) -> None:
    """A truncation stride >= max_length and a 2^62 fixed padding panic inside ``encode``;
    headscope encodes prompts as typed, so neither applies."""
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["truncation"] = {"direction": "Right", "max_length": 1, "strategy": "LongestFirst", "stride": 5}
    doc["padding"] = {"strategy": {"Fixed": 2**62}, "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": 0, "pad_type_id": 0, "pad_token": "<unk>"}
    (d / "tokenizer.json").write_text(json.dumps(doc))
    m = open_model(d)
    assert not m.warnings
    assert m.tokenizer.encode("the cat sat") == [1, 2, 3]


class _PanickingTokenizer:
    """Stands in for ``tokenizers.Tokenizer``: builds, then panics when it encodes."""

    panic: type[BaseException] = BaseException

    @classmethod
    def from_str(cls, text: str) -> _PanickingTokenizer:
        return cls()

    def no_truncation(self) -> None: ...

    def no_padding(self) -> None: ...

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return hf.VOCAB

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        raise self.panic("regex automaton panicked")


def test_tokenizer_that_panics_falls_back_and_says_why(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import tokenizers

    _PanickingTokenizer.panic = _panic_exception()
    monkeypatch.setattr(tokenizers, "Tokenizer", _PanickingTokenizer)
    m = open_model(gpt2_dir[0])
    assert isinstance(m.tokenizer, IdTokenizer)
    assert "panicked" in m.warnings[0] and "tokenizer.json" in m.warnings[0]
    with pytest.raises(PromptError, match=r"tokenizer is unusable .*panicked"):
        m.tokenizer.encode("the cat")
    capsys.readouterr()
    assert main(["forward", str(gpt2_dir[0]), "--prompt", "the cat"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "tokenizer is unusable" in line and "panicked" in line


# --- out of memory ---------------------------------------------------------------------------


def test_cli_out_of_memory_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(ALLOCATOR_ERROR)

    monkeypatch.setattr(report_module, "head_table", exhausted)
    capsys.readouterr()
    assert main(["heads", "sample_models/attn-only-2l"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "out of memory" in line and "80.0 GiB" in line and "attn-only-2l" in line


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_engine_out_of_memory_is_a_resource_error(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """The weight sweep's pieces run in numpy (engine.circuits.spectral: inside the behavioural
    pass, in torch, as it reaches each layer): either allocator's failure is one line with the
    size asked for."""
    import numpy as np

    import headscope.engine.circuits.spectral as spectral

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        if path == "torch":
            raise RuntimeError(ALLOCATOR_ERROR)
        try:  # what numpy raises for np.empty of 80 GiB (numpy 2; numpy.core in 1.26)
            from numpy._core._exceptions import _ArrayMemoryError
        except ImportError:
            from numpy.core._exceptions import _ArrayMemoryError
        raise _ArrayMemoryError((85899345920 // 4,), np.dtype(np.float32))

    monkeypatch.setattr(spectral, "layer_spectral_scores", exhausted)

    async def go() -> None:
        engine = Engine("sample_models/attn-only-2l", prefetch=False)
        try:
            with pytest.raises(ResourceLimitError, match=r"out of memory: all head scores .*80\.0 GiB"):
                await engine.get(ScoreTableRequest())
        finally:
            await engine.aclose()

    asyncio.run(go())


HUGE_VOCAB = 20_000_000  # 2.4 GiB of float32 embeddings (a sparse file: no disk used)


def _huge_vocab_checkpoint(d: Path, gpt2: Path) -> Path:
    """gpt2 with a 2e7-row embedding: tied, so W_E is the only vocabulary-sized tensor."""
    d.mkdir()
    tensors = load_file(str(gpt2 / "model.safetensors"))
    entries: dict[str, Any] = {}
    offset = 0
    big = "transformer.wte.weight"
    order = [n for n in tensors if n != big] + [big]
    for name in order:
        shape = [HUGE_VOCAB, hf.D_MODEL] if name == big else list(tensors[name].shape)
        n = 4 * (shape[0] * shape[1] if name == big else tensors[name].numel())
        entries[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header = json.dumps(entries).encode()
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        for name in order[:-1]:
            f.write(tensors[name].float().contiguous().numpy().tobytes())
        f.truncate(8 + len(header) + offset)  # the embedding: a hole
    cfg = json.loads((gpt2 / "config.json").read_text())
    cfg["vocab_size"] = HUGE_VOCAB
    (d / "config.json").write_text(json.dumps(cfg))
    return d


_UNDER_ADDRESS_LIMIT = """
import resource, sys
from headscope.tui.cli.main import main
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.timeout(120)
def test_vocabulary_too_big_for_memory_is_one_line(tmp_path: Path, gpt2_dir: tuple[Path, Any]) -> None:
    """A real allocation failure: the process may map 2 GiB in all (``prlimit --as``), the
    embedding alone is 2.4 GiB."""
    import subprocess
    import sys

    d = _huge_vocab_checkpoint(tmp_path / "huge", gpt2_dir[0])
    proc = subprocess.run(
        [sys.executable, "-c", _UNDER_ADDRESS_LIMIT, str(2 << 30), "forward", str(d), "--tokens", "1,2"],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-500:]
    line = one_line(proc.stderr)
    assert "out of memory" in line and "2.4 GiB" in line and "model.safetensors" in line


# --- finite weights, non-finite outputs ------------------------------------------------------


# --- a directory that cannot be searched -----------------------------------------------------


@pytest.fixture
def unsearchable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/locked`` behaves as if it had no search (x) permission. Tests run as root
    here, and root passes permission bits, so stat() is made to fail as it would (EACCES)
    for anything below the directory; as another user, chmod does the real thing."""
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "model").mkdir()
    if os.geteuid() != 0:
        locked.chmod(0o600)
        return locked
    real_stat = pathlib.Path.stat

    def stat(self: pathlib.Path, *args: Any, **kwargs: Any) -> os.stat_result:
        if self.is_relative_to(locked) and self != locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    return locked


def test_parent_without_search_permission_is_one_line(
    unsearchable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = unsearchable / "model"
    with pytest.raises(UnsupportedFormatError, match="permission denied"):
        open_model(path)
    capsys.readouterr()
    assert main(["info", str(path)]) == 1
    line = one_line(capsys.readouterr().err)
    assert str(path) in line and "permission denied" in line


@pytest.mark.parametrize("path", ["model\x00dir", "x" * 5000, "loop"])
def test_unusable_paths_are_one_typed_line(tmp_path: Path, path: str) -> None:
    """A NUL byte (API only), a name longer than the system allows, a symlink loop."""
    if path == "loop":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(UnsupportedFormatError) as info:
        open_model(tmp_path / path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.txt"])
def test_tokenizer_files_leading_outside_are_not_read(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], name: str
) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    (d / "tokenizer.json").unlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("the\ncat\n")
    (d / name).symlink_to(secret)
    m = open_model(d)
    assert isinstance(m.tokenizer, IdTokenizer)
    assert "symlink leading outside the model directory" in m.warnings[0]


def test_a_panicking_tokenizer_regex_prints_no_rust_panic_text(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    """A split regex that backtracks past Oniguruma's retry limit panics in Rust; its panic
    hook writes ``thread '…' panicked at …`` straight to fd 2, past Python's sys.stderr (and
    onto the explorer's screen). Only headscope's one line may reach the terminal."""
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a*)*b"},
                            "behavior": "Isolated", "invert": False}
    (d / "tokenizer.json").write_text(json.dumps(doc))
    capfd.readouterr()
    assert main(["forward", str(d), "--prompt", "a" * 60 + " b"]) == 1
    err = capfd.readouterr().err
    assert "panicked at" not in err and "RUST_BACKTRACE" not in err, err
    assert one_line(err).startswith("headscope: ") and "tokenizers panicked" in err
    print("still on stderr", file=sys.stderr)  # the redirection was undone
    assert capfd.readouterr().err == "still on stderr\n"


def test_circuit_rows_name_the_unusable_tokenizer(
    tmp_path: Path, gpt2_dir: tuple[Path, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """`forward --prompt` named the tokenizer's failure; `circuit --rows cat` said only that
    'cat' is not in the vocabulary."""
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    (d / "tokenizer.json").write_text('{"model": 3}')
    capsys.readouterr()
    assert main(["circuit", str(d), "0", "0", "--kind", "qk", "--rows", "cat", "--cols", "1"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "'cat' is not in the vocabulary" in line
    assert "tokenizer is unusable" in line and "tokenizer.json" in line and "token ids" in line


def test_in_the_explorer_native_stderr_text_never_reaches_the_screen() -> None:
    """Textual draws on fd 2, where a Rust panic hook writes too: while the app runs, it
    draws on a duplicate of the terminal and fd 2 goes to /dev/null (tui.app.screen_off_fd2)."""
    import pty
    import subprocess

    code = ("import os, sys\n"
            "from headscope.tui.app import screen_off_fd2\n"
            "with screen_off_fd2():\n"
            "    sys.__stderr__.write('SCREEN\\n'); sys.__stderr__.flush()\n"
            "    os.write(2, b'thread panicked at onig\\n')\n"
            "os.write(2, b'AFTER\\n')\n")
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=follower, timeout=60)
        os.close(follower)
        follower = -1
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the child's side is closed
            while chunk := os.read(leader, 4096):
                seen += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert done.returncode == 0
    assert b"SCREEN" in seen and b"AFTER" in seen and b"panicked" not in seen
