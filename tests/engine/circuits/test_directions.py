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
from headscope.engine.core.requests import DirectionsRequest
from headscope.engine.core.validation import SCORE_NAMES, Z_NAMES
from headscope.engine.forward import behaviour, null, sinks
from headscope.engine.forward import null as null_module
from headscope.engine.forward.torch_weights import torch_weights
from headscope.engine.forward.transformer import run
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


def test_svd_json_schema_and_the_copying_head_reads_what_it_writes(capsys) -> None:
    got = cli_json(["svd", str(MODEL_PATH), *map(str, INDUCTION_HEAD), "--kind", "ov", "--k", "5",
                    "--top", "10"], capsys)
    assert {"layer", "head", "kind", "singular_values", "directions"} <= set(got)
    assert (got["layer"], got["head"], got["kind"]) == (*INDUCTION_HEAD, "ov")
    assert len(got["singular_values"]) == len(got["directions"]) == 5
    first = got["directions"][0]
    assert {"direction", "sigma", "in_tokens", "out_tokens"} <= set(first)
    assert [d["direction"] for d in got["directions"]] == [1, 2, 3, 4, 5]  # as the panel: 1/5
    assert set(first["in_tokens"][0]) == {"id", "token", "value"} and len(first["in_tokens"]) == 10
    magnitudes = [abs(t["value"]) for t in first["in_tokens"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    prev = cli_json(["svd", str(MODEL_PATH), *map(str, PREV_TOKEN_HEAD), "--kind", "ov"], capsys)
    assert got["overlap"] > 0.4  # the induction head copies: it writes the tokens it reads
    assert prev["overlap"] < 0.1  # the previous-token head's OV does not


# -- virtual heads ----------------------------------------------------------------------------


def test_virtual_heads_equal_the_dense_products(model: Any) -> None:
    w = torch_weights(model.weights)  # the dense products in torch float64, on the same arrays
    a, b = head_weights(w, *PREV_TOKEN_HEAD), head_weights(w, *INDUCTION_HEAD)
    w_e, w_u = w.get("embed.W_E").double(), w.get("unembed.W_U").double()
    ov_a = a["W_V"].double() @ a["W_O"].double()
    virtual = w_e @ ov_a @ b["W_V"].double() @ b["W_O"].double() @ w_u
    k_path = w_e @ b["W_Q"].double() @ b["W_K"].double().T @ ov_a.T @ w_e.T
    nw = model.weights
    torch.testing.assert_close(
        torch.from_numpy(directions.virtual_ov(nw, PREV_TOKEN_HEAD, INDUCTION_HEAD).AB).double(),
        virtual, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(
        torch.from_numpy(directions.k_path(nw, PREV_TOKEN_HEAD, INDUCTION_HEAD).AB).double(),
        k_path, atol=1e-3, rtol=1e-4)


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


# -- calibrated scores ----------------------------------------------------------------------------


def test_heads_json_has_the_sink_score_and_a_z_for_every_score(capsys) -> None:
    rows = cli_json(["heads", str(MODEL_PATH)], capsys)
    assert "attention_sink_score" in SCORE_NAMES
    assert all(set(Z_NAMES) | set(SCORE_NAMES) <= set(r) for r in rows)
    z = {(r["layer"], r["head"]): r["induction_score_z"] for r in rows}
    assert z[INDUCTION_HEAD] > 10  # far above random heads of the same shapes and norms
    assert max(z[(0, h)] for h in range(3)) < 3
    assert {(r["layer"], r["head"]) for r in rows if r["prev_token_score_z"] > 100} == {PREV_TOKEN_HEAD}


def test_the_null_is_seeded_and_z_is_the_standardised_score(model: Any) -> None:
    null = score_sweeps.score_null(model, seed=0, samples=16)
    again = score_sweeps.score_null(model, seed=0, samples=16)
    other = score_sweeps.score_null(model, seed=1, samples=16)
    np.testing.assert_array_equal(null.mean, again.mean)
    assert not np.array_equal(null.mean, other.mean)
    table = score_sweeps.score_table(model)
    i = null.names.index("induction_score")
    expected = (table.induction_score[1, 2] - null.mean[i, 1]) / null.std[i, 1]
    assert null.z("induction_score", table.induction_score)[1, 2] == pytest.approx(expected, rel=1e-5)
    # the weight-based nulls do not depend on the layer (the same embeddings, any norm)
    j = null.names.index("copying_score")
    assert null.mean[j, 0] == null.mean[j, 1]


def test_the_table_and_its_null_come_from_one_forward_pass(model: Any, monkeypatch) -> None:
    """`heads` scores the real heads' behaviour, the sinks and the random heads' behaviour (the
    z's) in one pass with every batch side by side: each layer's MLP runs once for all the
    batches and its weights are read once (a 7B model reads 13 GB of weights per pass; the
    passes used to be one per batch, and three of them), with the same numbers as the
    separate requests and, up to float rounding, as the behavioural scores on their own."""
    from headscope.engine.forward import transformer as forward

    table, null = score_sweeps.score_table(model), score_sweeps.score_null(model)
    _, natural = score_sweeps.sink_batches(model)
    finished: list[int] = []
    real = forward.finish_block

    def counting(w: Any, layer: int, x: Any, a: Any) -> Any:
        finished.append(layer)
        return real(w, layer, x, a)

    monkeypatch.setattr(forward, "finish_block", counting)
    shared, shared_null = score_sweeps.calibrated_score_table(model)
    assert natural and finished == list(range(model.cfg.n_layers))
    assert shared_null is not None
    for name in (*SCORE_NAMES, "nonfinite"):
        np.testing.assert_array_equal(getattr(shared, name), getattr(table, name), err_msg=name)
    np.testing.assert_array_equal(shared_null.mean, null.mean)
    np.testing.assert_array_equal(shared_null.std, null.std)
    alone = behaviour.behaviour_scores(model.weights)
    for name, score in alone.items():
        np.testing.assert_allclose(getattr(shared, f"{name}_score"), score.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_null_spectral_scores_are_scale_free() -> None:
    middle = torch.randn(16, 16, generator=torch.Generator().manual_seed(3)).numpy()
    a = directions.null_spectral_scores(middle, 4, seed=0, samples=8)
    b = directions.null_spectral_scores(middle * 1e3, 4, seed=0, samples=8)
    np.testing.assert_allclose(a, b, rtol=1.3e-6, atol=1e-5)


def test_null_spectral_scores_draw_torchs_seeded_normals() -> None:
    """The random heads are ``torch.randn``'s, seeded as before (numbers kept across the move to
    numpy): every draw within one float32 ulp, the scores as the torch computation gives them."""
    g = torch.Generator().manual_seed(5)
    bits = np.random.RandomState(5)._bit_generator
    for size in (16 * 7, 1000, 37):
        want = torch.randn(size, generator=g).numpy()
        got = directions.torch_normals(bits, size)
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=3e-7)
    middle = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, 4, generator=g), torch.randn(8, 16, 4, generator=g)
    eig = torch.linalg.eigvals((y.transpose(-2, -1) @ middle @ x).double())
    want = (eig.real.sum(-1) / eig.abs().sum(-1)).float().numpy()
    np.testing.assert_allclose(directions.null_spectral_scores(middle.numpy(), 4, seed=0, samples=8), want,
                               atol=1e-6)


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


def test_a_malformed_head_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["path", str(MODEL_PATH), "L0H1", "L1.H2"])
    assert raised.value.code == cli.EXIT_USAGE
    assert "L1.H2" in capsys.readouterr().err


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
        directions = await eng.singular_directions(1, 2, "ov", k=3, top=5)
        # The Engine computes on its worker thread (one BLAS thread), the report here: the same
        # numbers up to float32 summation order.
        assert_close(report.svd_dict(directions), report.svd_report(model, 1, 2, "ov", k=3, top=5))
        path = await eng.virtual_path((0, 1), (1, 2))
        assert_close(report.path_dict(path), report.path_report(model, (0, 1), (1, 2)))
        null = await eng.score_null()
        assert null is await eng.score_null()  # cached
        scores = await eng.head_scores(1, 1)
        assert scores.attention_sink_score == pytest.approx(float(score_sweeps.sink_tables(model)[0][1, 1]))
        with pytest.raises(InvalidRequestError):
            await eng.virtual_path((1, 0), (0, 1))
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
            nulls.append(await eng.score_null())
        finally:
            await eng.aclose()
    np.testing.assert_array_equal(nulls[0].mean, nulls[1].mean)
    np.testing.assert_array_equal(nulls[0].std, nulls[1].std)


def test_the_model_api_gives_what_the_cli_prints(model: Any, capsys) -> None:
    assert model.singular_directions(1, 2, "qk", k=2, top=3) == cli_json(
        ["svd", str(MODEL_PATH), "1", "2", "--kind", "qk", "--k", "2", "--top", "3"], capsys)
    assert json.loads(json.dumps(model.virtual_path((0, 1), (1, 2)))) == cli_json(
        ["path", str(MODEL_PATH), "0.1", "1.2"], capsys)


def test_non_finite_embeddings_give_a_nan_null_not_a_crash() -> None:
    middle = np.eye(8, dtype=np.float32)
    middle[2, 3] = float("nan")
    assert np.isnan(directions.null_spectral_scores(middle, 4, seed=0, samples=4)).all()


def test_terminal_tables_print_token_strings_literally(monkeypatch, capsys) -> None:
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    output.emit({}, False, lambda: (["token"], [["[bold red]x[/bold red]"]]))
    assert "[bold red]x[/bold red]" in capsys.readouterr().out


def test_random_heads_are_causal_only_in_causal_models() -> None:
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))
    (causal,) = null.random_head_patterns([x], 4, 3.0, 3.0, 2.0, None, seed=0, samples=5)
    (encoder,) = null.random_head_patterns([x], 4, 3.0, 3.0, 2.0, None, seed=0, samples=5, causal=False)
    assert causal.shape == (2, 5, 6, 6)
    torch.testing.assert_close(causal.sum(-1), torch.ones(2, 5, 6))
    above = torch.ones(6, 6, dtype=torch.bool).triu(1)  # keys after the query
    assert float(causal[..., above].abs().max()) == 0.0 and float(encoder[..., above].min()) > 0.0


def test_a_non_finite_row_projects_to_nan_alone() -> None:
    """A token whose stream is NaN/inf gets NaN random-head projections; the span of the
    other rows, and so their projections, stay finite."""
    rows = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    rows[2, 3], rows[4, 0] = float("nan"), float("inf")
    q, k = null.random_projections(rows, 4, (1.0, 2.0), 3, *null.head_generators(0))
    for t in (q, k):
        assert t.shape == (3, 6, 4)
        assert t[:, [2, 4]].isnan().all() and torch.isfinite(t[:, [0, 1, 3, 5]]).all()


def test_random_heads_move_with_the_rows_not_with_their_rounding() -> None:
    """A repeated token's layer-0 stream is the same row up to rounding: the draw must be a
    continuous function of the rows, so a 1e-7 change in them (another summation order) moves
    the projections by about as much, not by a redrawn basis (a QR of the rows did: ~0.5)."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randn(20, 64, generator=g, dtype=torch.float64)
    rows = tokens[torch.randint(0, 20, (50,), generator=g)]  # 50 rows, rank 20
    rows = rows + 1e-7 * torch.randn(rows.shape, generator=g, dtype=torch.float64)
    moved = rows + 1e-7 * torch.randn(rows.shape, generator=g, dtype=torch.float64)
    a, _ = null.random_projections(rows.float(), 8, (1.0, 1.0), 4, *null.head_generators(0))
    b, _ = null.random_projections(moved.float(), 8, (1.0, 1.0), 4, *null.head_generators(0))
    assert float(a.abs().max()) > 0.1
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def _quantiles(t: torch.Tensor) -> torch.Tensor:
    return torch.quantile(t.double(), torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64))


@pytest.mark.parametrize("n_rows", [4, 12])  # fewer rows than d (drawn in their span), more
def test_random_heads_drawn_in_the_rows_span_have_the_distribution_of_whole_ones(n_rows: int) -> None:
    """``rows @ W`` for Gaussian ``W [d, e]`` rescaled to a norm: drawn as ``Rᵀ (Qᵀ W)`` and a
    χ² for the rest of W, against drawing W itself (docs/math.md, "Calibrated scores")."""
    d, e, norm, samples = 10, 3, 2.5, 40_000
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(n_rows, d, generator=g, dtype=torch.float64)
    rows[1] = rows[0]  # the same token twice (a repeated sequence's first layer)
    got, other = null.random_projections(rows.float(), e, (norm, 2 * norm), samples, *null.head_generators(7))
    got = got.double()
    assert not torch.allclose(other.double(), 2 * got)  # two sets of heads, not one rescaled
    whole = torch.randn(samples, d, e, generator=g, dtype=torch.float64)
    whole = whole * (norm / whole.norm(dim=(1, 2)))[:, None, None]
    want = rows @ whole
    assert got.shape == (samples, n_rows, e)
    torch.testing.assert_close(got[:, 1], got[:, 0], rtol=1e-5, atol=1e-5)
    # second moments: E[P Pᵀ] = norm²/d · e/e · rows rowsᵀ for W uniform on the sphere
    second = torch.einsum("sne,sme->nm", got, got) / samples
    torch.testing.assert_close(second, norm**2 / d * rows @ rows.T, rtol=0.03, atol=0.03 * norm**2)
    # and the shape of the distribution: ‖P‖², one entry, one score-like product
    for stat in (lambda p: p.square().sum((1, 2)), lambda p: p[:, 2, 0], lambda p: (p[:, 2] * p[:, 3]).sum(-1)):
        torch.testing.assert_close(_quantiles(stat(got)), _quantiles(stat(want)), rtol=0.05, atol=0.03)


def test_an_encoder_gets_a_null(bert_base_dir) -> None:
    path, _ = bert_base_dir
    null = score_sweeps.score_null(open_model(path), samples=8)
    assert null.names == SCORE_NAMES
    # (no punctuation in the fixture's vocabulary: no delimiter-sink null, NaN rather than 0)
    assert np.isfinite(np.delete(null.mean, SCORE_NAMES.index("delimiter_sink_score"), 0)).all()
