"""Which adapter reads a ``config.json``: architecture name -> family module.

The one module that imports the families (each imports only ``adapters.base``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from headscope.engine.core.errors import ConfigError, UnknownArchitectureError, UnsafeFormatError
from headscope.engine.model.adapters import (
    bert,
    gemma,
    gpt2,
    gpt_neo,
    gptj,
    llama,
    mixtral,
    neox,
    opt,
    phi,
    phi3,
    qwen3,
)


def refuse_remote_code(config: Mapping[str, Any], path: str | None) -> None:
    """``auto_map`` / ``trust_remote_code`` would need the checkpoint's own Python code."""
    if config.get("auto_map") or config.get("trust_remote_code"):
        raise UnsafeFormatError(
            path,
            "config.json asks for remote code (auto_map/trust_remote_code); headscope never "
            "runs code shipped with a checkpoint. Supported architectures: "
            + ", ".join(supported_architectures()),
        )


# Every family, in the order a ``model_type`` is matched when ``architectures`` is absent.
FAMILIES: tuple[ModuleType, ...] = (gpt2, neox, llama, bert, gemma, qwen3, gpt_neo, mixtral,
                                    phi3, phi, gptj, opt)


# The families as README.md's "Supported checkpoints" table names them, in its order, with
# the architectures each reads (several share an adapter module: Gemma 1/2/3 are one). The
# CLI's --help lists these labels; tests/e2e/test_cli.py checks that the README's table has
# exactly these rows and that every architecture of every adapter is in one of them.
NATIVE_FAMILY = "headscope native"
FAMILY_TABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    (NATIVE_FAMILY, ()),  # engine/model/adapters/native.py: not read from a config.json
    ("GPT-2", gpt2.ARCHITECTURES),
    ("GPT-NeoX", neox.ARCHITECTURES),
    ("Llama family", llama.ARCHITECTURES),
    ("Qwen3", ("Qwen3ForCausalLM", "Qwen3Model")),
    ("OLMo2", ("Olmo2ForCausalLM", "Olmo2Model")),
    ("Gemma", ("GemmaForCausalLM", "GemmaModel")),
    ("Gemma 2", ("Gemma2ForCausalLM", "Gemma2Model")),
    ("Gemma 3 (text)", ("Gemma3ForCausalLM", "Gemma3TextModel")),
    ("Mixtral", mixtral.ARCHITECTURES),
    ("GPT-Neo", gpt_neo.ARCHITECTURES),
    ("BERT", bert.ARCHITECTURES),
    ("Phi-3", phi3.ARCHITECTURES),
    ("Phi", phi.ARCHITECTURES),
    ("GPT-J", gptj.ARCHITECTURES),
    ("OPT", opt.ARCHITECTURES),
)


def family_names() -> list[str]:
    """The supported families, as README.md's table names them."""
    return [name for name, _ in FAMILY_TABLE]


def _registry() -> dict[str, ModuleType]:
    return {arch: module for module in FAMILIES for arch in module.ARCHITECTURES}


def supported_architectures() -> list[str]:
    return sorted(_registry())


def adapter_for(config: Mapping[str, Any], path: str | None) -> tuple[str, ModuleType]:
    """The (architecture, adapter module) for an HF ``config.json``."""
    refuse_remote_code(config, path)
    table = _registry()
    archs = config.get("architectures")
    if archs is not None and (
        not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)
    ):
        raise ConfigError(
            path, f"config field architectures must be a list of names, got {archs!r}"
        )
    for arch in archs or []:
        if arch in table:
            return arch, table[arch]
    model_type = config.get("model_type")
    if not archs and isinstance(model_type, str):
        for arch, module in table.items():
            if model_type in module.MODEL_TYPES:
                return arch, module
    named = ", ".join(archs) if archs else f"model_type {model_type!r}"
    raise UnknownArchitectureError(
        path, f"unsupported architecture {named}; supported: {', '.join(supported_architectures())}"
    )
