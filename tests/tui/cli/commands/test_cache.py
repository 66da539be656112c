"""`headscope cache ls|clear`: what the results store holds, and clearing it."""

from __future__ import annotations

from pathlib import Path

from tests.tui.cli.test_store import run, run_json


def test_cache_ls_and_clear(capsys, gpt2_dir, llama_dir, _results_store_in_tmp) -> None:
    gpt2, llama = str(gpt2_dir[0]), str(llama_dir[0])
    run_json(capsys, "heads", gpt2)
    run_json(capsys, "composition", gpt2, "--kind", "k")
    run_json(capsys, "heads", llama, "--raw")
    listing = run_json(capsys, "cache", "ls")
    assert listing["root"] == str(_results_store_in_tmp)
    by_path = {(e["path"], e["raw"]): e for e in listing["entries"]}
    assert set(by_path) == {(str(Path(gpt2).resolve()), False), (str(Path(llama).resolve()), True)}
    stored = by_path[(str(Path(gpt2).resolve()), False)]["stored"]
    assert stored["copying_score"] == 2 and stored["composition-k"] == 1  # 2 layers; 1 tile
    assert all(e["bytes"] > 0 for e in listing["entries"])
    only = run_json(capsys, "cache", "ls", gpt2)["entries"]
    assert [e["path"] for e in only] == [str(Path(gpt2).resolve())]
    code, table, _ = run(capsys, "cache", "ls")  # TSV when piped
    assert code == 0 and table.splitlines()[0].split("\t")[:3] == ["model", "mode", "size"]

    removed = run_json(capsys, "cache", "clear", gpt2)["removed"]
    assert [e["path"] for e in removed] == [str(Path(gpt2).resolve())]
    assert [e["path"] for e in run_json(capsys, "cache", "ls")["entries"]] == [str(Path(llama).resolve())]
    run_json(capsys, "cache", "clear")
    assert run_json(capsys, "cache", "ls")["entries"] == []
    assert [p for p in _results_store_in_tmp.iterdir()] == []
