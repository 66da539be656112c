"""The first-occurrence task of patching (issue #27; docs/math.md, "Patching"): the induction
task's clean tokens, a corrupt run that redraws the first copy's even positions instead of
the second copy. Its tokens; on attn-only-2l the path through L1.H2's keys from the
previous-token head L0.H1 carries the answer there (on the induction task it carries
nothing); exact patching on it against TransformerLens; the task wired through the request,
the results store, the API and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from headscope.engine.api.model import open_model as open_api_model
from headscope.engine.api.store import default_store
from headscope.engine.core.errors import InvalidRequestError
from headscope.engine.core.requests import PatchRequest
from headscope.engine.forward import patch_tasks, patching
from headscope.engine.model.loading import load_model
from headscope.tui.session.patch import NEAR_ZERO
from tests.conftest import sample_model
from tests.engine.forward.test_patching import boot_native
from tests.engine.forward.test_patching_parity import ATOL, close, patched
from tests.engine.test_tl_parity import boot_transformer_lens
from tests.tui.cli.test_store import run, run_json

MODEL = sample_model("attn-only-2l")
TASK = "first-occurrence"
EDGE = ((0, 1), (1, 2))  # the tour's K-composition: previous-token head -> induction head
# the README's typed first-occurrence prompts (one redrawn token, logit difference) recover
# 0.33 through this edge; the task asks the same of every read position (see the test)
README_PROMPTS_K = 0.33


def task(vocab: int = 414, n_ctx: int = 64, seed: int = 0, seq_len: int | None = None,
         batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return patch_tasks.induction_task(vocab, n_ctx, seed, seq_len, batch, task=TASK)


# -- the tokens -------------------------------------------------------------------------------


def test_the_first_copy_is_redrawn_at_even_positions_the_second_kept() -> None:
    clean, corrupt = task(seq_len=9, batch=3)
    assert clean.shape == corrupt.shape == (3, 18)
    ind_clean, ind_corrupt = patch_tasks.induction_task(414, 64, 0, 9, 3)
    assert torch.equal(clean, ind_clean)  # the same clean sequences as the induction task
    assert torch.equal(clean[:, :9], clean[:, 9:])
    assert torch.equal(corrupt[:, 9:], clean[:, 9:])  # the second copy is the clean one
    even, odd = torch.arange(0, 9, 2), torch.arange(1, 9, 2)
    assert torch.equal(corrupt[:, odd], clean[:, odd])  # the answers stay in place
    assert (corrupt[:, even] != clean[:, even]).all()
    for row in range(3):
        redrawn = corrupt[row, even]
        # a redrawn token is none of the sequence's: no second-half query finds it
        assert not torch.isin(redrawn, clean[row]).any()
        assert len(set(redrawn.tolist())) == len(redrawn)
    # the induction task is another corrupt run: its first copy is the clean one
    assert torch.equal(ind_corrupt[:, :9], clean[:, :9]) and not torch.equal(ind_corrupt, corrupt)


def test_the_task_is_seeded() -> None:
    assert all(torch.equal(a, b) for a, b in zip(task(seed=5), task(seed=5), strict=True))
    assert not torch.equal(task(seed=5)[1], task(seed=6)[1])
    assert not torch.equal(task(seed=5)[0], task(seed=6)[0])


def test_a_small_vocabulary_still_gives_the_shapes() -> None:
    """Fewer ids than the sequence and its redrawn tokens: drawn with repeats, same shapes."""
    for vocab in (3, 12):
        clean, corrupt = task(vocab=vocab, seq_len=8, batch=2)
        assert clean.shape == corrupt.shape == (2, 16)
        assert int(corrupt.max()) < vocab and torch.equal(corrupt[:, 8:], clean[:, 8:])
    with pytest.raises(InvalidRequestError, match="the task must be one of induction, first-occurrence"):
        patch_tasks.induction_task(414, 64, task="first")


# -- on attn-only-2l ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def attn2() -> Any:
    return load_model(MODEL)


def test_the_metric_is_defined_and_reads_the_kept_answers(attn2: Any) -> None:
    """The metric reads the predictions at T + i for even i (answer kept, first occurrence
    redrawn): clean well above corrupt, at least the induction task's clean level minus
    noise, and the corrupt run no better than chance-level guessing."""
    w = attn2.weights
    clean, corrupt = patch_tasks.induction_task(w.cfg.d_vocab, w.cfg.n_ctx, 0, task=TASK)
    metric = patch_tasks.task_metric(TASK, clean)
    assert metric.name == TASK and metric.every == 2
    found = patching.patch_heads(w, clean, corrupt, metric)
    assert found.metric == TASK and found.recovered_defined
    assert found.clean > -0.5 and found.corrupt < -3.0  # the model copies; without the copy it guesses
    # by hand: the log-probabilities at T, T+2, ... of the clean next token
    from headscope.engine.forward.transformer import run

    half = clean.shape[1] // 2
    for name, tokens, value in (("clean", clean, found.clean), ("corrupt", corrupt, found.corrupt)):
        logits = torch.as_tensor(run(w, tokens).logits)
        logp = torch.log_softmax(logits[:, half:-1].float(), -1).gather(-1, clean[:, half + 1:, None])[..., 0]
        assert value == pytest.approx(float(logp[:, ::2].mean()), abs=ATOL, rel=ATOL), name


def test_the_k_path_of_the_induction_head_carries_the_answer_here(attn2: Any) -> None:
    """L0.H1 -> L1.H2 (K): on the induction task nothing (its runs share the first copy,
    where the keys are); here the one path back to the answer. Every read position is the
    README prompts' situation (first occurrence changed, answer kept), so the edge recovers
    at least their third; through q or v it recovers nothing (q: the query token is the
    same in both runs; v: the answer's value is the same too)."""
    w = attn2.weights
    found = {}
    for name in patch_tasks.TASKS:
        clean, corrupt = patch_tasks.induction_task(w.cfg.d_vocab, w.cfg.n_ctx, 0, task=name)
        metric = patch_tasks.task_metric(name, clean)
        for kind in patching.PATH_INPUTS:
            (row,) = patching.path_patch(w, clean, corrupt, metric, [EDGE], receiver_input=kind).rows
            found[name, kind] = row.recovered
    assert abs(found["induction", "k"]) < NEAR_ZERO  # "unused on this task" there
    assert found[TASK, "k"] > README_PROMPTS_K
    assert found[TASK, "k"] - found["induction", "k"] > 0.3
    assert abs(found[TASK, "q"]) < NEAR_ZERO and abs(found[TASK, "v"]) < NEAR_ZERO


def test_exact_patching_matches_transformer_lens_on_attn_only_2l(attn2: Any) -> None:
    """Every head at every site on the first-occurrence task, against TransformerLens'
    ``get_act_patch_attn_head_*_all_pos`` on its native bridge, the metric written out."""
    from transformer_lens import patching as tl_patching

    tl = boot_native(MODEL)
    check_against_tl(attn2, tl, tl_patching, seq_len=12, batch=2)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_exact_patching_matches_transformer_lens_on_fixtures(name: str, request: pytest.FixtureRequest) -> None:
    from transformer_lens import patching as tl_patching

    path, _ = request.getfixturevalue(f"{name}_dir")
    check_against_tl(load_model(path), boot_transformer_lens(path), tl_patching, seq_len=6, batch=2)


def check_against_tl(model: Any, tl: Any, tl_patching: Any, seq_len: int, batch: int) -> None:
    cfg = model.cfg
    clean, corrupt = patch_tasks.induction_task(cfg.d_vocab, cfg.n_ctx, 3, seq_len, batch, task=TASK)
    half = clean.shape[1] // 2

    def tl_metric(logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits[:, half:-1].float(), dim=-1)
        return logp.gather(-1, clean[:, half + 1:, None])[:, ::2].mean()

    metric = patch_tasks.task_metric(TASK, clean)
    with torch.no_grad():
        _, cache = tl.run_with_cache(clean)
        for site in ("out", "q", "k", "v"):  # the pattern edit: test_patching_parity's cases
            if site in ("k", "v") and cfg.kv_heads != cfg.n_heads:
                continue  # grouped keys: test_patching_parity patches the query heads' group
            theirs = getattr(tl_patching, f"get_act_patch_attn_head_{site}_all_pos")(tl, corrupt, cache, tl_metric)
            found = patching.patch_heads(model.weights, clean, corrupt, metric, site=site)
            close(patched(found, theirs.shape), theirs, site)
        assert found.clean == pytest.approx(float(tl_metric(tl(clean))), abs=ATOL, rel=ATOL)
        assert found.corrupt == pytest.approx(float(tl_metric(tl(corrupt))), abs=ATOL, rel=ATOL)


# -- the request, the store, the API, the CLI ---------------------------------------------------


def test_the_request_names_the_task_and_refuses_it_with_prompts() -> None:
    structure = load_model(MODEL).structure()
    req = PatchRequest.of(structure, task=TASK, where="m")
    assert req.task == TASK and req.seq_len == 32
    assert req.key() != PatchRequest.of(structure, where="m").key()
    assert PatchRequest.of(structure, where="m").task == "induction"
    with pytest.raises(InvalidRequestError, match="--task must be one of induction, first-occurrence"):
        PatchRequest.of(structure, task="logit_diff", where="m")
    with pytest.raises(InvalidRequestError, match="makes its own inputs"):
        PatchRequest.of(structure, task=TASK, clean=[[1, 2]], corrupt=[[1, 3]], answer=1,
                                 wrong=2, where="m")


def test_the_api_and_the_store_keep_the_tasks_apart(_results_store_in_tmp: Path) -> None:
    model = open_api_model(MODEL)
    store = default_store()
    induction = model.path_patch(*EDGE, patch="k", store=store)
    first = model.path_patch(*EDGE, patch="k", task=TASK, store=store)
    assert (induction.metric, first.metric) == ("induction", TASK)
    assert first.rows[0].recovered > induction.rows[0].recovered + 0.3
    # read back from the store: each task its own entry
    again = model.path_patch(*EDGE, patch="k", task=TASK, store=store)
    assert (again.clean, again.corrupt, again.rows[0].patched) == (first.clean, first.corrupt, first.rows[0].patched)
    heads = model.patch(task=TASK, store=store)
    assert heads.metric == TASK and (heads.clean, heads.corrupt) == (first.clean, first.corrupt)


def test_the_cli_runs_the_task(capsys) -> None:
    path = run_json(capsys, "path-patch", str(MODEL), "L0.H1", "L1.H2", "--patch", "k", "--task", TASK)
    assert (path["method"], path["site"], path["metric"]) == ("path", "k", TASK)
    found = open_api_model(MODEL).path_patch((0, 1), (1, 2), patch="k", task=TASK)
    assert path["heads"][0]["recovered"] == found.rows[0].recovered
    report = run_json(capsys, "patch", str(MODEL), "--task", TASK, "--seq-len", "8", "--batch", "2")
    assert report["metric"] == TASK and report["tokens"] == 16 and report["batch"] == 2
    assert report["clean"] > report["corrupt"]
    code, out, err = run(capsys, "patch", str(MODEL), "--task", TASK, "--clean", "a b", "--corrupt", "a c",
                         "--answer", "a", "--wrong", "b")
    assert code == 2 and out == "" and "--task first-occurrence makes its own inputs" in err
