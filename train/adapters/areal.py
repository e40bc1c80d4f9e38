"""AReaL: an agent workflow that runs one web episode through AReaL's OpenAI-compatible proxy.

AReaL (1.0) trains *agent workflows*: any object with ``async def run(self, data, **extra_kwargs)`` returning the
episode's reward (a float, or a dict of rewards by completion id). AReaL serves its inference engine behind an
OpenAI-compatible proxy and calls ``run`` with that proxy's ``base_url``, a session-scoped ``api_key`` and an
``http_client`` (inline mode), or with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` set in a worker process (subproc
mode). Every chat completion made with the session's key is recorded with its tokens and log-probabilities; the
returned float becomes the last completion's reward, discounted back to the earlier ones
(``turn_discount``), and with ``export_style: individual`` each completion is its own training sample.

:class:`WebAgentWorkflow` is such a workflow for the engine's web tasks: it runs one episode of the row's task
(``data["task_id"]``) on an :class:`engine.clients.env.AsyncWebEnv` of a process-wide engine core
(:func:`train.adapters.shared_core`). Each step sends the chat ``run`` would give the model (``env.messages()``: the
system prompt, the context window's screenshots as ``data:image/jpeg;base64`` URLs, summaries of older steps) to
the proxy as one chat completion (:class:`policy.openai_backend.OpenAIModel`, the engine's own OpenAI client), and
steps the environment with the reply text. It returns the episode's reward (task checks, the page's own, or the
judge's verdict). One completion per step, each with the step's own context window, is what ``individual`` export
trains on::

    from areal import PPOTrainer
    from train.adapters.areal import WebAgentWorkflow

    with PPOTrainer(config, train_dataset=dataset) as trainer:   # rows: {"task_id": ..., "messages": [...]}
        trainer.train(workflow=WebAgentWorkflow(task_file="tasks.jsonl", run_config={"concurrency": 64}))

In inline mode the chat completions go through the ``http_client`` AReaL passes (its pooled ``httpx`` client), in
subproc mode through the engine's own client. An episode that ends with an error (a lost browser worker, a time
cap) raises :class:`engine.clients.env.EpisodeError`; AReaL rejects that trajectory.

Versions: AReaL 1.0.4 is the one tested (``tests/frameworks/test_areal.py`` in ``make test``, in an environment of its
own: AReaL pins ``torch<2.11``); importing this module where an older AReaL is installed raises ImportError, a newer
minor series warns.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.agent.model_api import ChatRequest, Generation, SamplingParams
from engine.agent.policy_api import PolicyError
from engine.agent.prompts import AgentConfig
from engine.clients.env import AsyncWebEnv
from engine.clients.gym_env import CoreThread
from engine.core.config import RunConfig
from engine.tasks.schema import BUNDLED_TASKS, Task
from policy.openai_backend import OpenAIModel

from . import Episode, FrameworkVersion, Reply, run_episode, shared_core, shared_tasks

__all__ = ["AREAL", "WebAgentWorkflow", "dataset_rows"]

#: The AReaL versions this adapter supports (the ``areal`` extra of ``pyproject.toml`` pins ``tested``).
AREAL = FrameworkVersion("AReaL", "areal", tested="1.0.4", minimum="1.0.4")
AREAL.check()


def dataset_rows(tasks: Sequence[Task]) -> list[dict[str, Any]]:
    """AReaL dataset rows for ``tasks``: the task id, and the task as a one-message chat (for AReaL's dataset
    tooling; the workflow builds the real prompt from the page)."""
    return [{"task_id": t.task_id, "messages": [{"role": "user", "content": t.task_name}]} for t in tasks]


class WebAgentWorkflow:
    """An AReaL agent workflow for the engine's web tasks (module docstring).

    ``core``: the engine core (default: the process's :func:`~train.adapters.shared_core` for ``run_config``,
    serving the bundled sites unless ``base_url`` says where the sites are); ``tasks`` (default: ``task_file``,
    default the bundled tasks); ``agent``: the agent protocol (an :class:`AgentConfig` or its fields). ``model``:
    the model name sent to the proxy; ``sampling``: :class:`SamplingParams` fields (temperature, top_p, max_tokens,
    ...); ``timeout_s`` / ``retries``: per chat completion. Without an explicit ``core`` or ``tasks`` the workflow
    pickles (AReaL's subproc mode), and each process starts its own core on first use.

    After ``run``: ``last_episode`` (steps, replies, reward and the episode's record).
    """

    def __init__(self, *, core: CoreThread | None = None, tasks: Sequence[Task] | None = None,
                 task_file: str | Path | None = None, base_url: str | None = None,
                 run_config: RunConfig | Mapping[str, Any] | None = None,
                 agent: AgentConfig | Mapping[str, Any] | None = None, model: str = "default",
                 sampling: Mapping[str, Any] | None = None, timeout_s: float = 600.0, retries: int = 0,
                 verdict_timeout_s: float | None = 600.0) -> None:
        self.core = core
        self.tasks = list(tasks) if tasks is not None else None
        self.task_file = str(task_file) if task_file is not None else None
        self.base_url = base_url
        self.run_config = run_config
        self.agent = AgentConfig(**agent) if isinstance(agent, Mapping) else agent
        self.model = model
        self.sampling = SamplingParams(**{"logprobs": False, **dict(sampling or {})})
        self.timeout_s = timeout_s
        self.retries = retries
        self.verdict_timeout_s = verdict_timeout_s
        self.last_episode: Episode | None = None

    def __getstate__(self) -> dict[str, Any]:
        if self.core is not None or self.tasks is not None:
            raise TypeError("a WebAgentWorkflow given a core or tasks runs in AReaL's inline mode only; give it "
                            "task_file / run_config to run in a worker process")
        return {**self.__dict__, "last_episode": None}

    def _engine(self) -> tuple[CoreThread, list[Task]]:
        core = self.core or shared_core(self.run_config, base_url=self.base_url)
        tasks = self.tasks if self.tasks is not None else shared_tasks(self.task_file or BUNDLED_TASKS,
                                                                        core.base_url)
        return core, tasks

    async def run(self, data: Mapping[str, Any], **extra_kwargs: Any) -> float:
        """One episode of ``data["task_id"]`` through the proxy at ``base_url`` with the session's ``api_key``
        and AReaL's ``http_client`` (inline mode's keyword arguments; else ``OPENAI_BASE_URL`` /
        ``OPENAI_API_KEY`` and the engine's own client); returns its reward."""
        task_id = data.get("task_id")
        if not task_id:
            raise KeyError("the dataset row names no task: give it a task_id field")
        base_url = extra_kwargs.get("base_url") or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("no endpoint: AReaL passes base_url (inline mode) or sets OPENAI_BASE_URL (subproc)")
        api_key = extra_kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY")
        http_client = extra_kwargs.get("http_client")
        core, tasks = self._engine()
        env = AsyncWebEnv(core.core, tasks, agent=self.agent)
        client = OpenAIModel(base_url, self.model, api_key=api_key, max_in_flight=1, timeout_s=self.timeout_s,
                             retries=self.retries)
        episode_key = uuid.uuid4().hex[:12]
        steps: list[str] = []

        async def generate(chat: list[dict[str, Any]], images: dict[str, bytes]) -> Reply:
            request = ChatRequest(f"{episode_key}-{len(steps)}", chat, images, self.sampling)
            steps.append(request.request_id)
            if http_client is None:
                out = await client.generate(request)
            else:
                out = await _through(http_client, client, api_key, request)
            return Reply(out.text, out.token_ids, out.logprobs, extra={"finish_reason": out.finish_reason})

        if http_client is None:
            await client.start()
        try:
            episode = await run_episode(core, env, task_id, generate, verdict_timeout_s=self.verdict_timeout_s)
        finally:
            await client.close()
        self.last_episode = episode
        return float(episode.reward)


async def _through(http_client: Any, client: OpenAIModel, api_key: str | None, request: ChatRequest) -> Generation:
    """One chat completion sent with AReaL's ``httpx.AsyncClient``, in the engine client's payload and parsing."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = await http_client.post(client.url, json=client.build_payload(request), headers=headers,
                                  timeout=client.timeout_s)
    if resp.status_code != 200:
        raise PolicyError(f"request {request.request_id}: {client.url} answered HTTP {resp.status_code}: "
                          f"{resp.text[:500]}")
    return client.parse_response(resp.json(), request.request_id)
