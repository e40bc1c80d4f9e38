"""The AReaL adapter inside AReaL's own workflow machinery: ``OpenAIProxyWorkflow`` in inline and subproc mode.

Runs in the AReaL environment that ``make test`` builds (``.venv-areal``: AReaL at the version ``pyproject.toml``'s
``areal`` extra pins, installed without its declared dependencies, which pin ``torch<2.11``; what its workflow and
proxy import is in ``tests/frameworks/areal.txt``); never in the project's main environment. What of AReaL runs:

- ``OpenAIProxyWorkflow.arun_episode``: the capacity grant, the proxy session with its own API key, the call into
  the adapter's ``run`` (inline: with ``base_url``, ``api_key`` and AReaL's ``http_client``; subproc: pickled into
  AReaL's process pool with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` set), the reward hook (``set_last_reward``),
  AReaL's turn discount and its export of one sample per completion (``export_style="individual"``);
- AReaL's OpenAI-compatible proxy server (``proxy_rollout_server``, FastAPI under uvicorn, here on a thread), whose
  ``ArealOpenAI`` client validates each chat completion request, renders the chat with the tokenizer's template and
  records the tokens and log-probabilities of every completion.

Stand-in, named as such: :class:`ScriptedInferenceEngine` for the inference server behind the proxy (AReaL's SGLang
and vLLM engines need a GPU); it implements AReaL's ``InferenceEngine`` interface and answers from a script. The
tokenizer is the tiny Qwen-VL's, built offline.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm (imported by the proxy) stays offline

import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import areal  # noqa: E402
import pytest  # noqa: E402
import uvicorn  # noqa: E402
from areal.api import InferenceEngine, ModelRequest, ModelResponse  # noqa: E402
from areal.api.cli_args import AgentConfig, InferenceEngineConfig  # noqa: E402
from areal.experimental.openai.proxy import proxy_rollout_server as proxy_server  # noqa: E402
from areal.experimental.openai.proxy import workflow as proxy_workflow  # noqa: E402
from areal.infra import workflow_context  # noqa: E402
from areal.infra.workflow_context import WorkflowContext  # noqa: E402
from areal.utils import stats_tracker  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from engine.store.run_dir import read_records  # noqa: E402
from engine.tasks.schema import BUNDLED_TASKS  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from train.adapters import close_shared_cores  # noqa: E402
from train.adapters.areal import AREAL, WebAgentWorkflow  # noqa: E402

ADMIN_KEY = "webgym-test-admin"
TASK_ID = "shop-001"  # "What promo code does the home page advertise?": answered SPRING10, reward 1
SCRIPT = [
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "scroll", "direction": "down"}}\n</tool_call>',
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "answer", "text": "SPRING10"}}\n</tool_call>',
]
DISCOUNT = 0.5


class ScriptedInferenceEngine(InferenceEngine):
    """A stand-in for AReaL's inference engine (module docstring): each reply is the next of the script, tokenised,
    with log-probabilities -0.5, -0.51, ... and the engine's weight version on every token."""

    def __init__(self, config: InferenceEngineConfig, script: list[str], version: int = 3) -> None:
        self.config, self.script, self.version = config, script, version
        self.requests: list[ModelRequest] = []
        self.responses: list[ModelResponse] = []

    @property
    def initialized(self) -> bool:
        return True

    def get_version(self) -> int:
        return self.version

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        tok = req.tokenizer
        out = tok.encode(self.script[len(self.requests) % len(self.script)], add_special_tokens=False)
        out.append(tok.eos_token_id)
        resp = ModelResponse(input_tokens=list(req.input_ids), output_tokens=out,
                             output_logprobs=[-0.5 - 0.01 * i for i in range(len(out))],
                             output_versions=[self.version] * len(out), stop_reason="stop", tokenizer=tok)
        self.requests.append(req)
        self.responses.append(resp)
        return resp


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("areal_model"), "qwen3_vl", seed=0)


@pytest.fixture
def proxy(tokenizer_dir: Path) -> Iterator[tuple[str, ScriptedInferenceEngine]]:
    """AReaL's proxy server on a thread, wired to the scripted engine by AReaL's own setup."""
    config = InferenceEngineConfig(tokenizer_path=str(tokenizer_dir), agent=AgentConfig(
        agent_cls_path="train.adapters.areal.WebAgentWorkflow", admin_api_key=ADMIN_KEY, chat_template_type="hf"))
    engine = ScriptedInferenceEngine(config, SCRIPT)
    for table in (proxy_server._session_cache, proxy_server._api_key_to_session, proxy_server._session_to_api_key):
        table.clear()
    proxy_server._capacity = 0
    proxy_server._server_host = "127.0.0.1"  # AReaL refuses an admin key on a host others can reach otherwise
    proxy_server._engine = engine
    proxy_server._setup_openai_client()
    server = uvicorn.Server(uvicorn.Config(proxy_server.app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="areal-proxy")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "AReaL's proxy did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", engine
    server.should_exit = True
    thread.join(10)
    proxy_server._engine = proxy_server._openai_client = None


@pytest.fixture
def workflow_agent(tmp_path: Path) -> Iterator[WebAgentWorkflow]:
    """The adapter as a user configures it for AReaL (task file and engine settings: it pickles)."""
    yield WebAgentWorkflow(task_file=BUNDLED_TASKS, model="policy", sampling={"temperature": 1.0},
                           run_config={"output_dir": str(tmp_path / "runs"), "concurrency": 2, "workers": 1,
                                       "telemetry": None})
    close_shared_cores()


async def run_in_areal(workflow: Any, task_id: int) -> dict[str, Any]:
    """One episode as AReaL's workflow executor runs it: the task's context, then ``arun_episode``."""
    workflow_context.set(WorkflowContext(is_eval=False, task_id=task_id))
    return await workflow.arun_episode(None, {"task_id": TASK_ID})


def check_samples(interactions: dict[str, Any], engine: ScriptedInferenceEngine, tokenizer_dir: Path) -> None:
    """One sample per completion, AReaL's discount on the episode's reward, the tokens the engine produced."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids = list(interactions)
    assert len(ids) == len(SCRIPT) == len(engine.responses)
    for k, cid in enumerate(ids):
        sample, resp = interactions[cid], engine.responses[k]
        assert cid.startswith("chatcmpl-")
        assert sample.reward == pytest.approx(1.0 * DISCOUNT ** (len(ids) - 1 - k))  # AReaL's turn discount
        td = sample.to_tensor_dict()
        prompt, output = resp.input_tokens, resp.output_tokens
        assert td["input_ids"][0].tolist() == prompt + output
        assert td["loss_mask"][0].tolist() == [0] * len(prompt) + [1] * len(output)
        assert td["logprobs"][0, len(prompt):].tolist() == pytest.approx(resp.output_logprobs)
        assert td["versions"][0].tolist() == [-1] * len(prompt) + [engine.version] * len(output)
        # The step's screenshots reached AReaL's prompt: one image per step so far (the context window holds both).
        assert prompt.count(pad) == k + 1
    # AReaL's proxy rendered the chat from the engine's messages: the task is in the prompt.
    assert "promo code" in tok.decode(engine.responses[0].input_tokens)


def test_the_tested_version_is_installed() -> None:
    assert areal.__version__ == AREAL.tested == AREAL.check()


async def test_inline_mode_sends_through_areals_client_with_its_discount(proxy: tuple[str, ScriptedInferenceEngine],
                                                            workflow_agent: WebAgentWorkflow,
                                                            tokenizer_dir: Path) -> None:
    address, engine = proxy
    client = await workflow_context.get_httpx_client()  # the client AReaL hands the agent in inline mode
    sent: list[str] = []

    async def record(request: Any) -> None:
        sent.append(request.url.path)

    client.event_hooks["request"].append(record)
    try:
        workflow = proxy_workflow.OpenAIProxyWorkflow(mode="inline", agent=workflow_agent, proxy_addr=address,
                                                      admin_api_key=ADMIN_KEY, discount=DISCOUNT)
        interactions = await run_in_areal(workflow, task_id=1)
    finally:
        client.event_hooks["request"].remove(record)
    assert sent == ["/chat/completions"] * len(SCRIPT)  # every completion through AReaL's own client
    check_samples(interactions, engine, tokenizer_dir)
    episode = workflow_agent.last_episode
    assert episode is not None and episode.reward == 1.0
    [record_] = read_records(workflow_agent._engine()[0].run_dir)
    assert record_["status"] == "success" and [s["action"]["name"] for s in record_["steps"]] == ["scroll", "answer"]
    assert stats_tracker.get("rollout").export()["rollout/reward"] == pytest.approx(1.0)  # AReaL's statistics


async def test_subproc_mode_runs_the_pickled_workflow_in_areals_pool(proxy: tuple[str, ScriptedInferenceEngine],
                                                                      workflow_agent: WebAgentWorkflow,
                                                                      tokenizer_dir: Path) -> None:
    address, engine = proxy
    workflow = proxy_workflow.OpenAIProxyWorkflow(mode="subproc", agent=workflow_agent, proxy_addr=address,
                                                  admin_api_key=ADMIN_KEY, discount=DISCOUNT,
                                                  subproc_max_workers=1)
    try:
        interactions = await run_in_areal(workflow, task_id=2)
    finally:
        proxy_workflow._shutdown_executor()
    check_samples(interactions, engine, tokenizer_dir)
    assert workflow_agent.last_episode is None  # the episode ran in AReaL's worker process, not here
