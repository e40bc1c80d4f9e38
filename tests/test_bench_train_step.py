"""bench.train_step's accounting (windows, model FLOPs) and a whole run of it on a tiny model on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from bench.train_step import main, qwen25_vl_3b_config, step_flops, summary_rows, window_sizes  # noqa: E402


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
        "1 x 256, mlp default, checkpointing off, compile off: attention varlen / default tokens/s",
        "1 x 256, mlp default, checkpointing vision, compile off: attention varlen / default tokens/s"]
    goals = [r for r in data["summary"] if r["goal"]]
    assert {r["figure"].split(": ")[-1] for r in goals} == {"tokens/s", "model-FLOP utilisation"}


def test_a_tiny_run_times_compiled_blocks_beside_eager_ones(tmp_path: Path) -> None:
    out = tmp_path / "train_step.json"
    assert main(["--tiny", "--device", "cpu", "--batch", "1", "--seq", "256", "--image-size", "224x140", "--reply",
                 "16", "--steps", "1", "--warmup", "0", "--checkpointing", "vision", "--vision-attention", "varlen",
                 "--vision-mlp", "default", "--compile", "off", "vision", "--compile-backend", "eager",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(s["compile"], s["blocks_compiled"], s["error"]) for s in data["settings"]] == [("off", 0, None),
                                                                                            ("vision", 2, None)]
    assert all(s["tokens_per_s"] > 0 and s["first_step_s"] > 0 for s in data["settings"])
    assert [r["figure"] for r in data["summary"] if r["unit"] == "x"] == [
        "1 x 256, attention varlen, mlp default, checkpointing vision: compile vision / off tokens/s"]


def test_goals_are_marked_on_the_fastest_varlen_setting_of_each_batch() -> None:
    def setting(batch: int, mlp: str, ckpt: str, tokens: float, attention: str = "varlen") -> dict[str, Any]:
        return {"batch": batch, "vision_attention": attention, "vision_mlp": mlp, "checkpointing": ckpt,
                "compile": "all", "tokens_per_s": tokens, "mfu": tokens / 25_000, "peak_reserved_gib": 50.0}

    results = [setting(1, "default", "off", 8200), setting(1, "aligned", "off", 7800),
               setting(1, "aligned", "off", 9000, attention="default"), setting(1, "aligned", "vision", 7000),
               setting(4, "aligned", "vision", 12000), setting(4, "aligned", "off", 14000)]
    goals = {(r["figure"].split(": ")[0], r["figure"].split(": ")[-1]): r["met"]
             for r in summary_rows(results, 2048) if r["goal"]}
    assert goals == {
        ("1 x 2,048, attention varlen, mlp default, checkpointing off, compile all", "tokens/s"): True,
        ("1 x 2,048, attention varlen, mlp default, checkpointing off, compile all", "model-FLOP utilisation"): False,
        ("4 x 2,048, attention varlen, mlp aligned, checkpointing vision, compile all", "tokens/s"): True,
        ("4 x 2,048, attention varlen, mlp aligned, checkpointing vision, compile all", "model-FLOP utilisation"): True,
        ("4 x 2,048, attention varlen, mlp aligned, checkpointing vision, compile all", "peak memory reserved"): True,
        ("4 x 2,048, attention varlen, mlp aligned, checkpointing off, compile all", "tokens/s"): True,
        ("4 x 2,048, attention varlen, mlp aligned, checkpointing off, compile all", "model-FLOP utilisation"): True}
