"""The training corpus of the sample models: deterministic, word-level, varied repeats."""

from __future__ import annotations

import numpy as np

from headscope.sample_models import corpus


def test_vocabulary_is_word_level_with_specials_and_punctuation() -> None:
    vocab = corpus.VOCAB
    assert vocab[:2] == ["<unk>", "<bos>"]
    assert len(vocab) == len(set(vocab)), "token ids must be unique"
    assert 200 <= len(vocab) <= 1000, "a few hundred tokens"
    assert all(w and w == w.strip() and len(w.split()) == 1 for w in vocab)
    assert {",", ".", "!", "?"} <= set(vocab)


def test_encode_decode_round_trip_and_unknown_words() -> None:
    text = "When Mary and John went to the store , John gave a drink to Mary ."
    ids = corpus.encode(text)
    assert corpus.decode(ids) == text
    assert corpus.UNK_ID not in ids
    assert corpus.encode("Mary xyzzy") == [corpus.TOKEN_ID["Mary"], corpus.UNK_ID]


def test_same_seed_same_batches_different_seed_different() -> None:
    a = corpus.Corpus(3).batch(8, 48)
    b = corpus.Corpus(3).batch(8, 48)
    c = corpus.Corpus(4).batch(8, 48)
    assert a.shape == (8, 48) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < len(corpus.VOCAB)


def test_indirect_object_sentences_name_both_people_and_end_on_the_other() -> None:
    c = corpus.Corpus(0)
    seen = 0
    for _ in range(200):
        words = c.sentence().split()
        if words[0] in ("When", "After", "While") and words[2] == "and":
            a, b, io = words[1], words[3], words[-2]
            assert io in (a, b) and a != b
            subject = words[words.index(",") + 1]
            assert {subject, io} == {a, b}, "the subject gives to the other person"
            seen += 1
    assert seen > 20


def _copy_distances(seq: np.ndarray, min_len: int = 4) -> set[int]:
    """Distances d at which a run of >= min_len tokens repeats (seq[i:i+n] == seq[i-d:i-d+n])."""
    found = set()
    n = len(seq)
    for d in range(1, n):
        run = 0
        for i in range(d, n):
            run = run + 1 if seq[i] == seq[i - d] else 0
            if run == min_len:
                found.add(d)
                break
    return found


def test_repeated_spans_occur_at_many_different_distances() -> None:
    # A fixed offset between copies lets one layer attend by position instead of by
    # content, and then no induction head forms: the distances must vary widely.
    batch = corpus.Corpus(0).batch(64, 64)
    distances = set().union(*(_copy_distances(row) for row in batch))
    assert len(distances) >= 30, sorted(distances)
    assert min(distances) <= 6 and max(distances) >= 40
