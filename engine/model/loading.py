"""Open a checkpoint: format detection, safe paths, header validation, ``LoadedModel``.

``read_structure(path)`` answers "what is this model?" from the safetensors headers and
``config.json`` alone: it never imports torch and never reads tensor data.
``load_model(path)`` does the same checks and returns a ``LoadedModel`` whose weights are read
lazily, head by head, on first use.

Accepted inputs (README.md, "Supported checkpoints"):

- a directory with ``config.json`` and ``model.safetensors`` or a sharded
  ``model.safetensors.index.json`` (Hugging Face; GPT-2, GPT-NeoX, Llama/Mistral/Qwen2,
  BERT);
- a directory (or a single ``.safetensors`` file) in headscope's native layout: config in
  the ``headscope_config`` metadata key or a ``headscope.json`` beside the weights;
- a ``.safetensors`` file with a ``config.json`` beside it;
- a llama.cpp ``.gguf`` file (Llama, Qwen2/3, OLMo2, Phi-3, Gemma 1/2/3 architectures;
  engine.model.gguf_config, gguf_weights, engine.formats.gguf_tokenizer).

Refused with ``UnsafeFormatError``: pickle files (``.bin .pt .pth .ckpt .pkl``), configs
that need remote code, and hub names (nothing is ever downloaded).
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headscope.engine.core.config import ModelConfig
from headscope.engine.core.errors import (
    ConfigError,
    CorruptFileError,
    HeadscopeError,
    UnsafeFormatError,
    UnsafePathError,
    UnsupportedFormatError,
)
from headscope.engine.core.files import (
    MAX_CONFIG_BYTES,
    file_kind,
    os_reason,
    read_json_object,
    read_text,
)
from headscope.engine.core.validation import DEFAULT_BLOCK
from headscope.engine.formats.gguf import is_gguf, read_gguf_header
from headscope.engine.formats.safetensors import SafetensorsHeader, TensorInfo, read_header
from headscope.engine.formats.tokenizer import (
    TOKENIZER_FILES,
    IdTokenizer,
    Tokenizer,
    load_tokenizer,
)
from headscope.engine.formats.vocabulary import LazyIds, tokenizer_json_ids
from headscope.engine.model.adapters import native as native_adapter
from headscope.engine.model.adapters.base import (
    SpecMap,
    TensorNames,
    check_specs,
    count_params,
    spec_tensors,
    storage_dtype,
    validate_config,
)
from headscope.engine.model.adapters.registry import adapter_for, refuse_remote_code
from headscope.engine.model.caveats import model_caveats
from headscope.engine.model.weights import CheckpointWeights, WeightSource

if TYPE_CHECKING:
    from headscope.engine.model.gguf_weights import GGUFSource

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_PICKLE_ADVICE = (
    "pickle-based checkpoints can run arbitrary code when loaded, so headscope only reads "
    "safetensors; convert it in a trusted environment, e.g. "
    "`AutoModel.from_pretrained(dir).save_pretrained(out, safe_serialization=True)`"
)

STRUCTURE_KEYS = (
    "path", "format", "family", "architecture", "n_layers", "n_heads", "n_kv_heads", "d_model",
    "d_head", "d_vocab", "n_ctx", "d_mlp", "positional", "normalization", "n_params", "dtype",
    "tied_unembed", "has_mlm_head", "causal", "processed", "approximations", "default_tokens",
)  # fmt: skip


@dataclass(frozen=True)
class Checkpoint:
    """A resolved, validated checkpoint: everything but tensor data (no torch)."""

    path: Path  # what was opened (directory or file)
    directory: Path  # where weights, config and tokenizer live
    format: str  # "native" | "hf" | "gguf"
    cfg: ModelConfig  # as stored (n_params and dtype from the headers)
    specs: SpecMap
    files: dict[str, str]  # checkpoint tensor name -> file holding it
    headers: dict[str, SafetensorsHeader] = field(repr=False)
    gguf: GGUFSource | None = field(default=None, repr=False)  # GGUF files: where tensors come from
    # The QK/OV token set when the user names none, picked on its first use (None, or no
    # word in the vocabulary: the first ids). GGUF and tokenizer.json: whole words, as the
    # first ids there are <unk> and byte tokens (formats.vocabulary)
    default_tokens: LazyIds | None = None


def inspect_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Resolve and validate ``path`` from headers and config only (never imports torch)."""
    p = Path(path).expanduser()
    try:
        return _inspect(p, path)
    except HeadscopeError:
        raise
    except OSError as e:
        # e.g. a parent directory without search permission: stat() itself fails.
        where = e.filename if isinstance(e.filename, str) else p
        raise UnsupportedFormatError(where, f"cannot open: {os_reason(e)}") from None
    except ValueError as e:  # a NUL byte in the path (from the API; argv cannot hold one)
        raise UnsupportedFormatError(repr(os.fspath(path)), f"not a usable path: {e}") from None


def _inspect(p: Path, given: str | os.PathLike[str]) -> Checkpoint:
    try:
        p.stat()
    except FileNotFoundError:
        _missing_path(p, given)
    except NotADirectoryError:
        raise UnsupportedFormatError(p, "no such file or directory (a parent is a file)") from None
    if p.is_file():
        return _open_file(p)
    if p.is_dir():
        return _open_directory(p, p)
    raise UnsupportedFormatError(p, "not a regular file or directory")


def read_structure(path: str | os.PathLike[str], raw: bool = False) -> dict[str, Any]:
    """``LoadedModel.structure()`` from the header and config alone (no torch, no tensor reads)."""
    return structure_of(inspect_checkpoint(path), raw)


def structure_of(ckpt: Checkpoint, raw: bool) -> dict[str, Any]:
    cfg = ckpt.cfg
    out = {k: getattr(cfg, k) for k in STRUCTURE_KEYS if hasattr(cfg, k)}
    out.update(
        path=str(ckpt.path),
        format=ckpt.format,
        n_kv_heads=cfg.kv_heads,
        processed=not raw,
        approximations=model_caveats(cfg),
        # plain ids: the structure is plain data (JSON, the store's keys, a cluster's workers)
        default_tokens=None if ckpt.default_tokens is None else list(ckpt.default_tokens),
    )
    return {k: out[k] for k in STRUCTURE_KEYS}


class LazyTokenizer:
    """A checkpoint's tokenizer, read the first time something needs a token: commands and
    sweeps that never show one (``composition``, ``heads --no-behaviour``) skip reading and
    parsing ``tokenizer.json`` and importing ``tokenizers`` (35 ms of a 0.7 s GPT-2-small
    ``composition``). A broken tokenizer falls back to ids then, with its ``warning``."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self._ckpt = ckpt
        self._lock = threading.Lock()  # sweeps and the service read it from worker threads
        self._value: Tokenizer | None = None
        self.warning: str | None = None

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def get(self) -> Tokenizer:
        with self._lock:
            if self._value is None:
                try:
                    self._value = _tokenizer(self._ckpt)
                except (CorruptFileError, UnsafePathError) as e:
                    # A broken tokenizer must not hide the weights: fall back to ids, say so
                    # (prompt errors repeat the reason).
                    self.warning = str(e) + " (showing token ids instead)"
                    self._value = IdTokenizer(self._ckpt.cfg.d_vocab, str(self._ckpt.directory),
                                              reason=e.one_line())
            return self._value


@dataclass
class LoadedModel:
    """An open checkpoint: configs, weights (read lazily) and tokenizer (read when first
    used). What the sweeps, the service and the CLI compute on; the notebook conveniences
    (``circuit``, ``heads``, ``run``, ...) are the facade's subclass, ``engine.api.model.Model``."""

    path: Path
    cfg: ModelConfig  # of the weights as computed on (processed: LNPre/RMSPre)
    raw_cfg: ModelConfig  # as stored
    raw: bool
    weights: WeightSource
    lazy_tokenizer: LazyTokenizer = field(repr=False)  # shared by ``with_raw``'s copies
    checkpoint: Checkpoint = field(repr=False)
    raw_weights: CheckpointWeights = field(repr=False)
    _processed: WeightSource | None = field(default=None, repr=False)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.lazy_tokenizer.get()

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the model could not use so far, one line each: an unreadable tokenizer (token
        ids are shown instead) once something asked for a token."""
        return () if self.lazy_tokenizer.warning is None else (self.lazy_tokenizer.warning,)

    def structure(self) -> dict[str, Any]:
        return structure_of(self.checkpoint, self.raw)

    def with_raw(self, raw: bool) -> LoadedModel:
        """The same model, processed or raw; shares file handles and caches."""
        if raw == self.raw:
            return self
        weights = self.raw_weights if raw else self._processed_weights()
        return dataclasses.replace(
            self, raw=raw, weights=weights, cfg=weights.cfg, _processed=self._processed
        )

    def _processed_weights(self) -> WeightSource:
        if self._processed is None:
            self._processed = _process(self.raw_weights)
        return self._processed


def load_model(path: str | os.PathLike[str], raw: bool = False) -> LoadedModel:
    ckpt = inspect_checkpoint(path)
    raw_weights = _raw_weights(ckpt)
    processed = None if raw else _process(raw_weights)
    weights = raw_weights if processed is None else processed
    return LoadedModel(
        path=ckpt.path,
        cfg=weights.cfg,
        raw_cfg=ckpt.cfg,
        raw=raw,
        weights=weights,
        lazy_tokenizer=LazyTokenizer(ckpt),
        checkpoint=ckpt,
        raw_weights=raw_weights,
        _processed=processed,
    )


def _raw_weights(ckpt: Checkpoint) -> CheckpointWeights:
    if ckpt.gguf is not None:
        from headscope.engine.model.gguf_weights import GGUFWeights

        return GGUFWeights(ckpt.cfg, ckpt.specs, ckpt.gguf, path=str(ckpt.path))
    return CheckpointWeights(
        ckpt.cfg, ckpt.specs, ckpt.files, path=str(ckpt.path), headers=ckpt.headers
    )


def _tokenizer(ckpt: Checkpoint) -> Tokenizer:
    if ckpt.gguf is not None:
        from headscope.engine.formats.gguf_tokenizer import gguf_tokenizer

        return gguf_tokenizer(ckpt.gguf.header, ckpt.cfg.d_vocab)
    for name in TOKENIZER_FILES:
        _refuse_outside(ckpt.directory, ckpt.directory / name, name)
    return load_tokenizer(ckpt.directory, ckpt.cfg.d_vocab, ckpt.cfg.family)


def _process(raw: CheckpointWeights) -> WeightSource:
    from headscope.engine.model.processing import ProcessedWeights

    return ProcessedWeights(raw)


# --- format detection ----------------------------------------------------------------------

_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?")


def _missing_path(p: Path, given: str | os.PathLike[str]) -> None:
    text = os.fspath(given)
    # `org/name` whose `org` is a local folder is a local typo (sample_models/attn-only-2), not
    # a Hub name
    local = "/" in text and Path(text).parent.is_dir()
    if _HUB_NAME.fullmatch(text) and not p.suffix and not text.startswith(".") and not local:
        raise UnsafeFormatError(
            text,
            "no such file or directory; this looks like a Hugging Face Hub name, but headscope "
            "never downloads anything: download the checkpoint (safetensors) yourself and pass "
            "its directory",
        )
    raise UnsupportedFormatError(p, "no such file or directory")


def _open_file(p: Path) -> Checkpoint:
    name = p.name.lower()
    if name.endswith(PICKLE_SUFFIXES):
        raise UnsafeFormatError(
            p, f"refusing to load a pickle-based checkpoint ({p.suffix}): {_PICKLE_ADVICE}"
        )
    if name in ("config.json", native_adapter.CONFIG_FILE, INDEX_FILE):
        return _open_directory(p.parent, p.parent)
    if name.endswith(".gguf") or is_gguf(p):
        return _open_gguf(p)
    if not name.endswith(".safetensors"):
        raise UnsupportedFormatError(
            p,
            "not a checkpoint headscope can read (expected a .safetensors or .gguf file or a model directory)",
        )
    directory = p.parent
    header = read_header(p)
    headers = {str(p): header}
    files = {t: str(p) for t in header.tensors}
    return _build(p, directory, headers, files, main=str(p))


def _open_gguf(p: Path) -> Checkpoint:
    """A llama.cpp GGUF file, through the HF adapter of its family (engine.model.gguf_config)."""
    from headscope.engine.formats.gguf_tokenizer import readable_ids
    from headscope.engine.model import gguf_config as g
    from headscope.engine.model.gguf_weights import GGUFSource, check_types

    header = read_gguf_header(p)
    name, arch = g.arch_of(header)
    hf_names = g.hf_tensor_names(header, arch)
    config = g.hf_config(header, name, arch, hf_names)
    arch_name, module = adapter_for(config, str(p))
    tensors = g.virtual_tensors(header, hf_names)
    cfg, specs = module.adapt(config, arch_name, set(tensors), str(p))
    check_specs(specs, tensors, lambda t: str(p), cfg.architecture)
    used = {t: hf_names[t] for t in spec_tensors(specs)}
    g.check_all_used(header, used)
    check_types(header, used)
    cfg = cfg.replace(n_params=count_params(specs, tensors), dtype=g.main_dtype(header, used))
    validate_config(cfg, str(p))
    source = GGUFSource(header, used, arch, cfg)
    words = LazyIds(lambda: (i for i in readable_ids(header, DEFAULT_BLOCK) if i < cfg.d_vocab))
    return Checkpoint(p, p.parent, "gguf", cfg, specs, {}, {}, gguf=source, default_tokens=words)


def _open_directory(p: Path, shown: Path) -> Checkpoint:
    directory = p
    entries = sorted(directory.iterdir()) if os.access(directory, os.R_OK | os.X_OK) else None
    if entries is None:
        raise UnsupportedFormatError(directory, "directory is not readable")
    names = {e.name for e in entries}
    config = _read_config(directory / "config.json") if "config.json" in names else None
    if config is not None:
        refuse_remote_code(config, str(directory / "config.json"))

    if SINGLE_FILE in names:
        main = _inside(directory, SINGLE_FILE)
        header = read_header(main)
        headers, files = {str(main): header}, dict.fromkeys(header.tensors, str(main))
    elif INDEX_FILE in names:
        headers, files = _read_index(directory, directory / INDEX_FILE)
        main = directory / INDEX_FILE
    else:
        shards = [e for e in entries if e.name.endswith(".safetensors") and e.is_file()]
        if len(shards) == 1:
            main = _inside(directory, shards[0].name)
            header = read_header(main)
            headers, files = {str(main): header}, dict.fromkeys(header.tensors, str(main))
        else:
            pickles = [e.name for e in entries if e.name.lower().endswith(PICKLE_SUFFIXES)]
            if pickles:
                raise UnsafeFormatError(
                    directory,
                    f"only pickle-based weights here ({', '.join(pickles[:3])}): {_PICKLE_ADVICE}",
                )
            if shards:
                raise UnsupportedFormatError(
                    directory,
                    f"several .safetensors files but no {INDEX_FILE} saying how they fit together",
                )
            raise UnsupportedFormatError(directory, "no safetensors weights in this directory")
    return _build(shown, directory, headers, files, main=str(main), config=config)


def _build(
    shown: Path,
    directory: Path,
    headers: dict[str, SafetensorsHeader],
    files: dict[str, str],
    main: str,
    config: dict[str, Any] | None = None,
) -> Checkpoint:
    tensors: dict[str, TensorInfo] = {}
    for file, header in headers.items():
        for name, info in header.tensors.items():
            if files.get(name) == file:
                tensors[name] = info
    names = TensorNames(tensors, sum(t.numel for t in tensors.values()))
    first_meta = next(iter(headers.values())).metadata if headers else {}
    native_json = directory / native_adapter.CONFIG_FILE

    # exists(), not is_file(): a FIFO or device named like a config is refused by name
    # (engine.core.files), not skipped in silence.
    if native_adapter.CONFIG_KEY in first_meta or native_json.exists():
        fmt = "native"
        if native_adapter.CONFIG_KEY in first_meta:
            cfg_path, text = main, first_meta[native_adapter.CONFIG_KEY]
        else:
            _refuse_outside(directory, native_json, native_adapter.CONFIG_FILE)
            cfg_path, text = str(native_json), _read_text(native_json)
        fields = native_adapter.parse_config_json(text, cfg_path)
        cfg, specs = native_adapter.adapt(fields, names, cfg_path)
    else:
        if config is None:
            config_path = directory / "config.json"
            if not config_path.exists():
                raise UnsupportedFormatError(
                    shown,
                    f"no config: expected config.json or {native_adapter.CONFIG_FILE} beside the weights, "
                    f"or '{native_adapter.CONFIG_KEY}' in the safetensors metadata",
                )
            config = _read_config(config_path)
            refuse_remote_code(config, str(config_path))
        fmt = "hf"
        cfg_path = str(directory / "config.json")
        arch, module = adapter_for(config, cfg_path)
        cfg, specs = module.adapt(config, arch, names, cfg_path)

    cfg = cfg.replace(n_params=count_params(specs, tensors), dtype=storage_dtype(specs, tensors))
    validate_config(cfg, cfg_path)
    check_specs(specs, tensors, lambda t: files.get(t, main), cfg.architecture)
    words = None
    if fmt == "hf" and (directory / "tokenizer.json").is_file():
        words = LazyIds(partial(tokenizer_json_ids, directory / "tokenizer.json", DEFAULT_BLOCK, cfg.d_vocab))
    return Checkpoint(shown, directory, fmt, cfg, specs, files, headers, default_tokens=words)


# --- files inside the model directory ----------------------------------------------------


def _allowed_roots(directory: Path) -> list[Path]:
    root = directory.resolve()
    roots = [root]
    # The Hugging Face cache keeps files in snapshots/<rev>/ as symlinks into ../../blobs/:
    # those links stay inside the same cached repository, so they are allowed.
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def _inside(directory: Path, name: str, listed_in: Path | None = None) -> Path:
    """``directory / name``, refusing names and symlinks that lead out of the directory."""
    where = listed_in or directory
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnsafePathError(where, f"invalid shard file name {name!r}")
    pure = Path(name)
    if pure.is_absolute() or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise UnsafePathError(
            where, f"shard path {name!r} is absolute; shards must be inside the model directory"
        )
    if ".." in re.split(r"[/\\]", name):
        raise UnsafePathError(where, f"shard path {name!r} escapes the model directory ('..')")
    candidate = directory / pure
    resolved = candidate.resolve()
    if not any(resolved.is_relative_to(root) for root in _allowed_roots(directory)):
        raise UnsafePathError(
            where,
            f"shard {name!r} is a symlink leading outside the model directory (to {resolved})",
        )
    if not resolved.exists():
        raise CorruptFileError(where, f"missing shard {name!r} (incomplete download?)")
    if not resolved.is_file():
        kind = file_kind(resolved.stat().st_mode)
        raise CorruptFileError(candidate, f"{name!r} is {kind}, not a regular file")
    return candidate


def _read_index(
    directory: Path, index_path: Path
) -> tuple[dict[str, SafetensorsHeader], dict[str, str]]:
    _inside(directory, INDEX_FILE)
    index = _read_json(index_path, CorruptFileError, "sharded index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptFileError(index_path, "sharded index has no weight_map object")
    shard_names: dict[str, Path] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise CorruptFileError(
                index_path, f"weight_map entry for {tensor!r} is not a file name"
            )
        if shard not in shard_names:
            shard_names[shard] = _inside(directory, shard, listed_in=index_path)
    headers = {str(p): read_header(p) for p in shard_names.values()}
    files: dict[str, str] = {}
    for tensor, shard in weight_map.items():
        file = str(shard_names[shard])
        if tensor not in headers[file].tensors:
            raise CorruptFileError(
                index_path,
                f"index places tensor {tensor!r} in {shard!r}, which does not contain it",
            )
        files[tensor] = file
    return headers, files


def _read_text(path: Path) -> str:
    return read_text(path, MAX_CONFIG_BYTES, ConfigError, path.name)


def _read_json(
    path: Path, error: type[ConfigError] | type[CorruptFileError], what: str
) -> dict[str, Any]:
    return read_json_object(path, MAX_CONFIG_BYTES, error, what)


def _read_config(path: Path) -> dict[str, Any]:
    _refuse_outside(path.parent, path, "config.json")
    return _read_json(path, ConfigError, "config.json")


def _refuse_outside(directory: Path, path: Path, what: str) -> None:
    """A config or tokenizer file that is a symlink out of the model directory (and out of
    the Hugging Face cache's blobs) is not read, like a shard (``_inside``)."""
    if not path.is_symlink():
        return
    target = path.resolve()
    if not any(target.is_relative_to(root) for root in _allowed_roots(directory)):
        raise UnsafePathError(
            path, f"{what} is a symlink leading outside the model directory (to {target})"
        )
