"""Requests (engine/core/requests/): every request type has one computation, its key changes with every field and names its head, a patch request's key is its results-store part."""

from __future__ import annotations

import dataclasses

import pytest

from headscope.engine.core import requests
from tests.e2e.test_request_paths_agree import _other, sample_requests


def test_every_request_type_has_exactly_one_computation() -> None:
    from headscope.engine.sweeps import dispatch  # noqa: F401  (registers every computation)

    kinds = requests.request_types()
    assert set(requests.COMPUTATIONS) == set(kinds)
    assert {type(r) for r in sample_requests()} == set(kinds)
    with pytest.raises(TypeError, match="already computed"):
        requests.computes(requests.SpectrumRequest)(lambda *a, **k: None)


def test_the_key_changes_with_every_field_and_names_the_head() -> None:
    keys = set()
    for req in sample_requests():
        keys.add(req.key())
        assert req.key() == dataclasses.replace(req).key()  # stable
        for field in dataclasses.fields(req):
            changed = dataclasses.replace(req, **{field.name: _other(getattr(req, field.name))})
            assert changed.key() != req.key(), (type(req).__name__, field.name)
        want = (req.target if isinstance(req, requests.PathRequest)
                else (1, 2) if hasattr(req, "head_index") else None)
        assert req.head == want, type(req).__name__
    assert len(keys) == len(sample_requests())  # no two types share a key


def test_a_patch_request_key_is_its_results_store_part() -> None:
    req = sample_requests()[-1]
    assert req.key().startswith("patch-") and len(req.key()) == len("patch-") + 24
