"""The command line and the results store: `cache ls|clear`, `--no-cache`, a broken store
that only warns; and the progress bars: on a terminal's stderr, never when piped or with
`--quiet`, never on stdout."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headscope.tui.cli.main import main
from tests.leftovers import from_this_test

REPO = Path(__file__).resolve().parents[3]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def count_spectral(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the batched spectral scores computed (the one sweep, ``circuits.spectral``)."""
    from headscope.engine.circuits import spectral

    calls: list[int] = []
    real = spectral._batched_spectral_score

    def spy(small: Any) -> Any:
        calls.append(1)
        return real(small)

    monkeypatch.setattr(spectral, "_batched_spectral_score", spy)
    return calls


def test_a_second_heads_run_is_served_from_the_store(capsys, gpt2_dir, monkeypatch) -> None:
    path = str(gpt2_dir[0])
    first = run(capsys, "heads", path, "--json")
    calls = count_spectral(monkeypatch)

    def no_null(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the random-head null was computed again")

    from headscope.engine.circuits import directions
    from headscope.engine.forward import null as null_module

    with monkeypatch.context() as patched:  # the null (the z's) is stored too
        patched.setattr(null_module, "behaviour_null", no_null)
        patched.setattr(directions, "null_spectral_scores", no_null)
        second = run(capsys, "heads", path, "--json")
    assert calls == []
    assert second == first and first[0] == 0
    assert "induction_score_z" in json.loads(first[1])[0]
    fresh = run(capsys, "heads", path, "--json", "--no-cache")
    assert len(calls) == 2 * 2  # --no-cache recomputes both spectral sweeps (2 layers each)
    assert fresh == first


def test_weight_only_heads_share_the_store_with_heads(capsys, gpt2_dir, monkeypatch) -> None:
    """`heads --no-behaviour` stores what it computes and reads it back (a second run
    computes nothing), and shares the parts with `heads`' spectral sweeps both ways."""
    from headscope.engine.circuits import spectral

    path = str(gpt2_dir[0])
    first = run_json(capsys, "heads", path, "--no-behaviour")

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("recomputed a stored layer")

    with monkeypatch.context() as m:
        m.setattr(spectral, "layer_spectral_scores", fail)
        m.setattr(spectral, "spectral_middles", fail)
        assert run_json(capsys, "heads", path, "--no-behaviour") == first
    with monkeypatch.context() as m:  # (the random-head null, not stored yet, forms the middles)
        m.setattr(spectral, "layer_spectral_scores", fail)
        calls = count_spectral(m)
        full = run_json(capsys, "heads", path)  # heads reads the same parts
        assert calls == []
    weights = {(r["layer"], r["head"]): r for r in first}
    for row in full:
        for key in ("copying_score", "qk_positivity", "nonfinite"):
            assert row[key] == weights[(row["layer"], row["head"])][key]


def test_progress_ends_at_one(gpt2_dir) -> None:
    """Every sweep's progress rises to exactly 1.0 once its result is ready (the CLI bars end
    at 100 %, not at the start of the last stage), stored or not."""
    from headscope.engine.api.report import composition_report, head_table, weight_table
    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps.diff import diff_models
    from headscope.engine.sweeps.store import ResultStore

    model = load_model(gpt2_dir[0])
    store = ResultStore()
    runs = {
        "heads": lambda p: head_table(model, progress=p, store=store),
        "heads --ablation": lambda p: head_table(model, ablation=True, progress=p),
        "heads --no-behaviour": lambda p: weight_table(model, progress=p, store=store),
        "composition": lambda p: composition_report(model, "k", progress=p, store=store),
        "diff": lambda p: diff_models(model, model, progress=p, store=store),
    }
    for name, sweep in [*runs.items(), *runs.items()]:  # computed, then from the store
        seen: list[float] = []
        sweep(seen.append)
        assert seen and seen[-1] == 1.0, name
        assert seen == sorted(seen), name


def test_one_fingerprint_per_model_and_command(gpt2_dir, monkeypatch) -> None:
    """``ResultStore.for_model`` reads a checkpoint's shard headers once per store (one
    command), however many sweeps ask for its entry."""
    from headscope.engine.model.loading import load_model
    from headscope.engine.sweeps import store as store_module
    from headscope.engine.sweeps.diff import diff_models

    calls: list[str] = []
    real = store_module.fingerprint
    count = from_this_test(calls.append)
    monkeypatch.setattr(store_module, "fingerprint", lambda ckpt, raw: count(ckpt.path) or real(ckpt, raw))
    a, b = load_model(gpt2_dir[0]), load_model(gpt2_dir[0])
    store = store_module.ResultStore()
    diff_models(a, b, store=store, behaviour=False)
    assert len(calls) == 2  # A and B: two tables and six composition sweeps between them
    assert store.for_model(a).key == store_module.ResultStore().for_model(a).key


def test_no_cache_writes_nothing(capsys, gpt2_dir, _results_store_in_tmp) -> None:
    run_json(capsys, "heads", str(gpt2_dir[0]), "--no-cache")
    run_json(capsys, "composition", str(gpt2_dir[0]), "--kind", "q", "--no-cache")
    assert list(_results_store_in_tmp.iterdir()) == []
    assert run_json(capsys, "cache", "ls")["entries"] == []


def test_an_unwritable_cache_dir_warns_once_and_answers(capsys, gpt2_dir, tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(blocker / "headscope"))
    code, out, err = run(capsys, "heads", str(gpt2_dir[0]), "--json", "--ablation")
    assert code == 0
    assert len(json.loads(out)) == 2 * 4
    lines = err.splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and str(blocker) in lines[0]
    expected = run(capsys, "heads", str(gpt2_dir[0]), "--json", "--ablation", "--no-cache")[1]
    assert out == expected


# -- progress bars ----------------------------------------------------------------------


def _run_with_tty_stderr(argv: list[str]) -> tuple[int, str, bytes]:
    """Run the CLI with stderr on a pseudo-terminal and stdout on a pipe."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "headscope.tui.cli.main", *argv], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait()
    os.close(master)
    return code, out, b"".join(chunks)


@pytest.mark.parametrize("argv", [
    ["heads", "{gpt2}", "--json", "--no-cache"],
    ["composition", "{gpt2}", "--kind", "v", "--json"],
    ["forward", "{gpt2}", "--tokens", "1,2,3", "--json"],
])
def test_progress_is_drawn_on_a_terminal_and_stdout_stays_json(gpt2_dir, argv) -> None:
    argv = [a.format(gpt2=gpt2_dir[0]) for a in argv]
    code, out, terminal = _run_with_tty_stderr(argv)
    assert code == 0, terminal
    json.loads(out)
    assert b"\x1b[" in terminal  # Rich drew (and erased) its bar there
    quiet_code, quiet_out, quiet_terminal = _run_with_tty_stderr([*argv, "--quiet"])
    assert quiet_code == 0 and json.loads(quiet_out) == json.loads(out)
    assert quiet_terminal == b""


def test_timeline_draws_the_progress_bar_with_an_eta() -> None:
    """`timeline --no-cache` printed nothing for seconds, then bare `scored step …` lines:
    it has the bar of the other sweeps (elapsed time, ETA), on stderr only."""
    steps = "sample_models/attn-only-2l-training/step-{:06d}"
    argv = ["timeline", steps.format(0), steps.format(3000), "--json", "--no-cache"]
    code, out, terminal = _run_with_tty_stderr(argv)
    assert code == 0, terminal
    assert json.loads(out)["steps"] == [0, 3000] and "\x1b" not in out
    drawn = terminal.decode()
    assert "timeline" in drawn and "ETA" in drawn and "%" in drawn
    quiet_code, quiet_out, quiet_terminal = _run_with_tty_stderr([*argv, "--quiet"])
    assert quiet_code == 0 and json.loads(quiet_out) == json.loads(out)
    assert quiet_terminal == b""


def test_composition_top_edges_fill_in_on_the_progress_bar(gpt2_dir) -> None:
    from headscope.engine.api.report import composition_report
    from headscope.engine.model.loading import load_model
    from headscope.tui.cli.commands.composition import best_edges_so_far

    model = load_model(gpt2_dir[0])
    notes: list[str] = []
    on_tile = best_edges_so_far(notes.append, model.cfg.d_model, model.cfg.d_head, 0)
    report = composition_report(model, "k", on_tile=on_tile)
    assert len(notes) == 1  # one layer pair
    assert notes[-1] == "best so far " + ", ".join(
        f"L{e['source'][0]}.H{e['source'][1]}→L{e['target'][0]}.H{e['target'][1]} {e['above_baseline']:+.3f}"
        for e in report["top_edges"][:2])


def test_no_progress_when_stderr_is_piped(gpt2_dir) -> None:
    done = subprocess.run([sys.executable, "-m", "headscope.tui.cli.main", "heads", str(gpt2_dir[0]),
                           "--json", "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
    json.loads(done.stdout)


def test_the_cache_disk_mb_setting(capsys, gpt2_dir, tmp_path, monkeypatch, _results_store_in_tmp) -> None:
    from headscope.engine.core.errors import ConfigError
    from headscope.tui.base.settings import load_settings

    config = tmp_path / "config.toml"
    config.write_text("cache_disk_mb = 64\n")
    env = {"HEADSCOPE_CONFIG": str(config)}
    assert load_settings(env).cache_disk_mb == 64
    assert load_settings({**env, "HEADSCOPE_CACHE_DISK_MB": "7"}).cache_disk_mb == 7
    with pytest.raises(ConfigError, match="cache_disk_mb"):
        load_settings({**env, "HEADSCOPE_CACHE_DISK_MB": "-1"})
    monkeypatch.setenv("HEADSCOPE_CONFIG", str(config))
    assert run_json(capsys, "cache", "ls")["max_bytes"] == 64 << 20
    monkeypatch.setenv("HEADSCOPE_CACHE_DISK_MB", "0")  # 0: the store is off
    run_json(capsys, "heads", str(gpt2_dir[0]))
    assert list(_results_store_in_tmp.iterdir()) == []


def test_terminal_tables_show_data_as_text(monkeypatch, capsys) -> None:
    """A token or path such as ``[/INST]`` is a cell's text, not Rich markup (which raised)."""
    from headscope.tui.cli import output as cli

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    cli.emit([], False, lambda: (["model", "[b]size[/b]"], [["[/INST]", "[red]x"]]))
    out = capsys.readouterr().out
    assert "[/INST]" in out and "[red]x" in out and "[b]size[/b]" in out


def test_a_checkpoint_folder_whose_name_is_not_utf8_runs_every_store_command(tmp_path: Path) -> None:
    """``mod\\xe8le/``: `heads`, `composition` and `cache ls` were UnicodeEncodeError tracebacks
    (the store's fingerprint encoded the path as UTF-8); an error naming it is one line."""
    import shutil

    from tests.conftest import SAMPLE_MODELS

    folder = os.fsdecode(os.fsencode(tmp_path) + b"/mod\xe8le")
    shutil.copytree(SAMPLE_MODELS / "attn-only-2l", folder)
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    cli = str(Path(sys.executable).parent / "headscope")
    for argv in (["heads", folder], ["composition", folder, "--kind", "k"], ["cache", "ls"],
                 ["cache", "ls", "--json"]):
        done = subprocess.run([cli, *argv], env=env, capture_output=True, timeout=300)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, (argv, done.stderr[-1500:])
    done = subprocess.run([cli, "circuit", folder, "9", "0", "--kind", "ov"], env=env, capture_output=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count(b"\n") == 1 and b"layer 9" in done.stderr, done.stderr
