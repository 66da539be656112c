"""Reading a head (docs/math.md, "Reading a head"): singular directions as tokens, virtual
heads along composition paths, attention sinks, calibrated scores — engine, report, CLI and
the explorer's Engine agree, the factored maths equals the dense matrices, and on the bundled
attn-only-2l the readings show its previous-token → induction mechanism.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from headscope.engine.api import report
from headscope.engine.api.model import open_model
from headscope.engine.circuits import directions
from headscope.engine.circuits import head_circuits as circuits
from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError
from headscope.engine.core.requests import (
    DirectionsRequest,
    HeadScoresRequest,
    PathRequest,
    ScoreNullRequest,
)
from headscope.engine.core.validation import SCORE_NAMES, Z_NAMES
from headscope.engine.forward import null as null_module
from headscope.engine.service.engine import Engine
from headscope.engine.sweeps import scores as score_sweeps
from headscope.engine.sweeps.dispatch import compute
from headscope.tui.cli import main as cli
from headscope.tui.cli import output
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD, sample_model

MODEL_PATH = sample_model("attn-only-2l")


@pytest.fixture(scope="module")
def model() -> Any:
    return open_model(MODEL_PATH)


def cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    assert cli.main([*argv, "--json"]) == cli.EXIT_OK
    return json.loads(capsys.readouterr().out)


def head_weights(w: Any, layer: int, head: int) -> dict[str, torch.Tensor]:
    return {n: w.get_head(f"blocks.{layer}.attn.{n}", head) for n in ("W_Q", "W_K", "W_V", "W_O")}


# -- singular directions --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ov", "qk"])
def test_factored_directions_equal_the_dense_svd_up_to_sign(model: Any, kind: str) -> None:
    w = model.weights
    fm = circuits.full_ov(w, 1, 2) if kind == "ov" else circuits.token_qk(w, 1, 2)
    dense = torch.from_numpy(fm.AB).double()  # 414 × 414: small enough to decompose here, never in the engine
    u, s, vh = torch.linalg.svd(dense)
    found = directions.signed_directions(fm, 5)
    np.testing.assert_allclose(found.s, s[:5].numpy(), rtol=1e-4)
    for i in range(5):
        fu, fv = torch.from_numpy(found.u[:, i]).double(), torch.from_numpy(found.v[:, i]).double()
        sign = torch.sign(fu @ u[:, i])
        torch.testing.assert_close(fu, sign * u[:, i], atol=1e-4, rtol=0)
        torch.testing.assert_close(fv, sign * vh[i], atol=1e-4, rtol=0)
        assert float(fu[fu.abs().argmax()]) > 0  # the sign: the largest entry of u is positive
    got = compute(model, DirectionsRequest(1, 2, kind, 5, 10))
    for i, d in enumerate(got.directions):  # tokens ranked as the dense columns rank them
        assert list(d.in_ids) == u[:, i].abs().topk(10).indices.tolist()
        assert list(d.out_ids) == vh[i].abs().topk(10).indices.tolist()
        assert d.in_labels[0] == model.tokenizer.decode_token(d.in_ids[0])


def test_overlap_counts_shared_tokens_with_their_sign() -> None:
    assert directions.overlap([1, 2, 3, 4], [1.0, -1.0, 1.0, 1.0], [2, 1, 9], [-2.0, 3.0, 1.0]) == 0.5
    assert directions.overlap([1, 2], [1.0, 1.0], [1, 2], [-1.0, -1.0]) == -1.0
    assert directions.overlap([1, 2], [1.0, 1.0], [3, 4], [1.0, 1.0]) == 0.0


# -- virtual heads ----------------------------------------------------------------------------


def test_the_prev_token_to_induction_path_shows_the_mechanism(model: Any, capsys) -> None:
    """A query token attends where the previous-token head moved the same token: the K-path's
    diagonal wins on (nearly) every row for L0.H1 → L1.H2, on few rows for the other L0 heads."""
    got = cli_json(["path", str(MODEL_PATH), "L0.H1", "L1.H2"], capsys)
    k = got["k_composition"]
    assert k["diagonal"] > 0.9 and k["positivity"] > 0.99
    values = np.asarray(k["values"])
    assert values.shape == (24, 24) and k["rows"] == list(range(24))
    assert (values.argmax(1) == np.arange(24)).mean() > 0.9
    for other in (0, 2):
        path = report.path_report(model, (0, other), INDUCTION_HEAD)["k_composition"]
        assert path["diagonal"] < 0.3
        assert path["positivity"] < k["positivity"] - 0.1
    v = got["v_composition"]
    assert len(v["singular_values"]) == 32 and len(v["eigenvalues"]) == 32


# -- attention sinks ----------------------------------------------------------------------------


# -- calibrated scores ----------------------------------------------------------------------------


def test_heads_json_has_the_sink_score_and_a_z_for_every_score(capsys) -> None:
    rows = cli_json(["heads", str(MODEL_PATH)], capsys)
    assert "attention_sink_score" in SCORE_NAMES
    assert all(set(Z_NAMES) | set(SCORE_NAMES) <= set(r) for r in rows)
    z = {(r["layer"], r["head"]): r["induction_score_z"] for r in rows}
    assert z[INDUCTION_HEAD] > 10  # far above random heads of the same shapes and norms
    assert max(z[(0, h)] for h in range(3)) < 3
    assert {(r["layer"], r["head"]) for r in rows if r["prev_token_score_z"] > 100} == {PREV_TOKEN_HEAD}


def test_a_rotary_model_gets_sink_scores_and_a_null(llama_dir) -> None:
    path, _ = llama_dir
    rotary = open_model(path)
    null = score_sweeps.score_null(rotary, samples=8)
    first, delimiters = score_sweeps.sink_tables(rotary)
    assert np.isfinite(first).all()
    # delimiters: only where the tokenizer's natural prompts have some (NaN, not 0, without)
    i = null.names.index("delimiter_sink_score")
    assert np.isfinite(np.delete(null.mean, i, 0)).all()
    assert np.isfinite(null.mean[i]).all() == np.isfinite(delimiters).all()


# -- one request layer: errors and the Engine ----------------------------------------------------


@pytest.mark.parametrize("argv, error", [
    (["svd", "1", "2", "--k", "0"], InvalidRequestError),
    (["svd", "1", "2", "--top", "0"], InvalidRequestError),
    (["svd", "2", "0"], IndexOutOfRangeError),
    (["svd", "0", "7"], IndexOutOfRangeError),
    (["path", "L1.H0", "L0.H1"], InvalidRequestError),
    (["path", "L1.H0", "L1.H1"], InvalidRequestError),
    (["path", "L0.H9", "L1.H1"], IndexOutOfRangeError),
])
def test_bad_requests_get_one_typed_line(argv: list[str], error: type, capsys) -> None:
    full = [argv[0], str(MODEL_PATH), *argv[1:]]
    args = cli.build_parser().parse_args(full)
    with pytest.raises(error):
        args.handler(args)
    assert cli.main(full) == cli.EXIT_MODEL_ERROR
    err = capsys.readouterr().err
    assert err.startswith("headscope: ") and err.count("\n") == 1 and str(MODEL_PATH) in err


def assert_close(a: Any, b: Any, rel: float = 1e-5) -> None:
    """Equal JSON-like structures: same keys, lengths, strings and ints; floats to ``rel``."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (a, b)
        for k in a:
            assert_close(a[k], b[k], rel)
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_close(x, y, rel)
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=rel, abs=1e-7, nan_ok=True), (a, b)
    else:
        assert a == b, (a, b)


async def test_the_engine_returns_what_the_reports_print(model: Any) -> None:
    eng = Engine(MODEL_PATH, workers=1, prefetch=False)
    try:
        await eng.ready()
        directions = await eng.get(DirectionsRequest.of(eng.structure, 1, 2, "ov", k=3, top=5))
        # The Engine computes on its worker thread (one BLAS thread), the report here: the same
        # numbers up to float32 summation order.
        assert_close(report.svd_dict(directions), report.svd_report(model, 1, 2, "ov", k=3, top=5))
        path = await eng.get(PathRequest.of(eng.structure, (0, 1), (1, 2), limit=eng.max_block_bytes))
        assert_close(report.path_dict(path), report.path_report(model, (0, 1), (1, 2)))
        null = await eng.get(ScoreNullRequest())
        assert null is await eng.get(ScoreNullRequest())  # cached
        scores = await eng.get(HeadScoresRequest.of(eng.structure, 1, 1))
        assert scores.attention_sink_score == pytest.approx(float(score_sweeps.sink_tables(model)[0][1, 1]))
        with pytest.raises(InvalidRequestError):
            await eng.get(PathRequest.of(eng.structure, (1, 0), (0, 1), limit=eng.max_block_bytes))
    finally:
        await eng.aclose()


async def test_the_engine_keeps_the_null_in_the_results_store(monkeypatch, tmp_path) -> None:
    """Reopened, the model's null is read back (its computation would fail), the same numbers."""
    from headscope.engine.sweeps.store import ResultStore

    nulls = []
    for reopen in (False, True):
        if reopen:
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("the null was computed again")

            monkeypatch.setattr(null_module, "behaviour_null", fail)
        eng = Engine(MODEL_PATH, workers=1, prefetch=False, store=ResultStore(tmp_path))
        try:
            await eng.ready()
            nulls.append(await eng.get(ScoreNullRequest()))
        finally:
            await eng.aclose()
    np.testing.assert_array_equal(nulls[0].mean, nulls[1].mean)
    np.testing.assert_array_equal(nulls[0].std, nulls[1].std)


def test_the_model_api_gives_what_the_cli_prints(model: Any, capsys) -> None:
    assert model.singular_directions(1, 2, "qk", k=2, top=3) == cli_json(
        ["svd", str(MODEL_PATH), "1", "2", "--kind", "qk", "--k", "2", "--top", "3"], capsys)
    assert json.loads(json.dumps(model.virtual_path((0, 1), (1, 2)))) == cli_json(
        ["path", str(MODEL_PATH), "0.1", "1.2"], capsys)


def test_terminal_tables_print_token_strings_literally(monkeypatch, capsys) -> None:
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    output.emit({}, False, lambda: (["token"], [["[bold red]x[/bold red]"]]))
    assert "[bold red]x[/bold red]" in capsys.readouterr().out


def _quantiles(t: torch.Tensor) -> torch.Tensor:
    return torch.quantile(t.double(), torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64))
