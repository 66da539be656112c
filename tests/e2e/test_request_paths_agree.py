"""One request layer: the CLI, the explorer's Engine, the Python API and the fake engine agree.

The same bad request gets the same error type and the same one-line message whichever way
it comes in; the same good request gets the same numbers under the same names
(engine/core/requests/ builds and validates, engine/sweeps/dispatch.py computes;
docs/internals.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headscope.engine.api import report
from headscope.engine.api.model import open_model
from headscope.engine.core import requests
from headscope.engine.core.errors import (
    HeadscopeError,
    IndexOutOfRangeError,
    InvalidRequestError,
    ResourceLimitError,
)
from headscope.engine.core.requests import (
    AblationSweepRequest,
    CircuitRequest,
    CompositionRequest,
    DirectionsRequest,
    HeadScoresRequest,
    ScoreTableRequest,
)
from headscope.engine.core.results import HeadScores, ScoreTable
from headscope.engine.core.validation import MAX_RESULT_BYTES, SCORE_NAMES, Z_NAMES
from headscope.engine.service.engine import Engine
from headscope.tui.cli import main as cli
from tests.conftest import sample_model
from tests.fake_engine import FakeEngine

MODEL = sample_model("attn-only-2l")


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> HeadscopeError:
    """The error the CLI raises for ``argv``, checked to be the one line it prints."""
    args = cli.build_parser().parse_args(cli.normalise_argv(argv))
    with pytest.raises(HeadscopeError) as raised:
        args.handler(args)
    assert cli.main(argv) == cli.EXIT_MODEL_ERROR
    assert capsys.readouterr().err == f"headscope: {raised.value.one_line()}\n"
    return raised.value


def cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    assert cli.main([*argv, "--json"]) == cli.EXIT_OK
    return json.loads(capsys.readouterr().out)


async def engine_error(path: Path, request: Callable[[Engine], Awaitable[Any]]) -> HeadscopeError:
    eng = Engine(path, workers=1, prefetch=False)
    try:
        with pytest.raises(HeadscopeError) as raised:
            await request(eng)
    finally:
        await eng.aclose()
    return raised.value


def same_error(a: HeadscopeError, b: HeadscopeError, kind: type[HeadscopeError]) -> None:
    assert type(a) is type(b) is kind
    assert a.one_line() == b.one_line()


def vocab_ranges(n_ids: int) -> str:
    """``--rows`` naming ``n_ids`` ids (``0:V`` ranges repeated): a block as big as you like."""
    d_vocab = open_model(MODEL).cfg.d_vocab
    spec = ",".join([f"0:{d_vocab}"] * (n_ids // d_vocab + 1))
    return spec


# -- the same bad request, the same error -------------------------------------------------------


async def test_head_out_of_range_is_the_same_error_from_the_cli_and_the_engine(capsys) -> None:
    from_cli = cli_error(["circuit", str(MODEL), "9", "0", "--kind", "qk"], capsys)
    from_engine = await engine_error(MODEL, lambda e: e.get(CircuitRequest.of(e.structure, 9, 0, "qk", limit=e.max_block_bytes)))
    same_error(from_cli, from_engine, IndexOutOfRangeError)
    assert "layer 9 out of range" in from_cli.reason
    with pytest.raises(HeadscopeError) as from_api:
        report.circuit_report(open_model(MODEL), 9, 0, "qk")
    same_error(from_api.value, from_engine, IndexOutOfRangeError)


async def test_token_out_of_range_is_the_same_error_from_the_cli_and_the_engine(capsys) -> None:
    from_cli = cli_error(["circuit", str(MODEL), "1", "2", "--kind", "ov", "--rows", "100000"], capsys)
    from_engine = await engine_error(MODEL, lambda e: e.get(CircuitRequest.of(e.structure, 1, 2, "ov", rows=[100000], limit=e.max_block_bytes)))
    same_error(from_cli, from_engine, IndexOutOfRangeError)


async def test_oversized_block_is_the_same_error_under_the_same_limit(capsys) -> None:
    n = 8200  # 8200² float32 cells: just over MAX_RESULT_BYTES
    assert 4 * n * n > MAX_RESULT_BYTES > 4 * 8000 * 8000
    spec = vocab_ranges(n)
    ids = [int(i) for part in spec.split(",") for i in range(*map(int, part.split(":")))]
    from_cli = cli_error(["circuit", str(MODEL), "0", "0", "--kind", "qk",
                          "--rows", spec, "--cols", spec], capsys)
    from_engine = await engine_error(MODEL, lambda e: e.get(CircuitRequest.of(e.structure, 0, 0, "qk", rows=ids, cols=ids, limit=e.max_block_bytes)))
    same_error(from_cli, from_engine, ResourceLimitError)
    assert f"a {len(ids)}×{len(ids)} block" in from_cli.reason


async def test_bad_kinds_are_the_same_error_from_export_the_api_and_the_engine(capsys, tmp_path) -> None:
    export = ["export", str(MODEL), "--out", str(tmp_path)]
    from_cli = cli_error([*export, "--what", "composition", "--kind", "qk"], capsys)
    from_engine = await engine_error(MODEL, lambda e: e.get(CompositionRequest.of(e.structure, "qk")))  # type: ignore[arg-type]
    same_error(from_cli, from_engine, InvalidRequestError)
    with pytest.raises(InvalidRequestError) as from_api:
        open_model(MODEL).composition("qk")
    same_error(from_api.value, from_engine, InvalidRequestError)

    from_cli = cli_error([*export, "--what", "circuit", "--kind", "q", "--layer", "0", "--head", "0"], capsys)
    from_engine = await engine_error(MODEL, lambda e: e.get(CircuitRequest.of(e.structure, 0, 0, "q", limit=e.max_block_bytes)))  # type: ignore[arg-type]
    same_error(from_cli, from_engine, InvalidRequestError)
    assert list(tmp_path.iterdir()) == []


async def test_position_basis_of_a_rotary_model_is_the_same_error(capsys, llama_dir) -> None:
    path, _ = llama_dir
    from_cli = cli_error(["circuit", str(path), "0", "0", "--kind", "qk", "--basis", "position"], capsys)
    from_engine = await engine_error(path, lambda e: e.get(CircuitRequest.of(e.structure, 0, 0, "qk", "position", limit=e.max_block_bytes)))
    same_error(from_cli, from_engine, InvalidRequestError)


# -- the same good request, the same numbers and names -------------------------------------------


@pytest.fixture
async def engine():
    eng = Engine(MODEL, workers=1, prefetch=False)
    await eng.ready()
    yield eng
    await eng.aclose()


async def test_heads_json_and_the_engine_score_table_agree_by_name(engine, capsys) -> None:
    rows = cli_json(["heads", str(MODEL)], capsys)
    table = await engine.get(ScoreTableRequest())
    assert [f.name for f in dataclasses.fields(ScoreTable)] == [*SCORE_NAMES, "nonfinite"]
    assert [f.name for f in dataclasses.fields(HeadScores)] == ["layer", "head", *SCORE_NAMES, "nonfinite"]
    assert [k for k in rows[0] if k not in ("layer", "head", "nonfinite") and not k.endswith("_z")] \
        == list(SCORE_NAMES)
    assert [k for k in rows[0] if k.endswith("_z")] == list(Z_NAMES)
    for row in rows:
        head = await engine.get(HeadScoresRequest.of(engine.structure, row["layer"], row["head"]))  # published by the sweep
        for name in SCORE_NAMES:
            assert row[name] == float(getattr(table, name)[row["layer"], row["head"]]), name
            assert row[name] == getattr(head, name), name


async def test_heads_json_ablation_effect_equals_the_engine_sweep(engine, capsys) -> None:
    rows = cli_json(["heads", str(MODEL), "--ablation"], capsys)
    effects = await engine.get(AblationSweepRequest())
    assert [r["ablation_effect"] for r in rows] == [float(v) for v in np.asarray(effects).ravel()]


async def test_composition_json_and_the_engine_composition_agree(engine, capsys) -> None:
    got = cli_json(["composition", str(MODEL), "--kind", "k", "--top", "5"], capsys)
    comp = await engine.get(CompositionRequest.of(engine.structure, "k"))
    assert got["baseline"] == comp.baseline
    np.testing.assert_array_equal(np.asarray(got["scores"], np.float32), comp.scores)
    assert [(*e["source"], *e["target"], e["above_baseline"]) for e in got["top_edges"]] \
        == [tuple(e) for e in comp.top_edges[:5]]


async def test_circuit_json_and_the_engine_block_agree(engine, capsys) -> None:
    got = cli_json(["circuit", str(MODEL), "1", "2", "--kind", "ov", "--rows", "3,9,4", "--cols", "0:6"],
                   capsys)
    block = await engine.get(CircuitRequest.of(engine.structure, 1, 2, "ov", rows=[3, 9, 4], cols=range(6), limit=engine.max_block_bytes))
    # one code path (head_circuits.circuit_block): the CLI and the explorer agree bit for bit
    np.testing.assert_array_equal(np.asarray(got["values"], np.float32), block.values)
    assert (got["row_labels"], got["col_labels"]) == (list(block.row_labels), list(block.col_labels))
    default = cli_json(["circuit", str(MODEL), "0", "1", "--kind", "qk"], capsys)  # no rows: the same default
    assert default["rows"] == list((await engine.get(CircuitRequest.of(engine.structure, 0, 1, "qk", limit=engine.max_block_bytes))).row_ids)


async def test_the_fake_engine_uses_the_same_names() -> None:
    fake = FakeEngine()
    table = await fake.get(ScoreTableRequest())
    head = await fake.get(HeadScoresRequest.of(fake.structure, 1, 2))
    assert [r for r in report.score_rows(table)[0] if r not in ("layer", "head", "nonfinite")] \
        == list(SCORE_NAMES)
    assert {f.name for f in dataclasses.fields(head)} >= set(SCORE_NAMES)
    assert head.induction_score == float(table.induction_score[1, 2])
    diff = await fake.compare(FakeEngine(seed=1))
    assert {"copying_score_delta", "induction_score_a", "prev_token_score_b"} <= set(diff.heads[0])


# -- the request types ---------------------------------------------------------------------------


def sample_requests() -> list[Any]:
    """One valid request of every type (each built with its own ``of`` where it has one)."""
    structure = open_model(MODEL).structure()
    return [
        requests.CircuitRequest.of(structure, 1, 2, "ov", rows=[3, 4], cols=[5]),
        requests.TopOutputsRequest.of(structure, 1, 2, 7, 5),
        requests.SpectrumRequest.of(structure, 1, 2, "qk"),
        requests.ProfileRequest(1, 2, (0, 1)),  # the sample model has learned positions
        requests.HeadScoresRequest.of(structure, 1, 2),
        requests.AblationRequest.of(structure, 1, 2),
        requests.DirectionsRequest.of(structure, 1, 2, "ov", 3, 4),
        requests.PathRequest.of(structure, (0, 1), (1, 2), [1, 2], [3]),
        requests.BehaviourRequest(),
        requests.ScoreTableRequest(),
        requests.ScoreNullRequest(),
        requests.CompositionRequest.of(structure, "k"),
        requests.AblationSweepRequest(),
        requests.PromptRequest.of(structure, "the cat"),
        requests.TokenizeRequest.of(structure, "the cat"),
        requests.InductionPromptsRequest.of(structure, "first-occurrence"),
        requests.QKAttributionRequest.of(structure, 1, 2, [1, 2, 3, 1], 3, 2),
        # the explorer's patching inputs (text or ids), resolved where it runs
        requests.PatchInputsRequest.of(structure, clean=[1, 2, 3], corrupt=[1, 2, 4], answer=5, wrong=6,
                                       site="k", edges=[((0, 1), (1, 2))]),
        requests.EdgesRequest.of(structure, task="first-occurrence", verify=2),
        requests.FaithfulnessRequest.of(structure, clean=[[1, 2, 3]], corrupt=[[1, 2, 4]], answer=5, wrong=6,
                                        tops=(3,), curve=True),
        requests.PatchRequest.of(structure, clean=[[1, 2, 3]], corrupt=[[1, 2, 4]], answer=5, wrong=6),
    ]


def _other(value: Any) -> Any:
    """A different value of the same field."""
    if value is None:
        return 1
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return (*value, value[0]) if value else (1,)


async def test_a_bad_request_is_the_same_error_built_from_the_api_the_cli_and_the_engine(capsys) -> None:
    structure = open_model(MODEL).structure()
    with pytest.raises(InvalidRequestError) as built:
        requests.DirectionsRequest.of(structure, 1, 2, "ov", 0, 10)
    from_cli = cli_error(["svd", str(MODEL), "1", "2", "--kind", "ov", "--k", "0"], capsys)
    from_engine = await engine_error(MODEL, lambda e: e.get(DirectionsRequest.of(e.structure, 1, 2, "ov", k=0)))
    with pytest.raises(InvalidRequestError) as from_api:
        open_model(MODEL).singular_directions(1, 2, "ov", k=0)
    for other in (from_cli, from_engine, from_api.value):
        same_error(built.value, other, InvalidRequestError)
    assert "--k must be at least 1" in built.value.reason


# The forward passes run in float32 with torch's threads as the Engine sets them (cpus //
# workers) or as a notebook leaves them: the reductions split differently, a few float32 ulps
# apart (seen: 6e-7 relative on a patching metric). The weight views are numpy: bit for bit.
FORWARD = (requests.PatchRequest, requests.PatchInputsRequest, requests.BehaviourRequest, requests.ScoreTableRequest,
           requests.ScoreNullRequest, requests.HeadScoresRequest, requests.AblationRequest,
           requests.AblationSweepRequest, requests.QKAttributionRequest,
           requests.EdgesRequest, requests.FaithfulnessRequest)


def agree(got: Any, want: Any, exact: bool, where: str) -> None:
    if isinstance(want, np.ndarray | float):
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=where)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=where)
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):
            agree(getattr(got, field.name), getattr(want, field.name), exact, f"{where}.{field.name}")
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            agree(got[key], want[key], exact, f"{where}[{key}]")
    elif isinstance(want, tuple | list) and want and not isinstance(want[0], int | str):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            agree(a, b, exact, f"{where}[{i}]")
    else:
        assert got == want, where


async def test_engine_get_and_model_get_give_the_same_numbers(engine) -> None:
    model = open_model(MODEL)
    for req in sample_requests():
        if isinstance(req, requests.PromptRequest | requests.ProfileRequest):
            continue  # a PromptRun is the Engine's per-head view's source; no rotary profile here
        agree(await engine.get(req), model.get(req), not isinstance(req, FORWARD), type(req).__name__)


# -- the shared pieces -----------------------------------------------------------------------
