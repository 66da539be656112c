"""An encoder's prompt is exactly its tokens, even when its tokenizer.json enables fixed
padding and truncation (sentence-transformers checkpoints pad to 128 and cut there).

The fixture is the tiny BertForMaskedLM with a BERT-style tokenizer.json that pads and
truncates every input to 16 tokens (``n_ctx`` is 48), so both effects are visible.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.api.model import open_model
from headscope.engine.formats.tokenizer import HFTokenizer
from headscope.tui.cli.main import main
from tests.hf_fixtures import BERT_WORDS, N_CTX, build_bert_mlm, write_bert_tokenizer

FIXED = 16  # the tokenizer.json's padding and truncation length


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path, hf = build_bert_mlm(tmp_path_factory.mktemp("bert_fixed"), tokenizer=False)
    write_bert_tokenizer(path, fixed_length=FIXED)
    assert json.loads((path / "tokenizer.json").read_text())["padding"]["strategy"] == {"Fixed": FIXED}
    return path, hf


def ids_of(words: list[str]) -> list[int]:
    return [BERT_WORDS.index(w) for w in words]


def test_a_short_prompt_is_exactly_its_tokens(bert) -> None:
    model = open_model(bert[0])
    assert model.tokenizer.encode("the cat sat") == ids_of(["the", "cat", "sat"])  # no [PAD] × 13


def test_a_prompt_longer_than_the_tokenizer_limit_is_not_cut(bert) -> None:
    words = [BERT_WORDS[5 + i % 40] for i in range(30)]  # 30 tokens: over 16, under n_ctx = 48
    assert open_model(bert[0]).tokenizer.encode(" ".join(words)) == ids_of(words)


def test_typed_special_tokens_are_kept_and_none_are_added(bert) -> None:
    tok = open_model(bert[0]).tokenizer
    assert tok.encode("[CLS] the cat [SEP]") == ids_of(["[CLS]", "the", "cat", "[SEP]"])


def test_wordpiece_vocab_recognises_typed_special_tokens(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]) + "\n")
    tok = HFTokenizer.from_wordpiece_vocab(vocab)
    assert tok.encode("[CLS] The cat [MASK] [SEP]") == [2, 5, 6, 4, 3]


def test_patterns_and_log_probs_match_transformers_for_the_prompt_ids(bert) -> None:
    path, hf = bert
    prompt = "[CLS] the cat sat on the mat [SEP]"
    model = open_model(path)
    ids = model.tokenizer.encode(prompt)
    assert len(ids) == 8
    ours = model.run(prompt)
    hf.config._attn_implementation = "eager"  # output_attentions needs the eager path
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids]), output_attentions=True)
    patterns = torch.stack(ref.attentions, dim=1)
    assert ours.patterns.shape == patterns.shape == (1, 2, 4, 8, 8)
    torch.testing.assert_close(ours.patterns, patterns, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.log_softmax(ours.logits, -1), torch.log_softmax(ref.logits, -1),
                               atol=1e-4, rtol=0)


def test_the_cli_truncates_at_the_context_with_its_own_warning(bert, capsys) -> None:
    words = [BERT_WORDS[5 + i % 40] for i in range(N_CTX + 12)]
    code = main(["forward", str(bert[0]), "--prompt", " ".join(words), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"prompt truncated from {N_CTX + 12} to the context of {N_CTX} tokens" in err
    assert json.loads(out)["tokens"] == ids_of(words[:N_CTX])
