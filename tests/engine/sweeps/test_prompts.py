"""What ``patch`` / ``Model.patch`` make of their inputs (issue 39 §2, items 4, 8 and 13): words
outside a word-level vocabulary (said, or refused when they are the only difference), digit
answers with text prompts (a vocabulary token ``7`` is the token; ``id:7`` the id), and the
natural Python forms of the API (numpy ints and arrays, batches of texts, ``"L0.H1"``)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from headscope.engine.api.model import InputWarning, open_model
from headscope.engine.core.errors import InvalidRequestError, PromptError
from headscope.engine.sweeps.prompts import patch_request
from tests.conftest import sample_model
from tests.tui.cli.test_store import run

MODEL = str(sample_model("attn-only-2l"))
CLEAN = "cake card kite cup hotel mouse cake card kite cup hotel"
CORRUPT = "cake card kite cup hotel mouse Ivy Jack shoe Ryan Lily"


# -- 4: words outside the vocabulary -------------------------------------------------------------

def test_unknown_words_are_said_once_naming_them(capsys) -> None:
    corrupt = "cake card kite cup hotel mouse Zorb Quux shoe Ryan Lily"
    code, out, err = run(capsys, "patch", MODEL, "--clean", CLEAN, "--corrupt", corrupt,
                         "--answer", "mouse", "--wrong", "Ivy", "--no-cache", "--heads", "L1.H2")
    assert code == 0 and "L1.H2" in out
    lines = [line for line in err.splitlines() if "<unk>" in line]
    assert lines == [f"headscope: warning: {MODEL}: words outside the vocabulary become <unk> in the "
                     "corrupt prompt: Zorb, Quux"]
    with pytest.warns(InputWarning, match="Zorb, Quux"):
        open_model(MODEL).patch(CLEAN, corrupt, answer="mouse", wrong="Ivy", heads="L1.H2")


def test_known_words_say_nothing(capsys) -> None:
    notes: list[str] = []
    patch_request(open_model(MODEL), CLEAN, CORRUPT, answer="mouse", wrong="Ivy", notes=notes)
    assert notes == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        open_model(MODEL).patch(CLEAN, CORRUPT, answer="mouse", wrong="Ivy", heads="L1.H2")


def test_the_explorers_patch_result_notes_the_unknown_words() -> None:
    """The Patch tab's request (text as typed) carries the same note in its result, which the
    tab shows; known words add none."""
    from headscope.engine.core.requests import PatchInputsRequest
    from headscope.engine.sweeps.dispatch import compute

    model = open_model(MODEL)
    corrupt = "cake card kite cup hotel mouse Zorb Quux shoe Ryan Lily"
    for text, said in ((corrupt, True), (CORRUPT, False)):
        req = PatchInputsRequest.of(model.structure(), clean=CLEAN, corrupt=text, answer="mouse", wrong="Ivy",
                                    edges=[((0, 1), (1, 2))], site="k")
        note = compute(model, req).note
        assert ("words outside the vocabulary become <unk> in the corrupt prompt: Zorb, Quux" in note) is said
        assert note.count("<unk>") == int(said)


def test_prompts_differing_only_in_unknown_words_are_refused(capsys) -> None:
    clean = "cake card kite cup hotel mouse cake card Blorp cup hotel"
    corrupt = "cake card kite cup hotel mouse cake card Zorp cup hotel"
    code, out, err = run(capsys, "patch", MODEL, "--clean", clean, "--corrupt", corrupt,
                         "--answer", "mouse", "--wrong", "Ivy")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "differ only in words outside the vocabulary (Blorp, Zorp)" in err
    with pytest.raises(PromptError, match="Blorp, Zorp"):
        open_model(MODEL).patch(clean, corrupt, answer="mouse", wrong="Ivy")
    # a batch of texts too; words unknown in both prompts are named once
    with pytest.raises(PromptError, match="differ only in words outside the vocabulary"):
        patch_request(open_model(MODEL), [CLEAN, clean], [CLEAN, corrupt], answer="mouse", wrong="Ivy")
    notes: list[str] = []
    patch_request(open_model(MODEL), ["cake Zorb", "cake card"], ["cake Quux", "cake kite"], answer="mouse",
                  wrong="Ivy", notes=notes)
    assert notes == ["words outside the vocabulary become <unk> in the clean and corrupt prompts: Zorb, Quux"]


# -- 8: digit answers ----------------------------------------------------------------------------

@pytest.fixture
def digit_model(tmp_path: Path) -> Path:
    """attn-only-2l with two words of its vocabulary respelled ``7`` and ``5`` (ids 45, 50)."""
    source = sample_model("attn-only-2l")
    for name in ("headscope.json", "model.safetensors"):
        shutil.copy(source / name, tmp_path / name)
    words = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    words[45], words[50] = "7", "5"
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return tmp_path


def test_digits_with_text_prompts_are_the_vocabulary_token(digit_model: Path, capsys) -> None:
    model = open_model(digit_model)
    clean, corrupt = "cake card 7 cup", "cake card 5 cup"
    notes: list[str] = []
    req = patch_request(model, clean, corrupt, answer="7", wrong="5", notes=notes)
    assert (req.answer, req.wrong) == (45, 50)
    assert notes == ["the answer '7' is the token '7' (id 45), as the prompts are text; write id:7 for the id 7",
                     "the wrong '5' is the token '5' (id 50), as the prompts are text; write id:5 for the id 5"]
    # the explicit id form, whatever the prompts
    for answer, wrong in (("id:7", "id:5"), ("#7", "#5"), (7, 5), (np.int64(7), np.int32(5))):
        req = patch_request(model, clean, corrupt, answer=answer, wrong=wrong)
        assert (req.answer, req.wrong) == (7, 5)
    # digits spelling no token stay an id
    assert patch_request(model, clean, corrupt, answer="12", wrong="5").answer == 12
    code, _, err = run(capsys, "patch", str(digit_model), "--clean", clean, "--corrupt", corrupt,
                       "--answer", "7", "--wrong", "5", "--no-cache", "--heads", "L1.H2")
    assert code == 0 and "the answer '7' is the token '7' (id 45)" in err


def test_digits_with_id_prompts_stay_ids(digit_model: Path, capsys) -> None:
    model = open_model(digit_model)
    req = patch_request(model, [1, 2, 45, 3], [1, 2, 50, 3], answer="7", wrong="5")
    assert (req.answer, req.wrong) == (7, 5)
    code, _, err = run(capsys, "patch", str(digit_model), "--clean-tokens", "1,2,45,3", "--corrupt-tokens",
                         "1,2,50,3", "--answer", "7", "--wrong", "5", "--no-cache", "--heads", "L1.H2", "--json")
    assert code == 0 and "token" not in err


# -- 13: the API's natural forms -----------------------------------------------------------------

def test_heads_from_the_table_numpy_batches_and_text_batches() -> None:
    model = open_model(MODEL)
    table = model.patch().table()
    best = np.unravel_index(np.nanargmax(table), table.shape)  # numpy ints
    assert model.patch(heads=best).rows[0].heads == ((1, 2),)
    assert model.patch(heads=np.array([[1, 2], [1, 1]])).rows[0].heads == ((1, 2), (1, 1))
    one = model.patch(CLEAN, CORRUPT, answer="mouse", wrong="Ivy", heads="L1.H2").rows[0].recovered
    ids = np.array([model.tokenizer.encode(CLEAN)] * 2)
    other = np.array([model.tokenizer.encode(CORRUPT)] * 2)
    assert model.patch(ids, other, answer="mouse", wrong="Ivy", heads="L1.H2").rows[0].recovered == \
        pytest.approx(one, rel=1e-5)
    texts = model.patch([CLEAN, CLEAN], [CORRUPT, CORRUPT], answer="mouse", wrong="Ivy", heads="L1.H2")
    assert texts.rows[0].recovered == pytest.approx(one, rel=1e-5)


def test_path_patch_takes_head_names_and_numpy_pairs() -> None:
    model = open_model(MODEL)
    expected = model.path_patch((0, 1), (1, 2), patch="k", task="first-occurrence").rows[0]
    for sender, receiver in (("L0.H1", "L1.H2"), (np.array([0, 1]), (np.int64(1), 2))):
        found = model.path_patch(sender, receiver, patch="k", task="first-occurrence").rows[0]
        assert found.heads == expected.heads and found.recovered == expected.recovered


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.patch(seed=2**70), "the seed must be between 0 and 2\\*\\*63-1"),
    (lambda m: m.patch(seed=-1), "the seed must be between"),
    (lambda m: m.patch(heads=[1.5, 2]), "is not a head"),
    (lambda m: m.patch(heads=7), "is not a head"),
    (lambda m: m.patch([1, "x"], [1, 2], answer=1, wrong=2), "the clean prompt has 'x'"),
    (lambda m: m.patch(CLEAN, CORRUPT, answer=True, wrong="Ivy"), "the answer token is True"),
    (lambda m: m.patch(CLEAN, CORRUPT, answer="id:x", wrong="Ivy"), "is not an id"),
    (lambda m: m.path_patch("L0.H1", "L9", patch="k"), "'L9' is not a head"),
    (lambda m: m.path_patch("L0.H1,L0.H2", "L1.H2", patch="k"), "is not an edge"),
])
def test_bad_api_inputs_are_typed_one_line_errors(call, message: str) -> None:
    with pytest.raises((InvalidRequestError, PromptError), match=message) as info:
        call(open_model(MODEL))
    assert "\n" not in str(info.value)


# -- 11: non-finite patched rows -----------------------------------------------------------------

def test_non_finite_rows_are_named_in_the_note_and_null() -> None:
    from headscope.engine.core.results import patch_result

    sets = [((0, 0),), ((0, 1),), ((1, 0),), ((1, 1),)]
    found = patch_result(method="exact", site="out", metric="logit_diff", noising=False, clean=2.0, corrupt=0.0,
                         sets=sets, values=[1.0, np.nan, np.inf, 0.5], n_layers=2, n_heads=2, tokens=3, batch=1)
    assert [r.patched for r in found.rows] == [1.0, None, None, 0.5]
    assert found.note == ("the metric after patching is not finite for L0.H1, L1.H0 (shown as null): the patched "
                          "run overflows or meets a NaN")
    assert np.isnan(found.table()[0, 1]) and found.table()[0, 0] == 0.5
    # attribution: a verified head whose exact patch is not finite is named; unverified ones are not
    found = patch_result(method="attribution", site="out", metric="logit_diff", noising=False, clean=2.0,
                         corrupt=0.0, sets=sets, values=[0.1, 0.9, 0.5, 0.2], exact=[np.nan, np.nan, 1.0, np.nan],
                         verified=2, n_layers=2, n_heads=2, tokens=3, batch=1)
    assert [r.exact for r in found.rows] == [None, None, 1.0, None]
    assert found.note == ("--verify's exact patch is not finite for L0.H1 (exact shown as null): the patched run "
                          "overflows or meets a NaN")
    # a path row is named as its edge; finite rows say nothing
    found = patch_result(method="path", site="k", metric="logit_diff", noising=False, clean=2.0, corrupt=0.0,
                         sets=[((0, 1), (1, 2))], values=[np.nan], n_layers=2, n_heads=3, tokens=3, batch=1)
    assert "not finite for L0.H1 → L1.H2" in found.note
    assert patch_result(method="exact", site="out", metric="logit_diff", noising=False, clean=2.0, corrupt=0.0,
                        sets=sets, values=[1.0, 0.0, 0.2, 0.5], n_layers=2, n_heads=2, tokens=3,
                        batch=1).note == ""


def test_a_non_finite_patched_run_is_said_by_the_cli(capsys, monkeypatch) -> None:
    """Through the command: the row is null in --json and the note names it on stderr."""
    import json

    from headscope.engine.forward import patching

    real = patching._evaluate

    def one_overflows(*args, **kwargs):
        found = list(real(*args, **kwargs))
        found[2] = float("inf")
        return found

    monkeypatch.setattr(patching, "_evaluate", one_overflows)
    code, out, err = run(capsys, "patch", MODEL, "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "mouse",
                         "--wrong", "Ivy", "--no-cache", "--json")
    assert code == 0
    report = json.loads(out)
    heads = {(row["layer"], row["head"]): row for row in report["heads"]}
    assert heads[(0, 2)]["patched"] is None and heads[(0, 2)]["recovered"] is None
    assert "not finite for L0.H2" in report["note"] and "not finite for L0.H2" in err
