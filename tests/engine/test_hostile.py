"""Hostile and broken inputs: each is refused with its typed error and a message
that names the problem; nothing crashes, hangs, executes code or reads outside the model
directory. Ends with hypothesis fuzzing of the header parser and of config validation.

The corpus of broken checkpoints is reusable: ``BROKEN`` maps a case name to a builder
``builder(tmp_path, sources) -> Broken`` (what to open, the expected error class, a regex
fragment of its message and the file the message must name); ``sources`` is the
``corpus_sources`` fixture (import it into a test module to use it). The TUI and CLI tests
(tests/e2e/test_explorer_hostile.py, tests/e2e/test_cli_hostile.py) open every case of it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as st_load
from safetensors.torch import load_file, save_file

from headscope.engine.core.errors import (
    ConfigError,
    CorruptFileError,
    HeadscopeError,
    MissingTensorError,
    ShapeMismatchError,
    UnknownArchitectureError,
    UnsafeFormatError,
    UnsafePathError,
    UnsupportedFormatError,
)
from headscope.engine.formats.safetensors import parse_header_bytes, read_header
from headscope.engine.model.loading import inspect_checkpoint, load_model, read_structure
from tests import hf_fixtures as hf

INDEX_FILE_NAME = "model.safetensors.index.json"


def safetensors_bytes(header: dict[str, Any] | bytes, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- the corpus: healthy sources and what breaks them ----------------------------------------


@dataclass(frozen=True)
class Broken:
    """One broken checkpoint: opening ``path`` must raise ``error`` whose one-line message
    matches the regex ``fragment`` and contains ``names`` (the file, or the name, at fault)."""

    path: Path | str
    error: type[HeadscopeError]
    fragment: str
    names: str


class Sources:
    """The healthy tiny checkpoints the corpus breaks (copies only: never modify these)."""

    def __init__(self, families: dict[str, Path], base: Path) -> None:
        self._families = families
        self._base = base

    @property
    def gpt2(self) -> Path:
        return self._families["gpt2"]

    @property
    def llama(self) -> Path:
        return self._families["llama"]

    @property
    def qwen2(self) -> Path:
        return self._families["qwen2"]

    @cached_property
    def native(self) -> Path:
        """The bundled native attn-only-2l with its config only in headscope.json (not in the
        safetensors metadata, which would take precedence)."""
        d = copy_of(Path(__file__).resolve().parents[2] / "sample_models" / "attn-only-2l",
                    self._base / "native")
        tensors = load_file(str(d / "model.safetensors"))
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        return d

    @cached_property
    def sharded(self) -> Path:
        """A GPT-2 saved in several shards with a model.safetensors.index.json."""
        return hf.build_gpt2(self._base / "sharded", shard=True, tokenizer=False)[0]


@pytest.fixture(scope="session")
def corpus_sources(
    tmp_path_factory: pytest.TempPathFactory,
    gpt2_dir: tuple[Path, Any],
    llama_dir: tuple[Path, Any],
    qwen2_dir: tuple[Path, Any],
) -> Sources:
    families = {"gpt2": gpt2_dir[0], "llama": llama_dir[0], "qwen2": qwen2_dir[0]}
    return Sources(families, tmp_path_factory.mktemp("corpus-sources"))


Builder = Callable[[Path, Sources], Broken]
BROKEN: dict[str, Builder] = {}


def broken(name: str) -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        BROKEN[name] = builder
        return builder

    return register


def build_broken(name: str, tmp_path: Path, sources: Sources) -> Broken:
    """Build case ``name`` of the corpus in a fresh directory under ``tmp_path``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    return BROKEN[name](tmp_path, sources)


# --- safetensors header corpus --------------------------------------------------------------


HEADER_CASES = {
    "truncated_length": (b"\x10\x00\x00", CorruptFileError, "truncated"),
    "bad_header_length": (struct.pack("<Q", 2**62) + b"{}", CorruptFileError, "bad header length"),
    "header_longer_than_file": (struct.pack("<Q", 500) + b"{}", CorruptFileError, "truncated"),
    "bad_json": (safetensors_bytes(b'{"a": {"dtype": "F32",'), CorruptFileError, "bad JSON"),
    "not_utf8": (safetensors_bytes(b'{"\xff": 1}'), CorruptFileError, "bad JSON"),
    "not_an_object": (safetensors_bytes(b"[1, 2]"), CorruptFileError, "bad JSON"),
    "duplicate_key": (
        safetensors_bytes(
            b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
            b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
            b"\0" * 4,
        ),
        CorruptFileError,
        "duplicate",
    ),
    "unknown_dtype": (
        safetensors_bytes({"a": entry("F17", [2], 0, 8)}, b"\0" * 8),
        CorruptFileError,
        "unknown dtype",
    ),
    "shape_byte_mismatch": (
        safetensors_bytes({"a": entry("F32", [3], 0, 8)}, b"\0" * 8),
        CorruptFileError,
        "shape/byte mismatch",
    ),
    "negative_dim": (
        safetensors_bytes({"a": entry("F32", [-1], 0, 8)}, b"\0" * 8),
        CorruptFileError,
        "invalid shape",
    ),
    "bool_dim": (
        safetensors_bytes({"a": entry("F32", [True], 0, 4)}, b"\0" * 4),
        CorruptFileError,
        "invalid shape",
    ),
    "overlapping_offsets": (
        safetensors_bytes(
            {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, b"\0" * 12
        ),
        CorruptFileError,
        "overlapping",
    ),
    "gap_in_offsets": (
        safetensors_bytes(
            {"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12
        ),
        CorruptFileError,
        "gap",
    ),
    "offsets_past_end": (
        safetensors_bytes({"a": entry("F32", [4], 0, 16)}, b"\0" * 8),
        CorruptFileError,
        "truncated",
    ),
    "trailing_bytes": (
        safetensors_bytes({"a": entry("F32", [1], 0, 4)}, b"\0" * 9),
        CorruptFileError,
        "after the last",
    ),
    "bad_metadata": (
        safetensors_bytes({"__metadata__": {"k": 1}}),
        CorruptFileError,
        "__metadata__",
    ),
    "torch_save_zip": (b"PK\x03\x04" + b"\0" * 60, UnsafeFormatError, "pickle"),
    "raw_pickle": (pickle.dumps({"a": 1}, protocol=4), UnsafeFormatError, "pickle"),
}


def _header_case(case: str) -> Builder:
    """A Hugging Face GPT-2 directory whose model.safetensors is the broken blob."""

    def build(tmp_path: Path, sources: Sources) -> Broken:
        blob, error, fragment = HEADER_CASES[case]
        d = copy_of(sources.gpt2, tmp_path / f"header-{case}")
        f = d / "model.safetensors"
        f.write_bytes(blob)
        return Broken(d, error, fragment, str(f))

    return build


for _case in HEADER_CASES:
    BROKEN[f"header_{_case}"] = _header_case(_case)


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_broken_safetensors_file_is_refused(tmp_path: Path, case: str) -> None:
    blob, error, fragment = HEADER_CASES[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(blob)
    with pytest.raises(error, match=fragment) as info:
        read_header(path)
    assert str(path) in str(info.value)  # the one line names the file
    with pytest.raises(error, match=fragment):
        parse_header_bytes(blob)


@broken("truncated")
def truncated_checkpoint(tmp_path: Path, sources: Sources) -> Broken:
    """A half-finished download: the last 100 bytes of tensor data are missing."""
    d = copy_of(sources.gpt2, tmp_path / "trunc")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    return Broken(d, CorruptFileError, "truncated", str(f))


def test_truncated_checkpoint_is_detected_at_open(tmp_path: Path, corpus_sources: Sources) -> None:
    d = truncated_checkpoint(tmp_path, corpus_sources).path
    with pytest.raises(CorruptFileError, match="truncated"):
        read_structure(d)
    with pytest.raises(CorruptFileError, match="truncated"):
        load_model(d)


# --- sharded checkpoints: paths and shards -------------------------------------------------


def _rewrite_index(d: Path, edit: Any) -> Path:
    index = d / "model.safetensors.index.json"
    obj = json.loads(index.read_text())
    edit(obj["weight_map"])
    index.write_text(json.dumps(obj))
    return d


def _index(d: Path) -> Path:
    return d / "model.safetensors.index.json"


def _first_shard(d: Path) -> str:
    return sorted(
        json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values()
    )[0]


@broken("path_escaping_shard")
def path_escaping_shard(tmp_path: Path, sources: Sources) -> Broken:
    d = copy_of(sources.sharded, tmp_path / "m")
    shard = _first_shard(d)
    shutil.copy(
        d / shard, tmp_path / "outside.safetensors"
    )  # a real file, so only the path is wrong
    _rewrite_index(
        d, lambda wm: wm.update({k: "../outside.safetensors" for k, v in wm.items() if v == shard})
    )
    return Broken(d, UnsafePathError, r"escapes the model directory", str(_index(d)))


def test_path_escaping_shard_index_is_refused(tmp_path: Path, corpus_sources: Sources) -> None:
    d = path_escaping_shard(tmp_path, corpus_sources).path
    with pytest.raises(UnsafePathError, match=r"escapes the model directory"):
        read_structure(d)


@broken("absolute_shard_path")
def absolute_shard_path(tmp_path: Path, sources: Sources) -> Broken:
    d = copy_of(sources.sharded, tmp_path / "m")
    target = str((d / _first_shard(d)).resolve())
    _rewrite_index(d, lambda wm: wm.update({k: target for k in list(wm)[:1]}))
    return Broken(d, UnsafePathError, "absolute", str(_index(d)))


def test_absolute_shard_path_is_refused(tmp_path: Path, corpus_sources: Sources) -> None:
    d = absolute_shard_path(tmp_path, corpus_sources).path
    with pytest.raises(UnsafePathError, match="absolute"):
        load_model(d)


@broken("symlinked_shard")
def symlinked_shard(tmp_path: Path, sources: Sources) -> Broken:
    d = copy_of(sources.sharded, tmp_path / "m")
    shard = _first_shard(d)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(d / shard, outside)
    (d / shard).symlink_to(outside)
    return Broken(d, UnsafePathError, "symlink leading outside", str(_index(d)))


def test_symlinked_shard_leading_out_is_refused(tmp_path: Path, corpus_sources: Sources) -> None:
    d = symlinked_shard(tmp_path, corpus_sources).path
    with pytest.raises(UnsafePathError, match="symlink leading outside"):
        read_structure(d)


def test_symlink_inside_directory_and_hf_cache_layout_are_allowed(
    tmp_path: Path, corpus_sources: Sources
) -> None:
    sharded_dir = corpus_sources.sharded
    # Hugging Face cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in sharded_dir.iterdir():
        shutil.copy(f, blobs / f"blob-{f.name}")
        (snap / f.name).symlink_to(Path("../../blobs") / f"blob-{f.name}")
    assert read_structure(snap)["n_params"] == read_structure(sharded_dir)["n_params"]


@broken("missing_shard")
def missing_shard(tmp_path: Path, sources: Sources) -> Broken:
    d = copy_of(sources.sharded, tmp_path / "m")
    shard = _first_shard(d)
    (d / shard).unlink()
    return Broken(d, CorruptFileError, f"missing shard '{shard}'", str(_index(d)))


def test_missing_shard_is_named(tmp_path: Path, corpus_sources: Sources) -> None:
    case = missing_shard(tmp_path, corpus_sources)
    with pytest.raises(CorruptFileError, match=case.fragment):
        load_model(case.path)


@broken("index_points_at_wrong_shard")
def index_points_at_wrong_shard(tmp_path: Path, sources: Sources) -> Broken:
    d = copy_of(sources.sharded, tmp_path / "m")
    shards = sorted(
        set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values())
    )

    def swap(wm: dict[str, str]) -> None:
        name = next(k for k, v in wm.items() if v == shards[0])
        wm[name] = shards[1]

    _rewrite_index(d, swap)
    return Broken(d, CorruptFileError, "does not contain it", str(_index(d)))


def test_index_pointing_at_wrong_shard_is_refused(tmp_path: Path, corpus_sources: Sources) -> None:
    d = index_points_at_wrong_shard(tmp_path, corpus_sources).path
    with pytest.raises(CorruptFileError, match="does not contain it"):
        read_structure(d)


# --- unsafe formats ------------------------------------------------------------------------


@broken("pickle_file")
def pickle_file(tmp_path: Path, sources: Sources) -> Broken:
    f = tmp_path / "pickled" / "model.pt"
    f.parent.mkdir()
    f.write_bytes(pickle.dumps({"x": 1}))
    return Broken(f, UnsafeFormatError, r"pickle.*safetensors.*trusted environment", str(f))


@broken("pickle_only_directory")
def pickle_only_directory(tmp_path: Path, sources: Sources) -> Broken:
    d = tmp_path / "hf_pickle_only"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))
    return Broken(d, UnsafeFormatError, r"only pickle-based weights.*pytorch_model\.bin", str(d))


def test_pickle_files_are_refused_with_advice(tmp_path: Path, corpus_sources: Sources) -> None:
    for name in ("pytorch_model.bin", "model.pt", "model.pth", "model.ckpt", "weights.pkl"):
        f = tmp_path / name
        f.write_bytes(pickle.dumps({"x": 1}))
        with pytest.raises(UnsafeFormatError, match="pickle") as info:
            load_model(f)
        assert "safetensors" in str(info.value) and "trusted environment" in str(info.value)
    d = pickle_only_directory(tmp_path, corpus_sources).path
    with pytest.raises(UnsafeFormatError, match=r"only pickle-based weights.*pytorch_model\.bin"):
        read_structure(d)


def _remote_code(key: str, value: Any) -> Builder:
    def build(tmp_path: Path, sources: Sources) -> Broken:
        d = copy_of(sources.gpt2, tmp_path / key)
        cfg = json.loads((d / "config.json").read_text())
        cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
        return Broken(d, UnsafeFormatError, "remote code", str(d / "config.json"))

    return build


REMOTE_CODE_CASES = {
    "auto_map": {"AutoModel": "modeling_evil.EvilModel"},
    "trust_remote_code": True,
}
for _key, _value in REMOTE_CODE_CASES.items():
    BROKEN[f"remote_code_{_key}"] = _remote_code(_key, _value)


def test_remote_code_is_refused(tmp_path: Path, corpus_sources: Sources) -> None:
    for key in REMOTE_CODE_CASES:
        d = BROKEN[f"remote_code_{key}"](tmp_path, corpus_sources).path
        with pytest.raises(UnsafeFormatError, match="remote code"):
            load_model(d)


@pytest.mark.parametrize("name", ["gpt2", "openai-community/gpt2", "EleutherAI/pythia-70m"])
def test_hub_names_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafeFormatError, match=r"Hub name.*never downloads"):
        read_structure(name)


@broken("hub_name")
def hub_name(tmp_path: Path, sources: Sources) -> Broken:
    # No such directory exists relative to the working directory of the tests (the repo).
    name = "EleutherAI/pythia-70m"
    assert not Path(name).exists()
    return Broken(name, UnsafeFormatError, r"Hub name.*never downloads", name)


@broken("no_such_path")
def no_such_path(tmp_path: Path, sources: Sources) -> Broken:
    p = tmp_path / "nope" / "model"
    return Broken(p, UnsupportedFormatError, "no such file", str(p))


@broken("not_a_checkpoint")
def not_a_checkpoint(tmp_path: Path, sources: Sources) -> Broken:
    f = tmp_path / "notes.txt"
    f.write_text("hi")
    return Broken(f, UnsupportedFormatError, "not a checkpoint", str(f))


@broken("empty_directory")
def empty_directory(tmp_path: Path, sources: Sources) -> Broken:
    d = tmp_path / "empty"
    d.mkdir()
    return Broken(d, UnsupportedFormatError, "no safetensors", str(d))


def test_missing_path_and_unknown_files(tmp_path: Path, corpus_sources: Sources) -> None:
    for build in (no_such_path, not_a_checkpoint, empty_directory):
        case = build(tmp_path, corpus_sources)
        with pytest.raises(case.error, match=case.fragment):
            read_structure(case.path)


@broken("safetensors_without_config")
def safetensors_without_config(tmp_path: Path, sources: Sources) -> Broken:
    d = tmp_path / "no_config"
    d.mkdir()
    save_file({"x": torch.zeros(2)}, str(d / "model.safetensors"))
    return Broken(d, UnsupportedFormatError, "no config", str(d))


def test_safetensors_without_any_config(tmp_path: Path, corpus_sources: Sources) -> None:
    d = safetensors_without_config(tmp_path, corpus_sources).path
    with pytest.raises(UnsupportedFormatError, match="no config"):
        read_structure(d)


# --- config.json validation ---------------------------------------------------------------


def _with_config(src: Path, dst: Path, **changes: Any) -> Path:
    d = copy_of(src, dst)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is _DELETE:
            cfg.pop(k)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


_DELETE = object()

CONFIG_CASES = {
    "unsupported_architecture": (
        {"architectures": ["MambaForCausalLM"], "model_type": "mamba"},
        UnknownArchitectureError,
        r"MambaForCausalLM; supported: .*GPT2LMHeadModel.*LlamaForCausalLM",
    ),
    "missing_field": ({"n_layer": _DELETE}, ConfigError, "missing n_layer"),
    "zero_heads": ({"n_head": 0}, ConfigError, "n_head must be >= 1"),
    "negative_vocab": ({"vocab_size": -5}, ConfigError, "vocab_size must be >= 1"),
    "string_size": ({"n_embd": "32"}, ConfigError, "must be an integer"),
    "indivisible_heads": ({"n_head": 5}, ConfigError, "not divisible by n_heads 5"),
    "nan_eps": ({"layer_norm_epsilon": float("nan")}, ConfigError, "finite number"),
    "absurd_layers": ({"n_layer": 10**12}, ConfigError, "n_layers 1000000000000"),
    "config_shape_disagrees": (
        {"n_positions": 64},
        ShapeMismatchError,
        r"\[48, 32\], expected \[64, 32\]",
    ),
}


def _config_case(case: str) -> Builder:
    def build(tmp_path: Path, sources: Sources) -> Broken:
        changes, error, fragment = CONFIG_CASES[case]
        d = _with_config(sources.gpt2, tmp_path / case, **changes)
        # The config disagreeing with a tensor's shape is reported on the weights file.
        at_fault = "model.safetensors" if error is ShapeMismatchError else "config.json"
        return Broken(d, error, fragment, str(d / at_fault))

    return build


for _case in CONFIG_CASES:
    BROKEN[f"config_{_case}"] = _config_case(_case)


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_is_refused(tmp_path: Path, corpus_sources: Sources, case: str) -> None:
    _, error, fragment = CONFIG_CASES[case]
    d = BROKEN[f"config_{case}"](tmp_path, corpus_sources).path
    with pytest.raises(error, match=fragment):
        read_structure(d)


@broken("gqa_heads_not_divisible")
def gqa_heads_not_divisible(tmp_path: Path, sources: Sources) -> Broken:
    d = _with_config(sources.llama, tmp_path / "gqa", num_key_value_heads=3)
    return Broken(
        d, ConfigError, "n_heads 4 is not divisible by n_kv_heads 3", str(d / "config.json")
    )


def test_gqa_heads_not_divisible(tmp_path: Path, corpus_sources: Sources) -> None:
    d = gqa_heads_not_divisible(tmp_path, corpus_sources).path
    with pytest.raises(ConfigError, match="n_heads 4 is not divisible by n_kv_heads 3"):
        read_structure(d)


@broken("config_json_not_json")
def config_json_not_json(tmp_path: Path, sources: Sources) -> Broken:
    d = copy_of(sources.gpt2, tmp_path / "m")
    (d / "config.json").write_text("{not json")
    return Broken(d, ConfigError, r"config\.json", str(d / "config.json"))


def test_config_json_not_json(tmp_path: Path, corpus_sources: Sources) -> None:
    d = config_json_not_json(tmp_path, corpus_sources).path
    with pytest.raises(ConfigError, match=r"config\.json"):
        read_structure(d)


# --- special files, duplicate index entries, layer bombs, values the math cannot use ------
# (issue 13's round: each case is a corpus entry, so the CLI and the explorer open it too)


def _fifo(path: Path) -> Path:
    """Replace ``path`` by a FIFO nobody writes to: reading it would block forever."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _dev_zero(path: Path) -> Path:
    """Replace ``path`` by a symlink to /dev/zero: reading it would never end."""
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
    return path


SPECIAL_FILE_CASES = {
    # case: (source family, file replaced, how, error, fragment)
    "config_fifo": ("gpt2", "config.json", _fifo, ConfigError, "FIFO"),
    "config_dev_zero": ("gpt2", "config.json", _dev_zero, UnsafePathError, "symlink leading outside"),
    "config_directory": ("gpt2", "config.json", None, ConfigError, "a directory"),
    "weights_fifo": ("gpt2", "model.safetensors", _fifo, CorruptFileError, "not a regular file"),
    "index_fifo": ("sharded", INDEX_FILE_NAME, _fifo, CorruptFileError, "FIFO"),
    "index_directory": ("sharded", INDEX_FILE_NAME, None, CorruptFileError, "a directory"),
    "native_json_fifo": ("native", "headscope.json", _fifo, ConfigError, "FIFO"),
    "native_json_outside": ("native", "headscope.json", lambda p: _outside_link(p),
                            UnsafePathError, "symlink leading outside"),
    "config_outside": ("gpt2", "config.json", lambda p: _outside_link(p), UnsafePathError,
                       "symlink leading outside"),
}


def _outside_link(path: Path) -> Path:
    """Replace ``path`` by a symlink to a copy of it outside the model directory."""
    outside = path.parent.parent / f"outside-{path.name}"
    shutil.copy(path, outside)
    path.unlink()
    path.symlink_to(outside)
    return path


def _special_file_case(case: str) -> Builder:
    def build(tmp_path: Path, sources: Sources) -> Broken:
        family, name, how, error, fragment = SPECIAL_FILE_CASES[case]
        d = copy_of(getattr(sources, family), tmp_path / case)
        target = d / name
        if how is None:  # a directory in the file's place
            target.unlink()
            target.mkdir()
        else:
            how(target)
        return Broken(d, error, fragment, str(target))

    return build


for _case in SPECIAL_FILE_CASES:
    BROKEN[f"special_{_case}"] = _special_file_case(_case)


@pytest.mark.timeout(30)  # a regression would block on the FIFO: fail, do not hang
@pytest.mark.parametrize("case", list(SPECIAL_FILE_CASES))
def test_special_files_are_refused_without_reading_them(
    tmp_path: Path, corpus_sources: Sources, case: str
) -> None:
    b = BROKEN[f"special_{case}"](tmp_path, corpus_sources)
    with pytest.raises(b.error, match=b.fragment) as info:
        read_structure(b.path)
    assert b.names in str(info.value)


@broken("index_lists_tensor_twice")
def index_lists_tensor_twice(tmp_path: Path, sources: Sources) -> Broken:
    """The same tensor under two shards in weight_map: which one wins must not be a guess."""
    d = copy_of(sources.sharded, tmp_path / "dup")
    index = json.loads(_index(d).read_text())
    shards = sorted(set(index["weight_map"].values()))
    tensor = next(t for t, s in index["weight_map"].items() if s == shards[0])
    body = json.dumps(index["weight_map"])[1:-1]
    _index(d).write_text(
        '{"metadata": {}, "weight_map": {' + body + f', "{tensor}": "{shards[-1]}"' + "}}"
    )
    return Broken(d, CorruptFileError, f"duplicate key '{re.escape(tensor)}'", str(_index(d)))


LAYER_BOMB_TENSORS = 20_000


@broken("layer_bomb")
def layer_bomb(tmp_path: Path, sources: Sources) -> Broken:
    """n_layer as large as the header's tensor count, the tensors all empty: refused from the
    header's parameter count before anything is built per layer."""
    d = copy_of(sources.gpt2, tmp_path / "bomb")
    header = {f"t{i}": entry("F32", [0], 0, 0) for i in range(LAYER_BOMB_TENSORS)}
    (d / "model.safetensors").write_bytes(safetensors_bytes(header))
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_layer"] = LAYER_BOMB_TENSORS // 2
    (d / "config.json").write_text(json.dumps(cfg))
    return Broken(d, ConfigError, r"n_layers 10000 .* holds only 0", str(d / "config.json"))


def test_layer_bomb_is_refused_before_building_layers(
    tmp_path: Path, corpus_sources: Sources, monkeypatch: pytest.MonkeyPatch
) -> None:
    import headscope.engine.model.adapters.gpt2 as gpt2_adapter

    def no_specs(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("per-layer specs built for a layer bomb")

    monkeypatch.setattr(gpt2_adapter, "specs", no_specs)
    b = layer_bomb(tmp_path, corpus_sources)
    with pytest.raises(ConfigError, match=b.fragment):
        read_structure(b.path)


# Values that pass a type check but make the math non-finite (or raise deep inside it).
def _rope(**params: Any) -> dict[str, Any]:
    """transformers >= 5 writes rope_parameters (read before the older rope_theta/rope_scaling)."""
    return {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, **params}}


MATH_CONFIG_CASES = {
    "rope_theta_tiny": ("llama", _rope(rope_theta=1e-300), r"rope_theta .* got 1e-300"),
    "rope_theta_string": ("llama", _rope(rope_theta="10000"), r"rope_theta must be a finite number"),
    "rope_theta_huge_int": ("llama", _rope(rope_theta=10**400), r"rope_theta"),
    "rope_theta_old_key_tiny": ("llama", {"rope_parameters": None, "rope_theta": 1e-300},
                                r"rope_theta .* got 1e-300"),
    "rope_factor_zero": ("llama", _rope(rope_type="linear", factor=0), r"parameter factor .* got 0"),
    "rope_factor_string": ("llama", _rope(rope_type="linear", factor="x"), r"parameter factor .* 'x'"),
    "rope_llama3_high_not_above_low": (
        "llama",
        _rope(rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=4.0,
              original_max_position_embeddings=32),
        r"high_freq_factor .* must be greater than low_freq_factor",
    ),
    "rope_llama3_missing": ("llama", _rope(rope_type="llama3", factor=8.0), r"needs the parameter low_freq_factor"),
    "sliding_window_negative": ("llama", {"sliding_window": -1}, r"sliding_window .* got -1"),
    "sliding_window_string": ("llama", {"sliding_window": "4k"}, r"sliding_window"),
    "partial_rotary_huge": ("llama", {"partial_rotary_factor": 1e308}, r"partial_rotary_factor must be in"),
    "partial_rotary_negative": ("llama", {"partial_rotary_factor": -0.5}, r"partial_rotary_factor must be in"),
    "norm_eps_huge": ("gpt2", {"layer_norm_epsilon": 1e300}, r"norm_eps .* got 1e\+300"),
    "attn_scale_zero": ("native", {"attn_scale": 0}, r"attn_scale must be a finite number > 0"),
    "attn_scale_nan": ("native", {"attn_scale": float("nan")}, r"attn_scale must be a finite number > 0"),
    "attn_scale_string": ("native", {"attn_scale": "8"}, r"attn_scale must be a number"),
    "n_types_string": ("native", {"extra": {"n_types": "two"}}, r"n_types"),
}


def _native_with(src: Path, dst: Path, changes: dict[str, Any]) -> Path:
    d = copy_of(src, dst)
    path = d / "headscope.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))
    return d


def _math_config_case(case: str) -> Builder:
    def build(tmp_path: Path, sources: Sources) -> Broken:
        family, changes, fragment = MATH_CONFIG_CASES[case]
        if family == "native":
            d = _native_with(sources.native, tmp_path / case, changes)
            return Broken(d, ConfigError, fragment, str(d / "headscope.json"))
        d = _with_config(getattr(sources, family), tmp_path / case, **changes)
        return Broken(d, ConfigError, fragment, str(d / "config.json"))

    return build


for _case in MATH_CONFIG_CASES:
    BROKEN[f"math_{_case}"] = _math_config_case(_case)


@pytest.mark.parametrize("case", list(MATH_CONFIG_CASES))
def test_config_values_the_math_cannot_use_are_refused(
    tmp_path: Path, corpus_sources: Sources, case: str
) -> None:
    b = BROKEN[f"math_{case}"](tmp_path, corpus_sources)
    with pytest.raises(ConfigError, match=b.fragment) as info:
        read_structure(b.path)
    assert b.names in str(info.value)


# --- tensors: missing, wrong shape, NaN ---------------------------------------------------


def _edit_tensors(src: Path, dst: Path, edit: Any) -> Path:
    d = copy_of(src, dst)
    tensors = load_file(str(d / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@broken("missing_tensor")
def missing_tensor(tmp_path: Path, sources: Sources) -> Broken:
    d = _edit_tensors(
        sources.llama, tmp_path / "m", lambda t: t.pop("model.layers.1.self_attn.k_proj.weight")
    )
    return Broken(
        d,
        MissingTensorError,
        r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight'",
        str(d / "model.safetensors"),
    )


def test_missing_tensor_is_named(tmp_path: Path, corpus_sources: Sources) -> None:
    d = missing_tensor(tmp_path, corpus_sources).path
    with pytest.raises(
        MissingTensorError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight'"
    ):
        load_model(d)


@broken("wrong_shape")
def wrong_shape(tmp_path: Path, sources: Sources) -> Broken:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32)  # as if no GQA

    d = _edit_tensors(sources.qwen2, tmp_path / "m", edit)
    return Broken(
        d,
        ShapeMismatchError,
        r"k_proj\.weight' has shape \[32, 32\], expected \[16, 32\]",
        str(d / "model.safetensors"),
    )


def test_wrong_shape_names_expected_and_found(tmp_path: Path, corpus_sources: Sources) -> None:
    d = wrong_shape(tmp_path, corpus_sources).path
    with pytest.raises(
        ShapeMismatchError, match=r"k_proj\.weight' has shape \[32, 32\], expected \[16, 32\]"
    ):
        load_model(d)


@broken("integer_weights")
def integer_weights(tmp_path: Path, sources: Sources) -> Broken:
    d = _edit_tensors(
        sources.gpt2,
        tmp_path / "m",
        lambda t: t.update({"transformer.ln_f.bias": torch.zeros(32, dtype=torch.int32)}),
    )
    return Broken(d, ConfigError, "only float weights", str(d / "model.safetensors"))


def test_integer_weights_are_refused(tmp_path: Path, corpus_sources: Sources) -> None:
    d = integer_weights(tmp_path, corpus_sources).path
    with pytest.raises(ConfigError, match="only float weights"):
        read_structure(d)


# Not an error: the checkpoint opens, and the heads whose weights hold NaN are flagged.
NAN_LAYER, NAN_HEAD = 1, 1


def nan_weights(tmp_path: Path, sources: Sources) -> Path:
    """GPT-2 with NaN in head ``NAN_HEAD`` of layer ``NAN_LAYER``'s W_Q (nothing else)."""

    def edit(t: dict[str, torch.Tensor]) -> None:
        d_head = hf.D_MODEL // hf.N_HEADS
        q_of_head = slice(NAN_HEAD * d_head, (NAN_HEAD + 1) * d_head)
        t[f"transformer.h.{NAN_LAYER}.attn.c_attn.weight"][0, q_of_head] = float("nan")

    return _edit_tensors(sources.gpt2, tmp_path / "nan", edit)


def test_nan_weights_load_without_crashing(tmp_path: Path, corpus_sources: Sources) -> None:
    m = load_model(nan_weights(tmp_path, corpus_sources), raw=True)
    assert np.isnan(m.weights.get_head("blocks.1.attn.W_Q", 1)).any()
    assert np.isfinite(m.weights.get_head("blocks.1.attn.W_Q", 0)).all()


def test_broken_tokenizer_falls_back_to_ids(tmp_path: Path, gpt2_dir: tuple[Path, Any]) -> None:
    d = copy_of(gpt2_dir[0], tmp_path / "m")
    (d / "tokenizer.json").write_text("{broken")
    m = load_model(d)
    assert m.tokenizer.encode("1 2") == [1, 2] and "tokenizer" in m.warnings[0]


def test_the_cli_says_why_token_ids_are_shown(tmp_path: Path, gpt2_dir: tuple[Path, Any],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from headscope.tui.cli.main import main

    d = copy_of(gpt2_dir[0], tmp_path / "m")
    (d / "tokenizer.json").write_text("{broken")
    assert main(["forward", str(d), "--tokens", "1,2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)  # stdout stays JSON; the warning is one stderr line
    assert err.startswith("headscope: warning: ") and "tokenizer.json" in err
    assert err.count("\n") == 1


# --- every case of the corpus, through the one entry point --------------------------------


@pytest.mark.parametrize("case", list(BROKEN))
def test_every_broken_checkpoint_is_one_typed_line_naming_the_file(
    tmp_path: Path, corpus_sources: Sources, case: str
) -> None:
    b = build_broken(case, tmp_path, corpus_sources)
    with pytest.raises(b.error, match=b.fragment) as info:
        load_model(b.path)
    message = str(info.value)
    assert "\n" not in message and b.names in message


# --- fuzzing -------------------------------------------------------------------------------

_SEED_BLOB: bytes | None = None


def _seed_blob() -> bytes:
    global _SEED_BLOB
    if _SEED_BLOB is None:
        with tempfile.TemporaryDirectory() as d:
            save_file(
                {
                    "a": torch.randn(2, 3),
                    "b": torch.randn(4).half(),
                    "c": torch.zeros(1, dtype=torch.bfloat16),
                },
                f"{d}/x.safetensors",
                metadata={"headscope_config": "{}"},
            )
            _SEED_BLOB = Path(f"{d}/x.safetensors").read_bytes()
    return _SEED_BLOB


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.just(0)),
)


def _mutate(blob: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(blob)
    for op, pos, value in ops:
        i = pos % (len(b) + 1)
        if op == "flip" and b:
            b[i % len(b)] = value
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b.insert(i, value)
        elif op == "delete" and b:
            del b[i % len(b)]
    return bytes(b)


def _reference_accepts(blob: bytes) -> bool:
    try:
        st_load(blob)
    except Exception:
        return False
    return True


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def fuzz_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fuzz")
    return {
        "gpt2": hf.build_gpt2(base / "gpt2", tokenizer=False)[0],
        "llama": hf.build_llama(base / "llama")[0],
        "neox": hf.build_neox(base / "neox")[0],
    }


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(family=st.sampled_from(["gpt2", "llama", "neox"]), data=st.data())
def test_fuzz_config_validation_gives_typed_error_or_valid_model(
    fuzz_dirs: dict[str, Path], family: str, data: st.DataObject
) -> None:
    src = fuzz_dirs[family]
    cfg = json.loads((src / "config.json").read_text())
    keys = sorted(cfg)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(
            st.sampled_from([*keys, "rope_parameters", "num_key_value_heads", "head_dim"])
        )
        cfg[key] = data.draw(json_value)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for f in src.iterdir():
            if f.name != "config.json":
                shutil.copy(f, d / f.name)  # copies: symlinks out of d would be refused
        (d / "config.json").write_text(json.dumps(cfg))
        try:
            ckpt = inspect_checkpoint(d)
        except HeadscopeError as e:
            assert "\n" not in str(e)
        else:
            c = ckpt.cfg
            assert (
                c.n_heads % c.kv_heads == 0 and min(c.n_layers, c.d_model, c.d_head, c.d_vocab) >= 1
            )
