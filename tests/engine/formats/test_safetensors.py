"""The safetensors header parser (engine/formats/safetensors.py): refused before parsing when too dense, never mistaken for pickle; parsed as safetensors parses it."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save, save_file

from headscope.engine.api.model import read_structure
from headscope.engine.core.errors import (
    CorruptFileError,
    UnsafeFormatError,
)
from headscope.engine.formats.safetensors import parse_header_bytes, read_header
from headscope.engine.formats.safetensors import read_header as read_header_of
from tests.engine.test_hostile import (
    _mutate,
    _reference_accepts,
    _seed_blob,
    entry,
    mutation,
    safetensors_bytes,
)
from tests.engine.test_hostile_io import _NAMES, _peak_bytes


def test_container_dense_header_is_refused_before_parsing(tmp_path: Path) -> None:
    body = b'{"a": [' + b"{}," * 1_000_000 + b"{}]}"  # 3 MB: ~80 MB as Python objects
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body)

    def attempt() -> None:
        with pytest.raises(CorruptFileError, match="nests 1,000,003 JSON objects/arrays"):
            read_structure(path)

    assert _peak_bytes(attempt) < 3 * len(body)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.dictionaries(_NAMES, st.lists(st.integers(0, 3), max_size=3), max_size=30),
    metadata=st.dictionaries(st.text(max_size=8), st.text(max_size=80), max_size=3),
)
def test_headers_safetensors_writes_are_never_too_dense(
    shapes: dict[str, list[int]], metadata: dict[str, str]
) -> None:
    tensors = {name: torch.zeros(shape) for name, shape in shapes.items()}
    blob = save(tensors, metadata=metadata or None)
    header = parse_header_bytes(blob)
    assert set(header.tensors) == set(shapes)


@pytest.mark.parametrize("length", [640, 896, 1152, 1408])
def test_header_lengths_that_look_like_pickle_magic_are_safetensors(tmp_path: Path, length: int) -> None:
    """A header of 640 bytes has the length bytes ``80 02 00 ...``: pickle protocol 2's
    magic. The JSON that follows tells them apart; a real pickle is still refused."""
    entry = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    raw = json.dumps(entry).encode().ljust(length)
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", length) + raw + b"\0" * 4)
    assert set(read_header_of(path).tensors) == {"a"}
    assert set(parse_header_bytes(path.read_bytes()).tensors) == {"a"}


def test_valid_header_is_parsed_like_safetensors_reads_it(tmp_path: Path) -> None:
    tensors = {"w": torch.randn(3, 4), "b": torch.randn(5).bfloat16(), "empty": torch.zeros(0, 2)}
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"k": "v"})
    h = read_header(tmp_path / "x.safetensors")
    assert h.metadata == {"k": "v"} and h.n_params == 17
    assert {n: (t.dtype, t.shape) for n, t in h.tensors.items()} == {
        "w": ("F32", (3, 4)), "b": ("BF16", (5,)), "empty": ("F32", (0, 2))
    }  # fmt: skip


# No deadline and no wall-clock bound: a hang is caught by pytest-timeout, speed lives in
# bench/ (a busy machine must not fail this test).
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_header_parser_gives_typed_error_or_valid_header(
    ops: list[tuple[str, int, int]],
) -> None:
    blob = _mutate(_seed_blob(), ops)
    try:
        header = parse_header_bytes(blob)
    except (CorruptFileError, UnsafeFormatError) as e:
        assert "\n" not in str(e)
    else:
        # Whatever we accept, safetensors itself reads without error: a validated header
        # never turns into a crash mid-view.
        assert _reference_accepts(blob), header
        assert all(t.end <= len(blob) - header.data_start for t in header.tensors.values())


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_structured_headers_agree_with_safetensors(data: st.DataObject) -> None:
    """Valid headers with one field perturbed (offset, dtype, shape, order, trailing bytes):
    we accept exactly what the reference implementation accepts."""
    names = data.draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=4))
    entries: dict[str, Any] = {}
    offset = 0
    for name in data.draw(st.permutations(names)):
        dtype = data.draw(st.sampled_from(["F32", "F16", "BF16", "I64", "U8"]))
        shape = data.draw(st.lists(st.integers(0, 3), max_size=3))
        size = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1}[dtype]
        end = offset + size * (1 if not shape else math.prod(shape))
        entries[name] = entry(dtype, shape, offset, end)
        offset = end
    trailing = 0
    if entries and data.draw(st.booleans()):
        victim = entries[data.draw(st.sampled_from(sorted(entries)))]
        kind = data.draw(st.sampled_from(["begin", "end", "dtype", "shape", "trailing", "short"]))
        delta = data.draw(st.integers(-3, 3))
        if kind == "begin":
            victim["data_offsets"][0] += delta
        elif kind == "end":
            victim["data_offsets"][1] += delta
        elif kind == "dtype":
            victim["dtype"] = data.draw(st.sampled_from(["F32", "F16", "I8", "F17", "f32", ""]))
        elif kind == "shape":
            victim["shape"] = [*victim["shape"], data.draw(st.integers(-1, 2))]
        elif kind == "trailing":
            trailing = abs(delta)
        else:
            trailing = -abs(delta)
    blob = safetensors_bytes(entries, b"\0" * max(offset + trailing, 0))
    try:
        parse_header_bytes(blob)
        ours = True
    except CorruptFileError:
        ours = False
    assert ours == _reference_accepts(blob), entries
