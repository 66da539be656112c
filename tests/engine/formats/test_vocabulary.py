"""The default QK/OV token set (engine/formats/vocabulary.py): whole words a reader
recognises, one selection for GGUF metadata and a Hugging Face ``tokenizer.json``, picked on
first use rather than when the model opens (issue 39 §3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from headscope.engine.api.model import open_model
from headscope.engine.core.requests import CircuitRequest
from headscope.engine.formats.vocabulary import LazyIds, tokenizer_json_ids
from tests.hf_fixtures import VOCAB, llama_dir  # noqa: F401  (session-scoped pytest fixture)

SPECIAL = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(16)]
PIECES = ["▁t", "er", "▁the", "▁and", "▁été", "in", "▁was", "▁of", "▁house", "▁User"]


def sentencepiece_tokenizer(path: Path, n: int = VOCAB) -> Path:
    """A Llama-style ``tokenizer.json`` (SentencePiece converted to BPE with byte fallback, as
    ``transformers`` writes Llama's): <unk> <s> </s> and byte tokens first, special ``<s>``,
    ``</s>`` and ``▁User`` added, ids in the SentencePiece score order."""
    from tokenizers import AddedToken, Tokenizer, models

    tokens = SPECIAL + PIECES + [f"x{i}" for i in range(len(SPECIAL) + len(PIECES), n)]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[],
                               unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>", "▁User")])
    out = path / "tokenizer.json"
    tok.save(str(out))
    return out


def test_an_hf_llama_with_a_sentencepiece_tokenizer_shows_whole_words(llama_dir, tmp_path: Path) -> None:  # noqa: F811
    """Its default token set was the first 24 ids (<unk>, byte tokens): now the whole words in
    id order (a converted SentencePiece table is in score order), never special, byte or
    non-ASCII pieces nor word pieces under three letters; then the other normal tokens."""
    src, _ = llama_dir
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src / name, tmp_path / name)
    sentencepiece_tokenizer(tmp_path)
    m = open_model(tmp_path, raw=True)
    tokens = SPECIAL + PIECES
    words = [tokens.index(t) for t in ("▁the", "▁and", "▁was", "▁house")]  # not "▁of": 2 letters
    fill = [i for i in range(len(SPECIAL), VOCAB) if i not in words and i != tokens.index("▁User")][:20]
    assert m.structure()["default_tokens"] == words + fill
    block = m.get(CircuitRequest.of(m.structure(), 0, 0, "ov"))
    assert list(block.row_ids) == words + fill
    assert m.tokenizer.decode_token(block.row_ids[0]) == " the"


def test_a_unigram_tokenizer_json_ranks_by_score_and_bad_files_keep_the_first_ids(tmp_path: Path) -> None:
    vocab: list[list[Any]] = [["<unk>", 0.0], ["▁a", -1.0], ["▁dog", -3.0], ["▁the", -2.0], ["s", -0.5]]
    spec = {"model": {"type": "Unigram", "vocab": vocab}, "added_tokens": [{"id": 0, "special": True}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    assert tokenizer_json_ids(tmp_path / "tokenizer.json", 2, 5) == (3, 2)  # highest score first
    assert tokenizer_json_ids(tmp_path / "tokenizer.json", 2, 3) == (2, 1)  # ids past d_vocab left out
    for bad in ("{", '{"model": 3}', '{"model": {"vocab": {"▁dog": "x"}}}', "[]"):
        (tmp_path / "tokenizer.json").write_text(bad)
        assert tokenizer_json_ids(tmp_path / "tokenizer.json", 2, 5) == (), bad
    assert tokenizer_json_ids(tmp_path / "missing.json", 2, 5) == ()


def test_lazy_ids_are_computed_once_on_first_use_and_compare_as_a_list() -> None:
    calls = []
    ids = LazyIds(lambda: calls.append(1) or [3, 1])
    assert not ids.computed and not calls
    assert ids == [3, 1] and ids == (3, 1) and list(ids) == [3, 1] and ids[0] == 3 and len(ids) == 2
    assert ids.tolist() == [3, 1] and calls == [1]
    assert not LazyIds(list)
