"""The engine on the bundled sites with a real (tiny, random) transformers Qwen-VL model, in both modes.

The tiny model's replies are random text, so most steps become recorded ``wait`` actions with a parse
error; what is tested is the plumbing: prompts built, screenshots preprocessed, one batched generate for
many rollouts, token ids and log-probabilities recorded, and every episode ending with one record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from browserpool.pool import BrowserPool
from engine.agent.model_api import SamplingParams  # noqa: E402
from engine.clients.runner import run  # noqa: E402
from engine.core.config import RunConfig  # noqa: E402
from engine.store.run_dir import read_records  # noqa: E402
from policy.registry import BackendConfig, make_policy  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from tests.conftest import subset  # noqa: E402


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "qwen3_vl", "qwen3_vl")


def check_model_records(run_dir: Path, n: int) -> list[dict]:
    records = read_records(run_dir)
    assert len(records) == n and [r for r in records if r["status"] == "error"] == []
    for r in records:
        assert r["steps"] and r["system_prompt"]
        for step in r["steps"]:
            assert step["reply"] is not None and step["messages"][-1]["role"] == "user"
            assert len(step["token_ids"]) == len(step["logprobs"]) >= 1
            assert all(lp <= 0 for lp in step["logprobs"])
            assert step["parse_error"] or step["parsed"]["tool_call"]
            assert step["parsed"]["prompt_tokens"] > 0
    return records


@pytest.mark.asyncio(loop_scope="session")
async def test_tiny_hf_model_in_coordinate_mode(
        tmp_path: Path, sites: str, tiny_qwen3: Path, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = 2  # two of the sites' tasks, at once: enough for shared generate calls; a random model wanders to its cap (4)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1, episodes=n,
                    step_caps=(4, 4, 4))
    policy = make_policy("hf", sampling=SamplingParams(max_tokens=12, seed=0),
                         backend=BackendConfig(model=str(tiny_qwen3), device="cpu", max_batch=n))
    model = policy.model  # type: ignore[attr-defined]
    # A first request waits up to 5 ms for company by default. On a loaded 2-core machine two rollouts fall into
    # turns (one generates while the other steps its browser) and never queue that close together; even 250 ms
    # was seen to miss every time. A batch goes as soon as it holds max_batch (= n) requests, so a long wait costs
    # nothing while both rollouts run and makes the batching this test is about certain.
    model.batch_wait_ms = 10_000.0
    stats, run_dir = await run(cfg, policy, sites, pool=pool)
    check_model_records(run_dir, n)
    assert stats.summary()["lost"] == 0
    assert model.requests_batched == stats.steps and max(model.batch_sizes) > 1  # rollouts shared generate calls


def test_tiny_hf_model_in_som_mode_from_the_command_line(tmp_path: Path, tiny_qwen3: Path) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = 2
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--tasks", str(tasks), "--episodes", str(n), "--policy", "hf",
         "--model", str(tiny_qwen3),
         "--device", "cpu", "--interaction", "som", "--max-tokens", "12", "--concurrency", "4", "--workers", "1",
         "--output", str(tmp_path / "runs"), "--context-window", "2", "--step-caps", "4,4,4"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    records = check_model_records(run_dir, n)
    for r in records:
        for step in r["steps"]:
            assert "Interactive elements on the screenshot:" in step["messages"][-1]["content"][-1]["text"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    agent = manifest["config"]["policy_info"]["agent"]
    assert agent == {**agent, "interaction": "som", "window": 2}
    assert manifest["config"]["policy_info"]["resize"]["factor"] == 32  # the tiny model's own processor
