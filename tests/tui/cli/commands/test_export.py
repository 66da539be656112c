"""`headscope export`: CSV and JSON round trips equal the engine's numbers; never written next to the checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from headscope.engine.forward import behaviour
from headscope.engine.model.loading import load_model
from headscope.tui.cli.main import main
from tests import weight_algebra as algebra
from tests.engine.core.test_export import export


def test_heads_csv_round_trip(tmp_path, gpt2_dir, capsys) -> None:
    path, _ = gpt2_dir
    written = export(tmp_path, path, "--what", "heads", "--format", "csv")
    assert capsys.readouterr().out.strip() == str(written)
    rows = list(csv.DictReader(written.open()))
    w = load_model(path).weights
    copying = algebra.all_copying_scores(w)
    assert len(rows) == w.cfg.n_layers * w.cfg.n_heads
    for r in rows:
        assert float(r["copying_score"]) == pytest.approx(float(copying[int(r["layer"]), int(r["head"])]), abs=1e-6)


def test_heads_csv_with_the_ablation_column(tmp_path, gpt2_dir) -> None:
    path, _ = gpt2_dir
    written = export(tmp_path, path, "--what", "heads", "--format", "csv", "--ablation")
    rows = list(csv.DictReader(written.open()))
    effects = behaviour.ablation_effects(load_model(path).weights, seed=0)
    for r in rows:
        expected = float(effects[int(r["layer"]), int(r["head"])])
        assert float(r["ablation_effect"]) == pytest.approx(expected, abs=1e-5)
    (tmp_path / "x").mkdir()
    assert main(["export", str(path), "--what", "composition", "--kind", "k", "--ablation",
                 "--out", str(tmp_path / "x")]) == 1
    assert list((tmp_path / "x").iterdir()) == []


def test_composition_json_and_csv_agree(tmp_path, gpt2_dir) -> None:
    path, _ = gpt2_dir
    js = json.loads(export(tmp_path / "j", path, "--what", "composition", "--kind", "v").read_text())
    expected = algebra.composition_scores(load_model(path).weights, "v", seed=0)
    assert js["baseline"] == pytest.approx(float(expected.baseline))
    rows = list(csv.DictReader(export(tmp_path / "c", path, "--what", "composition", "--kind", "v",
                                      "--format", "csv").open()))
    for r in rows:
        l1, h1, l2, h2 = (int(r[k]) for k in ("source_layer", "source_head", "target_layer", "target_head"))
        assert l1 < l2
        assert float(r["score"]) == pytest.approx(js["scores"][l1][h1][l2][h2], abs=1e-6)


def test_circuit_csv_cells(tmp_path, gpt2_dir) -> None:
    path, _ = gpt2_dir
    written = export(tmp_path, path, "--what", "circuit", "--kind", "ov", "--layer", "1", "--head", "0",
                     "--rows", "1,2", "--cols", "3,4,5", "--format", "csv")
    rows = list(csv.DictReader(written.open()))
    from headscope.engine.circuits.head_circuits import full_ov

    block = full_ov(load_model(path).weights, 1, 0).block([1, 2], [3, 4, 5])
    assert len(rows) == 6
    for r in rows:
        i, j = [1, 2].index(int(r["row_id"])), [3, 4, 5].index(int(r["col_id"]))
        assert float(r["value"]) == pytest.approx(float(block[i, j]), rel=1e-5, abs=1e-6)


def test_export_never_writes_next_to_the_checkpoint_by_default(tmp_path, gpt2_dir, monkeypatch) -> None:
    path, _ = gpt2_dir
    before = sorted(p.name for p in Path(path).iterdir())
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(path), "--what", "heads"]) == 0
    assert sorted(p.name for p in Path(path).iterdir()) == before
    assert any(p.suffix == ".json" for p in tmp_path.iterdir())
