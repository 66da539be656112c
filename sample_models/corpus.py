"""A deterministic, seeded training corpus for the sample models.

Word-level text: template sentences (names, places, objects, indirect-object sentences such
as "When Mary and John went to the store , John gave a drink to Mary .") mixed with spans of
random tokens that are repeated later in the same sequence. The repeats are what makes
in-context copying pay off, and therefore what grows induction heads in two-layer models.

The copies sit at VARYING distances with VARYING span lengths: when the second copy is
always at the same offset, a single layer learns to attend by position instead and no
induction head forms.

The vocabulary is fixed (no randomness): special tokens, punctuation, then word lists.
Token id ``i`` is line ``i`` of the shipped ``vocab.txt``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

UNK = "<unk>"
BOS = "<bos>"
SPECIALS = (UNK, BOS)


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


PUNCTUATION = (",", ".", "!", "?", ";", ":", "'", '"', "(", ")", "-")

NAMES = _words(
    "Mary John Alice Bob Tom Sarah James Emma David Anna Paul Lucy Mark Kate Peter Laura "
    "Mike Julia Chris Helen Sam Rose Dan Amy Max Grace Leo Nina Ben Clara Adam Ivy Ryan "
    "Eva Jack Zoe Hugo Lily Omar Ruth"
)
PLACES = _words(
    "store park school beach office library station market garden museum cafe bank "
    "hospital restaurant river lake forest village city farm church theatre stadium zoo "
    "airport harbour bakery hotel castle bridge"
)
OBJECTS = _words(
    "drink book ball apple key letter ring hat cake flower pen bag bottle cup box map "
    "ticket phone coin card gift lamp chair clock shoe coat kite toy plate knife candle "
    "bowl spoon mirror basket bell brush camera guitar pencil umbrella"
)
VERBS = _words("gave handed sent showed brought passed threw sold offered lent")
ADJECTIVES = _words(
    "big small old new red blue green yellow black white happy sad quick slow bright dark "
    "warm cold soft hard heavy light tall short quiet loud clean dirty"
)
ANIMALS = _words("cat dog bird horse cow fish fox owl rabbit mouse sheep goat duck frog bear wolf")
NUMBERS = _words(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen twenty thirty forty fifty hundred"
)
DAYS = _words("Monday Tuesday Wednesday Thursday Friday Saturday Sunday")
MONTHS = _words(
    "January February March April May June July August September October November December"
)
FUNCTION_WORDS = _words(
    "When After While Then Later The A On In the a an and to at of in on with for from "
    "went were was is had has have lot fun working walking decided give gave likes saw "
    "found counted bought wanted took it they he she we very near"
)
# Filler words: only ever appear inside random spans, so their next token is predictable
# from context (a repeat) and never from the language statistics.
FILLER = _words(
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
    "rho sigma tau upsilon phi chi psi omega north south east west up down left right "
    "zero oak pine elm maple birch cedar willow ash iron copper silver gold tin lead zinc "
    "salt sugar rice bread milk tea coffee honey butter cheese soup salad lemon orange "
    "grape cherry peach pear plum melon onion garlic pepper carrot potato tomato bean "
    "corn wheat cloud rain snow wind storm sun moon star planet comet stone sand glass "
    "paper wood cotton wool silk leather rubber plastic steel brass marble crystal "
    "violin piano drum flute trumpet harp cello organ banjo radio engine wheel rocket "
    "train boat plane truck bicycle wagon sled canoe submarine tractor robot puzzle "
    "riddle secret signal pattern rhythm echo shadow window door roof wall floor "
    "tower tunnel valley canyon island desert meadow swamp glacier volcano"
)


def build_vocab() -> list[str]:
    """The fixed vocabulary: specials, punctuation, then every word list, no duplicates."""
    vocab: list[str] = []
    seen: set[str] = set()
    for word in (
        *SPECIALS, *PUNCTUATION, *NAMES, *PLACES, *OBJECTS, *VERBS, *ADJECTIVES, *ANIMALS,
        *NUMBERS, *DAYS, *MONTHS, *FUNCTION_WORDS, *FILLER,
    ):
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    return vocab


VOCAB: list[str] = build_vocab()
TOKEN_ID: dict[str, int] = {w: i for i, w in enumerate(VOCAB)}
UNK_ID = TOKEN_ID[UNK]
BOS_ID = TOKEN_ID[BOS]

# Indirect-object templates: {A} and {B} are two distinct names, {S} (subject) is one of them
# and the sentence ends with the other (the indirect object).
IOI_TEMPLATES = (
    "When {A} and {B} went to the {P} , {S} gave a {O} to {IO} .",
    "After {A} and {B} went to the {P} , {S} {V} the {O} to {IO} .",
    "Then , {A} and {B} had a lot of fun at the {P} . {S} gave a {O} to {IO} .",
    "While {A} and {B} were working at the {P} , {S} {V} a {O} to {IO} .",
    "When {A} and {B} were walking near the {P} , {S} decided to give a {O} to {IO} .",
)
SIMPLE_TEMPLATES = (
    "{A} went to the {P} .",
    "{A} likes the {J} {O} .",
    "The {N} is very {J} .",
    "On {D} , {A} saw a {J} {N} at the {P} .",
    "In {M} , {A} counted {U} {N} near the {P} .",
    "{A} bought an {J} {O} from the {P} !",
    "{A} found the {O} in the {P} ; it was {J} .",
    "{A} took the {O} to the {P} with {B} .",
    "Later , {A} wanted a {O} for {B} ?",
)


def encode(text: str) -> list[int]:
    """Whitespace-split word-level encoding; unknown words become ``<unk>``."""
    return [TOKEN_ID.get(w, UNK_ID) for w in text.split()]


def decode(ids: Sequence[int]) -> str:
    return " ".join(VOCAB[i] for i in ids)


class Corpus:
    """Seeded stream of token sequences. Same seed → same sequences, bit for bit."""

    def __init__(self, seed: int = 0, *, pure_repeat: float = 0.5,
                 repeat_fraction: float = 0.5) -> None:
        """``pure_repeat``: share of sequences that are one random span repeated back to
        back; ``repeat_fraction``: in the others, share of segments copying earlier text."""
        self.rng = np.random.default_rng(seed)
        self.pure_repeat = pure_repeat
        self.repeat_fraction = repeat_fraction
        # Random spans draw from every ordinary token (not <bos>): the behavioural scores
        # use uniformly random tokens, so the copying must work for all of them.
        self._random_pool = np.array([i for i in range(len(VOCAB)) if i != BOS_ID])

    # ---- sentences -------------------------------------------------------------------
    def _pick(self, words: Sequence[str]) -> str:
        return words[int(self.rng.integers(len(words)))]

    def sentence(self) -> str:
        rng = self.rng
        a, b = (NAMES[i] for i in rng.choice(len(NAMES), size=2, replace=False))
        if rng.random() < 0.5:
            template = self._pick(IOI_TEMPLATES)
            s, io = (b, a) if rng.random() < 0.5 else (a, b)
        else:
            template = self._pick(SIMPLE_TEMPLATES)
            s, io = a, b
        return template.format(
            A=a, B=b, S=s, IO=io, P=self._pick(PLACES), O=self._pick(OBJECTS),
            V=self._pick(VERBS), J=self._pick(ADJECTIVES), N=self._pick(ANIMALS),
            D=self._pick(DAYS), M=self._pick(MONTHS), U=self._pick(NUMBERS),
        )

    def random_span(self, length: int) -> list[int]:
        return [int(t) for t in self.rng.choice(self._random_pool, size=length)]

    # ---- sequences -------------------------------------------------------------------
    def sequence(self, length: int) -> list[int]:
        """One training sequence of exactly ``length`` tokens."""
        rng = self.rng
        toks: list[int] = [BOS_ID] if rng.random() < 0.8 else []
        if rng.random() < self.pure_repeat:
            # A random span repeated back to back until full (what the induction score
            # measures), with a random period so no single offset works.
            period = int(rng.integers(4, max(5, length // 2 + 1)))
            span = self.random_span(period)
            while len(toks) < length:
                toks.extend(span)
            return toks[:length]
        while len(toks) < length:
            u = rng.random()
            if u < self.repeat_fraction and len(toks) >= 4:
                # Repeat an earlier stretch of this sequence: any start, any length, so
                # the distance between the copies varies from a few tokens to most of n_ctx.
                start = int(rng.integers(0, len(toks) - 2))
                span_len = int(rng.integers(3, 25))
                toks.extend(toks[start : start + span_len])
            elif u < self.repeat_fraction + 0.3:
                toks.extend(self.random_span(int(rng.integers(3, 17))))
            else:
                toks.extend(encode(self.sentence()))
        return toks[:length]

    def batch(self, batch_size: int, length: int) -> np.ndarray:
        """``[batch_size, length]`` int64 token ids."""
        return np.array([self.sequence(length) for _ in range(batch_size)], dtype=np.int64)

    def text(self, n_sentences: int) -> str:
        """Plain template text (for model cards and prompts)."""
        return " ".join(self.sentence() for _ in range(n_sentences))
