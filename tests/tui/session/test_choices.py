"""tui/session/choices.py without Textual: the QK/OV tokens, the OV source row, the rotary
offset and the prompt, and what the QK/OV load key depends on."""

from __future__ import annotations

from headscope.tui.session.choices import ROTARY_OFFSETS, TREE_FILTERS, ViewChoices, token_ids


def test_token_ids_reads_hash_ids_only() -> None:
    assert token_ids("#12 #40 #12") == [12, 40, 12]
    assert token_ids("the cat") is None  # words: for the tokenizer
    assert token_ids("") is None  # the default set
    assert token_ids("#12 cat") is None
    assert token_ids("#²") is None  # not an ASCII digit


def test_set_tokens_drops_duplicates_resets_the_source_row_and_changes_the_key() -> None:
    c = ViewChoices(tokens_text="x")
    c.step_source(3, 10)
    key = c.qk_ov_key()
    c.set_tokens([5, 3, 5, 7], "#5 #3 #5 #7")
    assert c.tokens == [5, 3, 7] and c.tokens_text == "#5 #3 #5 #7"
    assert c.source_index == 0
    assert c.qk_ov_key() != key
    c.set_tokens(None, "")
    assert c.tokens is None


def test_source_row_steps_cyclically_when_the_row_count_is_known() -> None:
    c = ViewChoices()
    assert c.step_source(1, 3) == 1
    assert c.step_source(3, 3) == 1
    assert c.step_source(-2, 3) == 2
    assert c.step_source(5, 0) == 7  # rows unknown yet: kept as stepped


def test_rotary_offset_stays_within_its_range() -> None:
    c = ViewChoices()
    assert c.step_offset(5) == 5
    assert c.step_offset(1000) == ROTARY_OFFSETS
    assert c.step_offset(-10_000) == -ROTARY_OFFSETS


def test_the_prompt_is_kept_as_given() -> None:
    assert ViewChoices(prompt="a b a b").prompt_text == "a b a b"


def test_tree_filters_cycle_back_to_every_head() -> None:
    c = ViewChoices()
    seen = []
    for _ in range(len(TREE_FILTERS) + 1):
        c.tree_filter = c.next_tree_filter()
        seen.append(c.tree_filter)
    assert seen == [*(k for k, _ in TREE_FILTERS), None]


def test_the_directions_panel_is_hidden_when_narrow_or_comparing_until_chosen() -> None:
    c = ViewChoices()
    assert c.directions_shown(narrow=False, compare=False)
    assert not c.directions_shown(narrow=True, compare=False)
    assert not c.directions_shown(narrow=False, compare=True)
    c.directions = True
    assert c.directions_shown(narrow=True, compare=True)
    c.directions = False
    assert not c.directions_shown(narrow=False, compare=False)
