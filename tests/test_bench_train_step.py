"""bench.train_step's accounting (windows, model FLOPs) and a whole run of it on a tiny model on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench.train_step import main, qwen25_vl_3b_config, step_flops, window_sizes  # noqa: E402


def test_windows_tile_the_merged_grid_with_smaller_tiles_at_the_edges() -> None:
    # 1008x616: 72x44 patches, 36x22 merged tokens, tiles of 4x4 merged tokens (112 px).
    sizes = window_sizes(44, 72, 2, 4)
    assert len(sizes) == 6 * 9 and sum(sizes) == 44 * 72
    assert sorted(set(sizes)) == [2 * 4 * 4, 4 * 4 * 4]  # the last row of tiles is 2 merged tokens high


def test_step_flops_count_the_language_model_per_token_and_the_tower_per_patch() -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(qwen25_vl_3b_config())
    one = step_flops(model, 1, 2048, 2, 616, 1008, 256)
    assert step_flops(model, 4, 2048, 2, 616, 1008, 256) == pytest.approx(4 * one)
    lm = sum(p.numel() for p in model.model.language_model.layers.parameters())
    tower = sum(p.numel() for p in model.model.visual.blocks.parameters())
    dense = 6 * (lm * 2048 + tower * 2 * 3168)
    # The merger, the label positions' vocabulary projection and the attention products add 5-15% here.
    assert 1.05 * dense < one < 1.15 * dense
    # Without screenshots' patches the tower costs nothing: fewer images, fewer FLOPs.
    assert step_flops(model, 1, 2048, 1, 616, 1008, 256) < one


def test_a_tiny_run_times_every_setting_and_stores_the_ratios(tmp_path: Path) -> None:
    out = tmp_path / "train_step.json"
    assert main(["--tiny", "--device", "cpu", "--batch", "1", "--seq", "256", "--image-size", "224x140", "--reply",
                 "16", "--steps", "1", "--warmup", "0", "--checkpointing", "off", "vision", "--vision-mlp", "default",
                 "--peak-tflops", "1",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    settings = {(s["vision_attention"], s["checkpointing"]): s for s in data["settings"]}
    assert set(settings) == {(v, c) for v in ("default", "varlen") for c in ("off", "vision")}
    assert settings["varlen", "off"]["implementation"] != settings["default", "off"]["implementation"]
    assert all(s["tokens_per_s"] > 0 and s["mfu"] > 0 for s in settings.values())
    ratios = [r for r in data["summary"] if r["unit"] == "x"]
    assert [r["figure"] for r in ratios] == [
        "1 x 256, mlp default, checkpointing off: attention varlen / default tokens/s",
        "1 x 256, mlp default, checkpointing vision: attention varlen / default tokens/s"]
    goals = [r for r in data["summary"] if r["goal"]]
    assert {r["figure"].split(": ")[-1] for r in goals} == {"tokens/s", "model-FLOP utilisation"}
