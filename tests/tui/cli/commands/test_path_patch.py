"""`headscope path-patch` and `patch` with sets, attribution and positions: the JSON."""

from __future__ import annotations

import pytest

from headscope.engine.api.model import open_model
from tests.tui.cli.test_patching import MODEL, PROMPTS
from tests.tui.cli.test_store import run_json


def test_sets_attribution_positions_and_paths_in_json(capsys) -> None:
    sets = run_json(capsys, "patch", MODEL, *PROMPTS, "--heads", "L1.H0,L1.H1,L1.H2", "--heads", "1.1,1.2")
    assert [row["heads"] for row in sets["heads"]] == [[[1, 0], [1, 1], [1, 2]], [[1, 1], [1, 2]]]
    assert sets["heads"][0]["recovered"] > 0.85 > sets["heads"][1]["recovered"] > 0.45

    attribution = run_json(capsys, "patch", MODEL, *PROMPTS, "--method", "attribution", "--verify", "2")
    assert attribution["method"] == "attribution"
    verified = [row for row in attribution["heads"] if row["exact"] is not None]
    assert len(verified) == 2
    for row in attribution["heads"]:
        assert row["patched"] == pytest.approx(attribution["corrupt"] + row["estimate"])

    positions = run_json(capsys, "patch", MODEL, *PROMPTS, "--site", "v", "--by-position")
    assert all(len(row["positions"]) == 11 for row in positions["heads"])

    path = run_json(capsys, "path-patch", MODEL, "L0.H1", "L1.H2", "--patch", "k")
    assert (path["method"], path["site"], path["metric"]) == ("path", "k", "induction")
    (row,) = path["heads"]
    assert row["sender"] == [0, 1] and row["receiver"] == [1, 2]
    found = open_model(MODEL).path_patch((0, 1), (1, 2), patch="k")
    assert row["patched"] == found.rows[0].patched


def test_paths_between_the_graphs_nodes_are_the_exact_edge_checks(capsys) -> None:
    """``path-patch`` by the edge graph's names on a model with MLPs: into an MLP (from its own
    layer's head), from an MLP into the logits; the receiver's input is its site, the row
    names its edge, and ``--noising`` gives ``exact_edges``' number for it (every kind of
    edge: tests/engine/forward/test_edges.py)."""
    from headscope.engine.forward import edges, patch_tasks
    from tests.conftest import sample_model

    model = str(sample_model("gpt2-mini"))
    clean, corrupt = [5, 9, 2, 33, 7, 5, 9, 4], [5, 9, 2, 40, 7, 11, 9, 4]
    ids = ["--clean-tokens", ",".join(map(str, clean)), "--corrupt-tokens", ",".join(map(str, corrupt)),
           "--answer", "3", "--wrong", "6", "--noising", "--no-cache"]
    names = ["a0.h0->m0", "m1->logits"]
    w = open_model(model).weights
    expected = edges.exact_edges(w, [clean], [corrupt], patch_tasks.LogitDiff(3, 6), names)
    for name, exact in zip(names, expected, strict=True):
        sender, receiver = name.split("->")
        found = run_json(capsys, "path-patch", model, sender, receiver, *ids)
        (row,) = found["heads"]
        assert row["edge"] == name and found["site"] == {"l": "logits", "m": "mlp"}[receiver[0]]
        assert row["patched"] == pytest.approx(exact.patched, abs=1e-6), name
    assert row["sender"] == "m1" and row["receiver"] == "logits"
