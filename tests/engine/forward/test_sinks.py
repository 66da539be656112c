"""Attention sinks (engine/forward/sinks.py; docs/math.md, "Reading a head"): the sink mass against its definition and the reference forward's patterns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from headscope.engine.forward import sinks
from headscope.engine.forward.transformer import run
from headscope.engine.sweeps import scores as score_sweeps
from tests.engine.circuits import test_directions

model = test_directions.model  # test_directions's pytest fixture


def test_sink_mass_is_the_attention_to_position_zero_after_the_first_queries() -> None:
    pattern = torch.zeros(1, 2, 6, 6)
    pattern[0, 0, :, 0] = 1.0  # head 0: everything on the first token
    pattern[0, 1] = torch.eye(6)  # head 1: each token on itself (query 0 too)
    torch.testing.assert_close(sinks.sink_mass(pattern, skip=4), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(sinks.sink_mass(pattern, skip=0), torch.tensor([1.0, 1 / 6]))


def test_a_head_parked_on_delimiters_gets_a_high_delimiter_sink_and_others_a_low_one() -> None:
    words = ["When", "Mary", "and", "John", ",", "John", "gave", "a", "drink", ".", "\n", "Mary",
             "went", "home"]
    delimiter = torch.tensor([[sinks.is_delimiter(t) for t in words]])
    assert [t for t, d in zip(words, delimiter[0].tolist(), strict=True) if d] == [",", ".", "\n"]
    assert all(map(sinks.is_delimiter, (" ,", ".\n", "<|endoftext|>", "[SEP]", "?!")))
    assert not any(map(sinks.is_delimiter, ("the", " cat", "<unk>", "$", "a.")))
    n = len(words)
    pattern = torch.zeros(1, 3, n, n)
    last = None
    for q in range(n):
        pattern[0, 0, q, last if last is not None else q] = 1.0  # head 0: the latest delimiter
        pattern[0, 1, q, max(q - 1, 0)] = 1.0  # head 1: the previous token
        pattern[0, 2, q, 0] = 1.0  # head 2: the first token (sink_mass's, not this score)
        if delimiter[0, q]:
            last = q
    got = sinks.delimiter_sink_mass(pattern, delimiter)
    # the scored queries: 5..13 (after the first delimiter, at 4); the previous-token head is
    # on a delimiter at 3 of them (after ",", "." and "\n")
    assert got[0] == 1.0 and got[1] == pytest.approx(3 / 9) and got[2] == 0.0
    assert sinks.delimiter_sink_mass(pattern, torch.zeros_like(delimiter)).isnan().all()


def test_sink_scores_equal_the_reference_forward_patterns(model: Any) -> None:
    repeated, natural = score_sweeps.sink_batches(model)
    assert natural, "the bundled vocabulary encodes the natural prompts"
    got = score_sweeps.sink_tables(model)[0]  # on the first token
    expected = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    batches = [repeated, *natural]
    for tokens in batches:
        patterns = run(model.weights, tokens).patterns  # [b, L, H, q, k]
        expected += patterns[:, :, :, sinks.SINK_SKIP:, 0].mean((0, 3)) / len(batches)
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)
