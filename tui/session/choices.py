"""What the user chose to look at, apart from the focused head: the QK/OV tokens, the OV
source row, the rotary offset Δ, the prompt, the head tree's filter and the directions panel.
No Textual here.

Each choice is part of the load key of the tabs that show it (the explorer drops a result
whose key is no longer the tab's, docs/internals.md "The explorer").
"""

from __future__ import annotations

Head = tuple[int, int]
ROTARY_OFFSETS = 32  # rotary profile over Δ in [-32, 32]
# The head tree's filters (f), in the order f cycles through them: (score key, label).
TREE_FILTERS: tuple[tuple[str, str], ...] = (
    ("induction_score", "induction"), ("prev_token_score", "prev-token"),
    ("copying_score", "copying"), ("sink", "sink"))  # sink: on the first token or delimiters


def token_ids(text: str) -> list[int] | None:
    """The ids written ``#12 #40`` in ``text``; ``None`` if ``text`` is words (for the
    tokenizer) or empty (the default token set)."""
    parts = text.split()
    if parts and all(p.startswith("#") and p[1:].isascii() and p[1:].isdigit() for p in parts):
        return [int(p[1:]) for p in parts]
    return None


class ViewChoices:
    """The QK/OV tokens, the OV source row, the rotary offset, the prompt, the tree's filter
    and whether the directions panel is shown."""

    def __init__(self, *, prompt: str = "", tokens_text: str = "") -> None:
        self.tokens: list[int] | None = None  # None: the engine's default token set
        self.tokens_text = tokens_text  # as typed (words or #ids)
        self.tokens_gen = 0  # bumped when the tokens change (part of the QK/OV load key)
        self.source_index = 0  # the OV source row whose top outputs are listed
        self.qk_offset = 0  # rotary QK: the offset Δ shown
        self.prompt_text = prompt
        self.tree_filter: str | None = None  # a key of TREE_FILTERS; None: every head
        # The directions panel beside the QK/OV heatmaps: the user's choice once v is pressed;
        # None before (shown unless the terminal is narrow or in compare mode).
        self.directions: bool | None = None

    def next_tree_filter(self) -> str | None:
        """The filter after the current one: every head → induction → prev-token → copying →
        sink → every head."""
        keys = [k for k, _ in TREE_FILTERS]
        i = keys.index(self.tree_filter) if self.tree_filter in keys else -1
        return keys[i + 1] if i + 1 < len(keys) else None

    def directions_shown(self, narrow: bool, compare: bool) -> bool:
        """Whether the directions panel is shown: the user's choice, else unless the terminal
        is ``narrow`` or in ``compare`` mode (where it would crowd the heatmaps)."""
        if self.directions is not None:
            return self.directions
        return not narrow and not compare

    def set_tokens(self, ids: list[int] | None, text: str) -> None:
        """The QK/OV rows and columns: ``ids`` (duplicates dropped, order kept) typed as
        ``text``; ``None``: the default set. The OV source row starts again at the first."""
        if ids is not None:
            ids = list(dict.fromkeys(int(i) for i in ids))
        self.tokens, self.tokens_text = ids, text
        self.tokens_gen += 1
        self.source_index = 0

    def step_source(self, step: int, n_rows: int) -> int:
        """The OV source row ``step`` rows on (cyclic over ``n_rows``, when known)."""
        self.source_index += step
        if n_rows:
            self.source_index %= n_rows
        return self.source_index

    def step_offset(self, step: int) -> int:
        """The rotary offset Δ ``step`` on, within ±``ROTARY_OFFSETS``."""
        self.qk_offset = max(-ROTARY_OFFSETS, min(ROTARY_OFFSETS, self.qk_offset + step))
        return self.qk_offset

    def qk_ov_key(self) -> tuple[int, int, int]:
        """What the QK and OV tabs' loads depend on besides the head and the weights."""
        return (self.tokens_gen, self.qk_offset, self.source_index)
