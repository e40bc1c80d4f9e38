"""veRL: an agent loop that runs one web episode and returns one training sample per step.

veRL's rollout runs an *agent loop* per trajectory: an ``AgentLoopBase`` subclass whose ``async run(sampling_params,
**row)`` talks to veRL's rollout servers through ``self.server_manager.generate(request_id, prompt_ids=...,
sampling_params=..., image_data=...)`` and returns ``AgentLoopOutput`` s. :class:`WebAgentLoop` runs one episode of
the row's task on an :class:`engine.clients.env.AsyncWebEnv` of a process-wide engine
core (:func:`train.adapters.shared_core`)
and, because ``run``'s context window makes every step its own sequence, returns one ``AgentLoopOutput`` per step:

- ``prompt_ids``: the chat ``run`` would give the model at that step (``env.messages()``: system prompt, the last
  ``window`` screenshots and replies, summaries of older steps), rendered by veRL's own tokenization
  (``self.ct_build_initial_tokens``) with the step's screenshots (``multi_modal_data["images"]``);
- ``response_ids`` / ``response_logprobs``: the tokens the server sampled (``response_mask`` all 1: no
  environment tokens inside a response); the decoded text steps the environment, which records the tokens with
  the step;
- ``reward_score``: the episode's reward (task checks, the page's own, or the judge's verdict) on the last step's
  output and ``None`` before it. veRL's TransferQueue agent-loop worker (``trainer.use_v1=True``, the default in
  veRL 0.9) stores each output as its own sample, copies the last output's reward to the earlier ones, and its
  GRPO advantage is computed from each trajectory's last output and broadcast to the others;
- ``extra_fields``: ``task_id``, ``episode_id``, ``step``, the action taken and its parse error, and on the last
  output ``reward_extra_info`` (the episode's status and reward).

An episode that the page ends as it opens (no model call) returns one output all the same, so that veRL's GRPO group
keeps its size: the row's prompt, the end-of-sequence token as a response nothing learns from (``response_mask``
0) and the recorded reward. An episode that ends with an error (a lost browser worker, a time cap) raises
:class:`engine.clients.env.EpisodeError`, which veRL treats as a failed trajectory.

Versions: veRL 0.9.1 is the one tested (``pip install 'webgym-engine[verl]'``; ``tests/frameworks/test_verl.py``
in ``make test``); importing this module where an older veRL is installed raises ImportError (its
``AgentLoopBase`` lacks what the loop uses), a newer minor series warns.

Configuration (``agent_loop_config_path`` of veRL's rollout config)::

    - name: webgym_agent
      _target_: train.adapters.verl.WebAgentLoop
      task_file: /data/webgym/tasks.jsonl        # default: the bundled tasks
      run_config: {concurrency: 64, output_dir: /data/webgym/runs}
      agent: {coords: grid, window: 4}

and dataset rows with ``agent_name: webgym_agent`` and the task id in ``extra_info.task_id`` (:func:`dataset_rows`).

The episode logic lives in :class:`WebAgentLoopMixin`, which needs only what ``AgentLoopBase`` provides
(``server_manager``, ``tokenizer``, ``rollout_config``, ``ct_build_initial_tokens``); ``WebAgentLoop`` combines it
with veRL's ``AgentLoopBase`` and exists where veRL is installed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.agent.prompts import AgentConfig
from engine.clients.env import AsyncWebEnv
from engine.clients.gym_env import CoreThread
from engine.core.config import RunConfig
from engine.tasks.schema import BUNDLED_TASKS, Task

from . import Episode, FrameworkVersion, Reply, chat_with_pil_images, run_episode, shared_core, shared_tasks

__all__ = ["AGENT_NAME", "VERL", "WebAgentLoopMixin", "dataset_rows"]  # and WebAgentLoop, where veRL is installed

#: The name the agent loop is registered under (a dataset row's ``agent_name``).
AGENT_NAME = "webgym_agent"

#: The veRL versions this adapter supports (the ``verl`` extra of ``pyproject.toml`` pins ``tested``).
VERL = FrameworkVersion("veRL", "verl", tested="0.9.1", minimum="0.9.1")
VERL.check()


def _plain(value: Any) -> Any:
    """A hydra/OmegaConf value as plain Python containers."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def dataset_rows(tasks: Sequence[Task], *, data_source: str = "webgym") -> list[dict[str, Any]]:
    """veRL dataset rows (write them to parquet) for ``tasks``: the task as the prompt, ``agent_name`` set to
    :data:`AGENT_NAME` and the task id in ``extra_info`` (the agent loop builds the real prompt from the page)."""
    return [{"data_source": data_source, "agent_name": AGENT_NAME,
             "prompt": [{"role": "user", "content": task.task_name}],
             "reward_model": {"style": "env", "ground_truth": ""},
             "extra_info": {"task_id": task.task_id, "index": i}} for i, task in enumerate(tasks)]


class WebAgentLoopMixin:
    """The episode logic of :class:`WebAgentLoop` (module docstring), for a class that also provides veRL's
    ``AgentLoopBase`` attributes (``server_manager``, ``tokenizer``, ``rollout_config``,
    ``ct_build_initial_tokens``) and ``make_output(fields, metrics)``, which builds an ``AgentLoopOutput``."""

    server_manager: Any
    tokenizer: Any
    rollout_config: Any
    ct_build_initial_tokens: Callable[..., Awaitable[list[int]]]
    make_output: Callable[[dict[str, Any], dict[str, Any]], Any]  # the AgentLoopOutput of these fields

    def web_setup(self, *, core: CoreThread | None = None, tasks: Sequence[Task] | None = None,
                  task_file: str | Path | None = None, base_url: str | None = None,
                  run_config: RunConfig | Mapping[str, Any] | None = None,
                  agent: AgentConfig | Mapping[str, Any] | None = None,
                  verdict_timeout_s: float | None = 600.0) -> None:
        """Attach the engine: ``core`` (default: the process's :func:`~train.adapters.shared_core` for
        ``run_config``, serving the bundled sites unless ``base_url`` says where the sites are), ``tasks`` (default:
        ``task_file``, default the bundled tasks), ``agent`` (the agent protocol: an :class:`AgentConfig` or its
        fields) and how long to wait for a judge's verdict."""
        run_config, agent = _plain(run_config), _plain(agent)
        self.web_core = core or shared_core(run_config, base_url=base_url)
        if tasks is None:
            tasks = shared_tasks(task_file or BUNDLED_TASKS, self.web_core.base_url)
        self.web_tasks = list(tasks)
        self.web_agent = AgentConfig(**agent) if isinstance(agent, Mapping) else agent
        self.web_verdict_timeout_s = verdict_timeout_s

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[Any]:
        """One episode of the row's task (``task_id``, or ``extra_info["task_id"]``); one output per step."""
        task_id = kwargs.get("task_id") or (_plain(kwargs.get("extra_info")) or {}).get("task_id")
        if not task_id:
            raise KeyError("the dataset row names no task: give it a task_id column or extra_info.task_id")
        env = AsyncWebEnv(self.web_core.core, self.web_tasks, agent=self.web_agent)
        request_id = uuid.uuid4().hex  # one per episode: the same server (and its prefix cache) for every step
        response_length = self.rollout_config.response_length

        async def generate(chat: list[dict[str, Any]], images: dict[str, bytes]) -> Reply:
            messages, pil = chat_with_pil_images(chat, images)
            check = getattr(self, "_assert_mm_supported", None)
            if check is not None:
                check(bool(pil))
            prompt_ids = await self.ct_build_initial_tokens(messages, images=pil or None)
            t0 = time.perf_counter()
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids,
                                                     sampling_params=sampling_params, image_data=pil or None)
            took = time.perf_counter() - t0
            token_ids = list(out.token_ids)
            logprobs = list(out.log_probs) if out.log_probs else None
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
            return Reply(text, token_ids, logprobs, extra={"prompt_ids": list(prompt_ids), "images": pil,
                                                           "generate_s": took,
                                                           "num_preempted": getattr(out, "num_preempted", None)})

        episode = await run_episode(self.web_core, env, task_id, generate,
                                    verdict_timeout_s=self.web_verdict_timeout_s)
        if not episode.steps:
            return [await self.web_ended_at_open(episode, kwargs.get("raw_prompt"), sampling_params)]
        return [self.web_output(episode, i, response_length) for i in range(len(episode.steps))]

    async def web_ended_at_open(self, episode: Episode, raw_prompt: Any, sampling_params: dict[str, Any]) -> Any:
        """The one ``AgentLoopOutput`` of an episode the page ended as it opened (module docstring)."""
        task = (episode.record or {}).get("task") or {}
        messages = _plain(raw_prompt) or [{"role": "user", "content": task.get("task_name", episode.task_id)}]
        prompt_ids = await self.ct_build_initial_tokens(list(messages))
        fields = {
            "prompt_ids": list(prompt_ids),
            "response_ids": [self.tokenizer.eos_token_id],
            "response_mask": [0],  # the policy chose nothing here: no loss on it
            "response_logprobs": [0.0] if sampling_params.get("logprobs") else None,
            "multi_modal_data": None,
            "reward_score": episode.reward,
            "num_turns": 1,
            "extra_fields": {**_step_fields(episode, 0, None, None), "ended_at_open": True,
                             "reward_extra_info": _reward_info(episode)},
        }
        return self.make_output(fields, {"generate_sequences": 0.0, "num_preempted": -1})

    def web_output(self, episode: Episode, index: int, response_length: int) -> Any:
        """The ``AgentLoopOutput`` of step ``index`` of ``episode`` (fields in the module docstring)."""
        step = episode.steps[index]
        reply, last = step.reply, index == len(episode.steps) - 1
        response = (reply.token_ids or [])[:response_length]
        extra = _step_fields(episode, index, step.info.get("action"), step.info.get("parse_error"))
        if last:
            extra["reward_extra_info"] = _reward_info(episode)
        fields = {
            "prompt_ids": reply.extra["prompt_ids"],
            "response_ids": response,
            "response_mask": [1] * len(response),
            "response_logprobs": reply.logprobs[:len(response)] if reply.logprobs else None,
            "multi_modal_data": {"images": reply.extra["images"]} if reply.extra["images"] else None,
            "reward_score": episode.reward if last else None,
            "num_turns": 2,  # one user turn (the step's chat), one assistant turn (the reply)
            "extra_fields": extra,
        }
        preempted = reply.extra.get("num_preempted")
        metrics = {"generate_sequences": reply.extra["generate_s"],
                   "num_preempted": preempted if preempted is not None else -1}
        return self.make_output(fields, metrics)


def _step_fields(episode: Episode, index: int, action: Any, parse_error: Any) -> dict[str, Any]:
    """The ``extra_fields`` every output carries: which task, episode and step, and what the step did."""
    return {"task_id": episode.task_id, "episode_id": episode.episode_id, "step": index, "action": action,
            "parse_error": parse_error}


def _reward_info(episode: Episode) -> dict[str, Any]:
    """The last output's ``reward_extra_info``: how the episode ended, and its reward."""
    return {"episode_status": (episode.record or {}).get("status"), "env_reward": episode.reward}


def _make_agent_loop() -> type:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        _agent_loop_registry,
        register,
    )

    class WebAgentLoop(WebAgentLoopMixin, AgentLoopBase):
        """veRL's agent loop for the engine's web tasks (module docstring). Keyword arguments beyond
        ``AgentLoopBase``'s (from the agent loop's configuration entry) go to :meth:`WebAgentLoopMixin.web_setup`."""

        def __init__(self, *args: Any, core: CoreThread | None = None, tasks: Sequence[Task] | None = None,
                     task_file: str | None = None, base_url: str | None = None,
                     run_config: Mapping[str, Any] | None = None, agent: Mapping[str, Any] | None = None,
                     verdict_timeout_s: float | None = 600.0, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.web_setup(core=core, tasks=tasks, task_file=task_file, base_url=base_url, run_config=run_config,
                           agent=agent, verdict_timeout_s=verdict_timeout_s)

        def make_output(self, fields: dict[str, Any], metrics: dict[str, Any]) -> AgentLoopOutput:
            return AgentLoopOutput(**fields, metrics=AgentLoopMetrics(**metrics))

    WebAgentLoop.__module__ = __name__
    WebAgentLoop.__qualname__ = "WebAgentLoop"
    if AGENT_NAME in _agent_loop_registry:
        # veRL's worker registered the entry of its agent_loop_config_path file, with the loop's settings, before
        # building this class from it: registering again would replace those settings for later trajectories.
        return WebAgentLoop
    return register(AGENT_NAME)(WebAgentLoop)


def __getattr__(name: str) -> Any:
    # WebAgentLoop subclasses veRL's AgentLoopBase, so it is built on first use: this module imports without veRL.
    if name == "WebAgentLoop":
        try:
            cls = _make_agent_loop()
        except ImportError as exc:
            raise ImportError(f"train.adapters.verl.WebAgentLoop needs veRL ({exc}); see docs/trainers/verl.md") \
                from exc
        globals()["WebAgentLoop"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
