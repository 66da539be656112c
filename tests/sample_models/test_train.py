"""The training script keeps working: a tiny configuration for a handful of steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from headscope.engine.core.config import ModelConfig
from headscope.engine.model.adapters.native import build_config, parse_config_json
from headscope.sample_models import corpus, train


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def test_tiny_training_writes_a_native_model(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    metrics = train.train("tiny", seed=0, out=out, quiet=True)
    shape = train.PRESETS["tiny"].shape
    assert {"model.safetensors", "headscope.json", "vocab.txt", "metrics.json",
            "training_log.json", "README.md"} <= {p.name for p in out.iterdir()}
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
    from headscope.engine.core.export import file_mode

    assert (out / "model.safetensors").stat().st_mode & 0o777 == file_mode()  # not 0o600

    # Canonical TransformerLens names and shapes (docs/internals.md).
    t = _tensors(out / "model.safetensors")
    H, D, dh, V = shape.n_heads, shape.d_model, shape.d_head, shape.d_vocab
    assert t["embed.W_E"].shape == (V, D)
    assert t["pos_embed.W_pos"].shape == (shape.n_ctx, D)
    assert t["unembed.W_U"].shape == (D, V) and t["unembed.b_U"].shape == (V,)
    for layer in range(shape.n_layers):
        a = f"blocks.{layer}.attn."
        for name in ("W_Q", "W_K", "W_V"):
            assert t[a + name].shape == (H, D, dh)
        assert t[a + "W_O"].shape == (H, dh, D) and t[a + "b_O"].shape == (D,)
    assert not any("ln" in k or "mlp" in k for k in t), "attention-only, no LayerNorm"

    # The config, identical in the safetensors metadata and in headscope.json, parses
    # into a ModelConfig through the native adapter.
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        meta = f.metadata()["headscope_config"]
    assert json.loads(meta) == json.loads((out / "headscope.json").read_text())
    cfg = build_config(parse_config_json(meta, str(out)), str(out))
    assert isinstance(cfg, ModelConfig)
    assert (cfg.family, cfg.architecture, cfg.normalization, cfg.d_mlp, cfg.positional) == (
        "native", "headscope-attn-only", None, None, "learned")
    assert (cfg.n_layers, cfg.n_heads, cfg.d_vocab) == (shape.n_layers, H, V)
    assert (out / "vocab.txt").read_text().splitlines() == corpus.VOCAB


def test_same_seed_reproduces_the_weights_bit_for_bit(tmp_path: Path) -> None:
    m1 = train.train("tiny", seed=5, out=tmp_path / "a", quiet=True)
    m2 = train.train("tiny", seed=5, out=tmp_path / "b", quiet=True)
    m3 = train.train("tiny", seed=6, out=tmp_path / "c", quiet=True)
    a, b, c = (_tensors(tmp_path / d / "model.safetensors") for d in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert m1["eval_loss"] == m2["eval_loss"]
    assert not torch.equal(a["embed.W_E"], c["embed.W_E"]) and m3["eval_loss"] != m1["eval_loss"]


def test_cli_writes_a_hugging_face_gpt2_directory(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    out = tmp_path / "g"
    assert train.main(["--model", "tiny-gpt2", "--steps", "3", "--out", str(out), "--quiet"]) == 0
    assert torch.get_num_threads() == threads, "the CLI restores torch's thread count"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert {"model.safetensors", "tokenizer.json", "README.md"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "training_log.json").read_text())[-1]["step"] == 3


def test_engine_opens_the_tiny_model(tmp_path: Path) -> None:
    loading = pytest.importorskip("headscope.engine.model.loading")
    out = tmp_path / "tiny"
    train.train("tiny", seed=0, out=out, quiet=True)
    model = loading.load_model(out)
    assert model.cfg.n_layers == train.PRESETS["tiny"].shape.n_layers
    assert model.tokenizer.encode("When Mary") == corpus.encode("When Mary")


def test_save_steps_write_float16_checkpoints_without_changing_the_run(tmp_path: Path) -> None:
    series = tmp_path / "series"
    save = train.SaveSpec((0, 2, 5), series)
    with_saves = train.train("tiny", seed=3, out=tmp_path / "a", quiet=True, save=save)
    plain = train.train("tiny", seed=3, out=tmp_path / "b", quiet=True)
    a, b = (_tensors(tmp_path / d / "model.safetensors") for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a), "saving changed the final weights"
    assert with_saves["eval_loss"] == plain["eval_loss"]
    assert sorted(p.name for p in series.iterdir()) == [
        "README.md", "step-000000", "step-000002", "step-000005"]
    last = _tensors(series / "step-000005" / "model.safetensors")
    assert all(last[k].dtype == torch.float16 and torch.equal(last[k], a[k].half()) for k in a)
    init = train.build(train.PRESETS["tiny"], 3).canonical_tensors()
    first = _tensors(series / "step-000000" / "model.safetensors")
    assert all(torch.equal(first[k], init[k].half()) for k in init)
    middle = _tensors(series / "step-000002" / "model.safetensors")
    assert not torch.equal(middle["embed.W_E"], first["embed.W_E"])
    assert not torch.equal(middle["embed.W_E"], last["embed.W_E"])
    assert json.loads((series / "step-000002" / "headscope.json").read_text())["dtype"] == "float16"
    assert "--save-steps 0,2,5" in (series / "README.md").read_text()
    loading = pytest.importorskip("headscope.engine.model.loading")
    assert loading.load_model(series / "step-000002").raw_cfg.dtype == "float16"


def test_save_steps_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train.parse_save_steps("500, 0,200,200", 1000) == (0, 200, 500)
    with pytest.raises(ValueError, match=r"outside 0\.\.1000"):
        train.parse_save_steps("0,1200", 1000)
    with pytest.raises(ValueError, match="not a comma-separated list"):
        train.parse_save_steps("0,abc", 1000)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--model", "tiny", "--out", str(tmp_path / "t"), "--save-steps", "9"])
    assert exit_info.value.code == 2 and "outside 0..5" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a native-layout preset"):
        train.train("tiny-gpt2", out=tmp_path / "g", quiet=True,
                    save=train.SaveSpec((1,), tmp_path / "s"))
