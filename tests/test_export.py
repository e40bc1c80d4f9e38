"""Demonstrations from a real scripted run (train.demos) and the LLaMA-Factory export (train.export, train.cli).

The round trip: parsing a demonstration reply with the agent's own parser gives back the recorded action
(coordinates within 1 CSS px), in both reply formats and both coordinate frames.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine._imgcodec import QWEN2_VL
from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame, parse_action
from engine.agent.prompts import AgentConfig
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.store.run_dir import read_records
from engine.tasks.schema import BUNDLED_TASKS
from policy.registry import make_policy
from train.cli import export
from train.demos import demonstration_records
from train.export import export_sharegpt

TASKS = ["shop-024", "shop-009", "wiki-013"]  # 7 clicks and an answer; a type without clearing; three types


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory: pytest.TempPathFactory, sites: str) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("scripted-run")
    lines = [line for line in BUNDLED_TASKS.read_text().splitlines() if json.loads(line)["task_id"] in TASKS]
    tasks = tmp / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp / "runs"), concurrency=3, workers=1, telemetry=None)

    async def go() -> Path:
        _, run_dir = await run(cfg, make_policy("scripted"), sites)
        return Path(run_dir)

    run_dir = asyncio.run(go())
    assert all(r["status"] == "success" for r in read_records(run_dir))
    yield run_dir


def same_action(parsed: AgentAction, recorded: dict[str, Any]) -> bool:
    want = AgentAction.from_dict(recorded)
    if want.x is not None and (abs(parsed.x - want.x) > 1 or abs(parsed.y - want.y) > 1):  # type: ignore[operator]
        return False
    return (parsed.name, parsed.text, parsed.direction, parsed.url, parsed.keys, parsed.seconds) == (
        want.name, want.text, want.direction, want.url, want.keys, want.seconds)


@pytest.mark.parametrize(("response_format", "coords"), [("complete", "grid"), ("vanilla", "pixels")])
def test_demonstration_replies_parse_back_to_the_recorded_actions(scripted_run: Path, response_format: str,
                                                                   coords: str) -> None:
    cfg = AgentConfig(response_format=response_format, coords=coords)
    demos = demonstration_records(scripted_run, cfg)
    originals = {r["episode_id"]: r for r in read_records(scripted_run)}
    assert len(demos) == len(TASKS)
    frame = CoordFrame.grid(1280, 768) if coords == "grid" else CoordFrame.pixels(1280, 768, **QWEN2_VL)
    kinds = set()
    for demo in demos:
        assert demo["policy"] == "demo:scripted" and "<tools>" in demo["system_prompt"]
        original = originals[demo["episode_id"]]
        for step, orig in zip(demo["steps"], original["steps"], strict=True):
            assert step["action"] == orig["action"]
            action, info = parse_action(step["reply"], frame)
            assert info["error"] is None and same_action(action, orig["action"]), (step["reply"], orig["action"])
            if coords == "grid" and "coordinate" in info["call"]["arguments"]:
                x, y = info["call"]["arguments"]["coordinate"]
                assert (x, y) == (round(1000 * orig["action"]["x"] / 1280), round(1000 * orig["action"]["y"] / 768))
            assert ("Memory: []" in step["reply"]) == (response_format == "complete")
            kinds.add(action.name)
            clear_enter = orig["action"].get("clear", True) and orig["action"].get("enter", True)
            assert bool(step["demo_warnings"]) == (action.name == "type" and not clear_enter)
    assert kinds >= {"left_click", "type", "answer"}  # and scrolls where a target was below the fold


def test_demonstration_context_is_the_agent_protocol(scripted_run: Path) -> None:
    [demo] = [d for d in demonstration_records(scripted_run) if d["task"]["task_id"] == "shop-024"]
    steps = demo["steps"]
    n = len(steps) - 1  # the last step: window 4 means steps 0..n-5 as summary lines, n-4..n-1 as rounds
    assert n >= 6
    first = steps[0]["messages"]
    assert [m["role"] for m in first] == ["user"]
    task = demo["task"]
    assert first[0]["content"][0]["text"] == f"Task: {task['task_name']}\nInitial website: {task['website']}"
    last = steps[n]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant"] * 4 + ["user"]
    summary = last[0]["content"][0]["text"]
    assert "Previous actions:\nStep 0 on [" in summary and f"Step {n - 5} on [" in summary
    assert f"Step {n - 4} on" not in summary and "-> page changed" in summary
    assert "Click the element at the given point" in summary
    assert [m["content"] for m in last if m["role"] == "assistant"] == [s["reply"] for s in steps[n - 4:n]]
    images = [p["image"] for m in last if m["role"] == "user" for p in m["content"] if p["type"] == "image"]
    assert images == [s["screenshot"] for s in steps[n - 4:n + 1]]


def test_demonstrations_become_training_samples(scripted_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from policy.tiny_models import build_tiny_model
    from train.model_inputs import IGNORE_INDEX
    from train.samples import Processing, samples_from_records

    proc = Processing.load(build_tiny_model(tmp_path / "qwen3_vl", "qwen3_vl"))
    demos = demonstration_records(scripted_run)
    result = samples_from_records(proc, demos, scripted_run)
    assert len(result) == sum(len(d["steps"]) for d in demos) and not result.skipped
    by_key = {(d["episode_id"], s["step"]): s for d in demos for s in d["steps"]}
    for sample in result:
        reply = by_key[(sample.episode_id, sample.step)]["reply"]
        assert sample.target_source == "reply" and sample.target_ids[-1] == proc.end_token_id
        assert proc.tokenizer.decode(sample.target_ids[:-1]) == reply
        assert sample.labels.count(IGNORE_INDEX) == sample.prompt_len and sample.reward == 1.0


def test_export_sharegpt_of_a_scripted_run_and_the_command(scripted_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.json"
    result = export_sharegpt(scripted_run, out)
    data = json.loads(out.read_text())
    n_steps = sum(len(r["steps"]) for r in read_records(scripted_run))
    assert result["samples"] == len(data) == n_steps
    for sample in data:
        assert set(sample) == {"conversations", "system", "images"} and "<tools>" in sample["system"]
        roles = [c["from"] for c in sample["conversations"]]
        assert roles == ["human", "gpt"] * (len(roles) // 2)  # human at odd positions, gpt at even ones
        assert sum(c["value"].count("<image>") for c in sample["conversations"]) == len(sample["images"]) >= 1
        assert all(Path(p).is_file() for p in sample["images"])
        assert "<tool_call>" in sample["conversations"][-1]["value"]

    runner = CliRunner()
    res = runner.invoke(export, [str(scripted_run), "--format", "sharegpt", "-o", str(tmp_path / "cli.jsonl"),
                                 "--all", "--relative-to", str(scripted_run)])
    assert res.exit_code == 0, res.output
    assert f"wrote {n_steps} samples" in res.output and '"formatting": "sharegpt"' in res.output
    rows = [json.loads(line) for line in (tmp_path / "cli.jsonl").read_text().splitlines()]
    assert len(rows) == n_steps and all(p.startswith("frames/") for r in rows for p in r["images"])
    res = runner.invoke(export, [str(scripted_run)])  # the default output in the run directory
    assert res.exit_code == 0 and (scripted_run / "export-sharegpt.json").is_file()


def test_a_step_whose_image_lies_outside_the_run_directory_is_left_out(scripted_run: Path, tmp_path: Path) -> None:
    # A run directory may come from elsewhere: its records must not bring other files into a data set.
    run = tmp_path / "run"
    shutil.copytree(scripted_run, run, symlinks=True)
    records = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    records[0]["steps"][0]["screenshot"] = "/etc/hostname"
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = export_sharegpt(run, tmp_path / "sft.json")
    n_steps = sum(len(r["steps"]) for r in records)
    # The first step, and the next ones whose context window shows its screenshot.
    left_out = result["skipped"]["an image outside the run directory"]
    assert left_out >= 1 and result["samples"] == n_steps - left_out
    assert "/etc/hostname" not in (tmp_path / "sft.json").read_text()
