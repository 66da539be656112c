"""The tokenizer of a GGUF file's metadata (engine/formats/gguf_tokenizer.py): BPE and SentencePiece against the HF tokenizers, built on the first prompt, or token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from headscope.engine.api.model import open_model
from tests.engine.formats import test_gguf
from tests.gguf_fixtures import (
    write_gguf,
)

llama_pair = test_gguf.llama_pair  # test_gguf's pytest fixture


def test_bpe_tokenizer_from_metadata(llama_pair, tmp_path: Path) -> None:
    _, model = llama_pair
    tokens = ["<unk>", "a", "b", "c", "Ġ", "ab", "Ġab", "Ġc"] + [f"t{i}" for i in range(8, 96)]
    merges = ["a b", "Ġ ab", "Ġ c"]
    m = open_model(write_gguf(model, tmp_path / "tok.gguf", tokens=tokens, merges=merges), raw=True)
    assert m.tokenizer.encode("ab ab c") == [5, 6, 7]
    assert [m.tokenizer.decode_token(i) for i in (5, 6)] == ["ab", " ab"]
    assert m.run("ab ab").logits.shape == (1, 2, 96)


@pytest.mark.parametrize(("pre", "ids"), [("llama-bpe", [8, 9]), (None, [6, 7, 5])])
def test_bpe_split_regex_follows_tokenizer_pre(pre: str | None, ids: list[int], llama_pair, tmp_path: Path) -> None:
    """Llama 3's split regex groups digits by three: "12345" is split "123" + "45" before the
    merges (GPT-2's regex keeps it whole, and the merge "3 4" then wins)."""
    tokens = ["<unk>", "1", "2", "3", "4", "5", "12", "34", "123", "45"] + [f"t{i}" for i in range(10, 96)]
    merges = ["1 2", "3 4", "12 3", "4 5"]
    path = write_gguf(llama_pair[1], tmp_path / "d.gguf", tokens=tokens, merges=merges, tokenizer_pre=pre)
    assert open_model(path, raw=True).tokenizer.encode("12345") == ids


def test_sentencepiece_tokenizer_from_metadata(llama_pair, tmp_path: Path) -> None:
    _, model = llama_pair
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "▁a", "ab", "▁ab", "<0x0A>"] + [f"t{i}" for i in range(10, 96)]
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -1.0, -0.5, -3.0] + [-10.0] * 86
    path = write_gguf(model, tmp_path / "spm.gguf", tokens=tokens, scores=scores, tokenizer_model="llama")
    m = open_model(path, raw=True)
    assert m.tokenizer.encode("ab ab") == [8, 8]
    assert m.tokenizer.encode("ab\n") == [8, 9]  # byte fallback for a character not in the vocabulary
    assert m.tokenizer.decode_token(8) == " ab"
    assert m.tokenizer.decode_token(9) == "<0x0A>"  # byte tokens shown as such


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_metadata_tokenizer_is_built_on_the_first_prompt(kind: str, llama_pair, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a GGUF file does not build the tokenizer (0.5-1 s for a 32k SentencePiece
    table, bench/README.md "GGUF"): token strings, ids and the vocabulary size come from the
    table and equal what the built tokenizer gives, for every id (a repeated piece included);
    the first prompt builds it, once."""
    from headscope.engine.formats import gguf_tokenizer
    from headscope.engine.formats.tokenizer import HFTokenizer

    tokens = ["<unk>", "<s>", "▁", "a", "b", "▁a", "ab", "▁ab", "<0x0A>", "Ġab", "##x", "ab"]
    tokens += [f"t{i}" for i in range(len(tokens), 96)]
    scores = [-float(i) for i in range(len(tokens))]
    extra = {"scores": scores} if kind == "llama" else {"merges": ["a b", "▁ ab"]}
    path = write_gguf(llama_pair[1], tmp_path / "lazy.gguf", tokens=tokens, tokenizer_model=kind, **extra)
    build = gguf_tokenizer._spm if kind == "llama" else gguf_tokenizer._bpe
    calls: list[int] = []

    def counted(*args: object) -> object:
        calls.append(1)
        return build(*args)

    monkeypatch.setattr(gguf_tokenizer, "_spm" if kind == "llama" else "_bpe", counted)
    m = open_model(path, raw=True)
    assert calls == []
    eager = HFTokenizer(build(tokens, scores) if kind == "llama" else build(tokens, ["a b", "▁ ab"]))
    assert [m.tokenizer.decode_token(i) for i in range(98)] == \
        [eager.decode_token(i) for i in range(98)]
    assert [m.tokenizer.token_to_id(t) for t in [*tokens, "zz"]] == \
        [eager.token_to_id(t) for t in [*tokens, "zz"]]
    assert m.tokenizer.vocab_size == eager.vocab_size
    assert calls == []
    assert m.tokenizer.encode("ab ab") == eager.encode("ab ab")
    assert m.tokenizer.encode("a b") == eager.encode("a b")
    assert calls == [1]


def test_no_tokenizer_means_token_ids(llama_pair, tmp_path: Path) -> None:
    _, model = llama_pair
    m = open_model(write_gguf(model, tmp_path / "none.gguf"), raw=True)
    assert m.tokenizer.encode("3, 14 15") == [3, 14, 15]


def test_unknown_tokenizer_model_shows_tokens_takes_ids(llama_pair, tmp_path: Path) -> None:
    _, model = llama_pair
    tokens = ["<unk>", "▁hello"] + [f"t{i}" for i in range(2, 96)]
    path = write_gguf(model, tmp_path / "odd.gguf", tokens=tokens, tokenizer_model="rwkv")
    m = open_model(path, raw=True)
    assert m.tokenizer.decode_token(1) == " hello"
    assert m.tokenizer.encode("1 2") == [1, 2]


def test_undecodable_token_strings_do_not_block_the_model(llama_pair, tmp_path: Path) -> None:
    """Some vocabularies hold partial UTF-8 sequences as tokens: shown with U+FFFD, model opens."""
    tokens = ["<unk>", "ok"] + [f"t{i}" for i in range(2, 96)]
    path = write_gguf(llama_pair[1], tmp_path / "m.gguf", tokens=tokens, tokenizer_model="rwkv")
    blob = path.read_bytes()
    at = blob.index(b"\x02\x00\x00\x00\x00\x00\x00\x00ok")
    path.write_bytes(blob[: at + 8] + b"\xe2\x82" + blob[at + 10 :])  # same length, invalid UTF-8
    m = open_model(path, raw=True)
    assert m.tokenizer.decode_token(1) == "\ufffd"


def _token_types(types: list[int]) -> Any:  # a write_gguf metadata callback
    return lambda w: w.add_token_types(types)


def test_default_token_set_is_whole_words_most_frequent_first(llama_pair, tmp_path: Path) -> None:
    """A SentencePiece table starts with <unk>, <s>, </s> and byte tokens: the QK/OV rows
    shown when the user names none (structure["default_tokens"], issue 39 §3) are the whole
    words, highest score first; never control, byte or non-ASCII pieces, nor word pieces of
    fewer than three letters; fewer than 24 words: the other normal tokens fill up, in id order."""
    from headscope.engine.core.requests import CircuitRequest

    special = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(16)]
    pieces = ["▁t", "er", "▁the", "▁and", "▁User", "▁été", "in", "▁was", "▁of", "▁house"]
    tokens = special + pieces + [f"x{i}" for i in range(len(special) + len(pieces), 96)]
    types = [2, 3, 3] + [6] * 16 + [1] * (96 - 19)
    types[tokens.index("▁User")] = 3  # a control token spelt like a word
    scores = [0.0] * 19 + [-float(i) for i in range(77)]
    scores[tokens.index("▁house")] = 5.0  # the most frequent piece, though its id is high
    path = write_gguf(llama_pair[1], tmp_path / "words.gguf", tokens=tokens, scores=scores,
                      tokenizer_model="llama", metadata=_token_types(types))
    m = open_model(path, raw=True)
    words = [tokens.index(t) for t in ("▁house", "▁the", "▁and", "▁was")]
    fill = [i for i in range(19, 96) if i not in words and tokens[i] != "▁User"][:20]
    assert m.structure()["default_tokens"] == words + fill
    block = m.get(CircuitRequest.of(m.structure(), 0, 0, "ov"))
    assert list(block.row_ids) == list(block.col_ids) == words + fill
    assert list(block.row_labels[:4]) == [" house", " the", " and", " was"]
    named = CircuitRequest.of(m.structure(), 0, 0, "qk", rows=[5], cols=[6])
    assert (named.rows, named.cols) == ((5,), (6,))  # a named set is kept


def test_the_default_token_set_is_picked_on_first_use_decoding_only_what_it_reads(llama_pair, tmp_path: Path) -> None:
    """Opening a GGUF (``info``, the config) never decodes its token table; the default token
    set is picked when first used, reading the few strings it looks at, not the 32k-256k of
    the table (56 ms of ``info`` on a 7B file)."""
    from headscope.engine.model.loading import inspect_checkpoint, structure_of

    tokens = ["<unk>", "<s>", "</s>", "▁the", "▁a", "▁dog"] + [f"x{i}" for i in range(6, 96)]
    path = write_gguf(llama_pair[1], tmp_path / "lazy.gguf", tokens=tokens, tokenizer_model="llama",
                      scores=[0.0] * 96)
    ckpt = inspect_checkpoint(path)
    table = ckpt.gguf.header.metadata["tokenizer.ggml.tokens"]
    assert not ckpt.default_tokens.computed and table._strings is None  # the header alone
    words = structure_of(ckpt, raw=True)["default_tokens"]
    assert words == [3, 5, 4, *range(6, 27)]  # the two words, then the other normal tokens
    assert json.loads(json.dumps(words)) == words  # the structure is plain data
    assert table._strings is None  # looked up one by one, the table never decoded whole


def test_default_token_set_of_a_byte_level_table_is_its_first_words(llama_pair, tmp_path: Path) -> None:
    """A byte-level BPE table (no scores, no types) is in merge order: its first words, by id;
    a table without words keeps the first ids (an empty set, the requests' range)."""
    from headscope.engine.core.requests import CircuitRequest

    tokens = ["<|begin|>", "a", "Ġ", "Ġth", "Ġthe", "ĠÃ©t", "Ġand"] + [f"Ġw{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(7, 96)]
    m = open_model(write_gguf(llama_pair[1], tmp_path / "bpe.gguf", tokens=tokens, merges=[]), raw=True)
    assert m.structure()["default_tokens"] == [4, 6, *range(7, 29)]
    bare = open_model(write_gguf(llama_pair[1], tmp_path / "bare.gguf", tokens=[f"t{i}" for i in range(96)]),
                      raw=True)
    assert not bare.structure()["default_tokens"]  # no words: empty, the requests' range
    assert CircuitRequest.of(bare.structure(), 0, 0, "qk").rows == tuple(range(24))


def test_default_token_set_ignores_metadata_of_the_wrong_kind() -> None:
    """Types or scores that are not numbers of the table's length are left out (the words in
    id order), tokens that are not strings give no set: never an error at open."""
    from headscope.engine.formats.gguf_tokenizer import readable_ids

    tokens = ["<unk>", "<0x00>", "▁a", "▁dog", "▁the", "in", "▁cat"]
    assert readable_ids({"tokenizer.ggml.tokens": tokens}, 2) == (3, 4)
    for bad in (["x"] * 7, [1, 2], "abc", [[1, 2]] * 7):
        header = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": bad,
                  "tokenizer.ggml.scores": bad}
        assert readable_ids(header, 2) == (3, 4), bad
    scored = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0, 0, 0, -1, float("nan"), 0, 5]}
    assert readable_ids(scored, 3) == (6, 3, 4)  # NaN scores last
    assert readable_ids({"tokenizer.ggml.tokens": [1, 2, 3]}, 2) == ()
