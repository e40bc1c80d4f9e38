"""The agent protocol inside the engine: model policies on the bundled sites, coordinate and SoM modes.

The ``simulated`` backend (a latency model that replies with random valid actions, a benchmark
stand-in) drives the full path here: prompt, context window, parsing, recording. The tiny real
transformers model drives the same path in ``test_hf_engine.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from browserpool.pool import BrowserPool
from engine._imgcodec import decode
from engine.agent.model_api import image_refs
from engine.agent.prompts import AgentConfig
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.store.run_dir import read_records
from policy.registry import BackendConfig, make_policy
from tests.conftest import subset

pytestmark = pytest.mark.asyncio(loop_scope="session")


def check_records(run_dir: Path, n: int, som: bool) -> list[dict]:
    """Every episode ended with exactly one record, none with an engine error, prompts recorded."""
    records = read_records(run_dir)
    assert len(records) == n and len({r["episode_id"] for r in records}) == n
    assert [r for r in records if r["status"] == "error"] == []
    for r in records:
        assert r["system_prompt"].count("<tools>\n{") == 1
        for step in r["steps"]:
            messages = step["messages"]
            assert messages[-1]["role"] == "user" and messages[0]["role"] == "user"
            refs = image_refs(messages)
            assert 1 <= len(refs) <= 5 and refs[-1] == step["screenshot"]
            assert all((run_dir / ref).is_file() for ref in refs)
            listing = [p["text"] for p in messages[-1]["content"] if p["type"] == "text"]
            assert som == any(t.startswith("Interactive elements") for t in listing)
            assert step["parsed"]["tool_call"] is not None or step["parse_error"]
    return records


async def test_simulated_policy_in_coordinate_mode(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=2)
    n = len(tasks.read_text().splitlines())
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1,
                    )
    stats, run_dir = await run(cfg, make_policy("simulated", backend=BackendConfig(sim_speed=50)), sites, pool=pool)
    records = check_records(run_dir, n, som=False)
    assert stats.summary()["lost"] == 0
    frames = [s["parsed"]["frames"] for r in records for s in r["steps"] if s["parsed"]["frames"]]
    assert frames and all(f["mode"] == "grid" for f in frames)
    for f in frames:  # 1280x768 viewport, 0..1000 grid
        x, y = f["model"]
        assert f["css_px"] == [min(round(1280 * x / 1000), 1279), min(round(768 * y / 1000), 767)]
    long = max(records, key=lambda r: len(r["steps"]))
    if len(long["steps"]) > 5:  # summaries appear once the window is full
        first = long["steps"][5]["messages"][0]["content"][0]["text"]
        assert "Previous actions:\nStep 0 on [" in first
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["policy_info"]["agent"]["interaction"] == "coordinates"


async def test_simulated_policy_in_som_mode(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())
    agent = AgentConfig(interaction="som")
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1,
                    )
    _, run_dir = await run(cfg, make_policy("simulated", agent=agent, backend=BackendConfig(sim_speed=50)), sites,
                           pool=pool)
    records = check_records(run_dir, n, som=True)
    by_element = [s for r in records for s in r["steps"] if s["action"].get("element_id") is not None]
    assert by_element, "the simulated model picks element ids in SoM mode"
    for step in by_element:
        assert step["parsed"]["frames"]["mode"] == "som"
        assert step["point"] is not None  # the worker reports where the action landed
    # The stored screenshot is the one the model saw: with the marks drawn.
    shot = decode((run_dir / records[0]["steps"][0]["screenshot"]).read_bytes())
    assert shot.shape == (768, 1280, 3)
