"""The AReaL agent workflow (``train.adapters.areal``) runs web episodes through an OpenAI-compatible endpoint, in the
project's own environment, where AReaL is not installed (AReaL 1.0.4 pins ``torch<2.11``).

``tests/frameworks/test_areal.py`` runs the workflow inside AReaL's own machinery in AReaL's environment (``make
test`` builds it): its ``OpenAIProxyWorkflow`` in inline and subproc mode, its proxy, reward hook and discount. Here
the workflow's ``run`` is called as AReaL calls it (``base_url`` and ``api_key`` as keyword arguments in inline mode,
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` in subproc mode), and what it sends is checked request by request.

Real parts: the endpoint is the repository's OpenAI-compatible chat test server (:class:`ChatTestServer`, real HTTP,
data-URL images decoded back to JPEG bytes) around :class:`ScriptedTestModel`, a test-only stand-in for a model that
replies from a script; the engine core with its site server and Chromium workers.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.agent.model_api import ChatRequest, Generation, LanguageModel, image_refs
from engine.clients.gym_env import CoreThread
from engine.core.config import RunConfig
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.tasks.schema import Task
from tests.chat_test_server import ChatTestServer
from tests.conftest import subset
from train.adapters.areal import WebAgentWorkflow, dataset_rows

SCRIPT = [
    "Action: click it\n<tool_call>\n{broken",  # unusable: the engine records a wait and its parse error
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "scroll", "direction": "down"}}\n</tool_call>',
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "answer", "text": "done"}}\n</tool_call>',
]


class ScriptedTestModel(LanguageModel):
    """A test-only stand-in for a model: replies with the next line of its script; keeps the requests."""

    name = "scripted-test"

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.requests: list[ChatRequest] = []

    async def generate(self, request: ChatRequest) -> Generation:
        self.requests.append(request)
        text = self.script[(len(self.requests) - 1) % len(self.script)]
        return Generation(text=text, token_ids=[ord(c) for c in text], logprobs=[-0.1] * len(text),
                          finish_reason="stop")


@pytest.fixture
def core(tmp_path: Path) -> Iterator[CoreThread]:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    with CoreThread(cfg, serve_sites=True) as core:
        yield core


def first_task(tmp_path: Path, core: CoreThread) -> Task:
    return load_tasks(subset(tmp_path, per_site=1), core.base_url)[0]


async def test_workflow_runs_an_episode_through_the_endpoint(core: CoreThread, tmp_path: Path) -> None:
    task = first_task(tmp_path, core)
    model = ScriptedTestModel(SCRIPT)
    workflow = WebAgentWorkflow(core=core, tasks=[task], sampling={"temperature": 0.7, "max_tokens": 64})
    async with ChatTestServer(model, served_model_name="default") as proxy:
        reward = await workflow.run(dataset_rows([task])[0], base_url=proxy.base_url, api_key="session-1")
        completions = [r.payload for r in proxy.received]
        assert {r.headers["Authorization"] for r in proxy.received} == {"Bearer session-1"}

    [record] = read_records(core.run_dir)  # type: ignore[arg-type]
    episode = workflow.last_episode
    assert episode is not None and episode.episode_id == record["episode_id"]
    assert [s["action"]["name"] for s in record["steps"]] == ["wait", "scroll", "answer"]
    assert [s["reply"] for s in record["steps"]] == SCRIPT and record["steps"][0]["parse_error"]
    # One completion per step, with the session's key; the episode's reward returned for AReaL's reward hook.
    assert reward == float(record["reward"]["value"]) and len(completions) == len(SCRIPT)
    frames = [Path(core.run_dir, s["screenshot"]).read_bytes() for s in record["steps"]]  # type: ignore[arg-type]
    for i, (payload, request) in enumerate(zip(completions, model.requests, strict=True)):
        assert payload["model"] == "default" and payload["temperature"] == 0.7 and payload["max_tokens"] == 64
        # The step's chat, as `run` builds it: the system prompt, the task, the context window's screenshots
        # (all of them here), as data URLs whose bytes are the frames the episode recorded.
        assert payload["messages"][0]["role"] == "system" and task.task_name in str(payload["messages"][1])
        urls = [p["image_url"]["url"] for m in payload["messages"] if isinstance(m["content"], list)
                for p in m["content"] if p.get("type") == "image_url"]
        assert len(urls) == i + 1 and all(u.startswith("data:image/jpeg;base64,") for u in urls)
        assert [request.images[ref] for ref in image_refs(request.messages)] == frames[: i + 1]
        assert [m["content"] for m in payload["messages"] if m["role"] == "assistant"] == SCRIPT[:i]


async def test_workflow_reads_the_endpoint_from_the_environment(core: CoreThread, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """AReaL's subproc mode: no keyword arguments, the endpoint in OPENAI_BASE_URL / OPENAI_API_KEY."""
    task = first_task(tmp_path, core)
    workflow = WebAgentWorkflow(core=core, tasks=[task])
    with pytest.raises(KeyError, match="task"):
        await workflow.run({"messages": []}, base_url="http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="endpoint"):
        await workflow.run({"task_id": task.task_id})
    async with ChatTestServer(ScriptedTestModel(SCRIPT[2:]), served_model_name="default") as proxy:
        monkeypatch.setenv("OPENAI_BASE_URL", proxy.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "session-env")
        reward = await workflow.run({"task_id": task.task_id})
    assert isinstance(reward, float) and [r.headers["Authorization"] for r in proxy.received] == ["Bearer session-env"]
    assert workflow.last_episode is not None and len(workflow.last_episode.steps) == 1
    # A workflow configured by task file and run config pickles into AReaL's worker processes; one holding a
    # core does not.
    configured = WebAgentWorkflow(task_file="tasks.jsonl", run_config={"concurrency": 8}, agent={"window": 2})
    copy = pickle.loads(pickle.dumps(configured))
    assert (copy.task_file, copy.run_config, copy.agent.window) == ("tasks.jsonl", {"concurrency": 8}, 2)
    with pytest.raises(TypeError, match="inline"):
        pickle.dumps(workflow)
