"""Build a policy by name (the CLI's ``--policy``).

``scripted``, ``random``, ``instant`` and ``miniwob-scripted`` (MiniWoB++ tasks) act directly; ``openai``,
``hf``, ``vllm``, ``simulated`` and ``tree-scripted`` are model backends driven through the web-agent protocol
(:class:`policy.agent_policy.AgentPolicy`). ``simulated`` (a served model's latency) and ``tree-scripted`` (reference
solutions answered from the accessibility tree's text) are stand-ins, not models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.agent.model_api import LanguageModel, SamplingParams
from engine.agent.policy_api import Policy
from engine.agent.prompts import AgentConfig
from engine.rewards.judge import JudgeConfig, RubricJudge

if TYPE_CHECKING:
    from policy.openai_backend import ImageTransport  # loaded with the openai backend only (aiohttp)

DIRECT_POLICIES = ("scripted", "random", "instant", "miniwob-scripted")
MODEL_BACKENDS = ("openai", "hf", "vllm", "simulated", "tree-scripted")
POLICY_NAMES = DIRECT_POLICIES + MODEL_BACKENDS


@dataclass
class BackendConfig:
    """Options of the model backends (each uses the ones that apply to it)."""

    # hf / vllm: a local model directory; openai: the served model's name; tree-scripted: a task file whose steps
    # name their targets as the tree does (default: the bundled tasks)
    model: str | None = None
    base_url: str | None = None  # openai: e.g. http://127.0.0.1:8000/v1
    api_key_env: str = "OPENAI_API_KEY"  # openai: the environment variable holding the key (never recorded)
    device: str = "auto"  # hf: cpu | cuda | auto
    max_batch: int = 16  # hf: requests per generate() call
    timeout_s: float = 120.0  # openai: per request
    image_transport: ImageTransport = "data_url"  # openai: data_url | file_url (a server allowed to read the run dir)
    token_ids: bool = False  # openai: ask a vLLM server for the generated token ids (training needs them)
    logprobs_of: str | None = None  # openai: what the server's log-probs are of (engine.agent.model_api.LOGPROBS_KINDS)
    sim_speed: float = 1.0  # simulated: divides every latency


def make_model(name: str, backend: BackendConfig, seed: int = 0, max_in_flight: int = 128,
               run_dir: str | None = None) -> LanguageModel:
    """The language model behind a model policy; ValueError for bad options."""
    if name == "simulated":
        from policy.simulated import LatencyModel, SimulatedModel
        return SimulatedModel(seed=seed, latency=LatencyModel(speed=backend.sim_speed))
    if name == "tree-scripted":
        from engine.tasks.loading import load_tasks
        from engine.tasks.schema import BUNDLED_TASKS
        from policy.tree_scripted import TreeScriptedModel
        return TreeScriptedModel(load_tasks(backend.model or BUNDLED_TASKS))
    if not backend.model:
        raise ValueError(f"the {name} backend needs BackendConfig.model (the CLI's --model)")
    if name == "openai":
        if not backend.base_url:
            raise ValueError("the openai backend needs BackendConfig.base_url (the CLI's --base-url), "
                             "e.g. http://127.0.0.1:8000/v1")
        from policy.openai_backend import OpenAIModel
        return OpenAIModel(backend.base_url, backend.model, api_key=os.environ.get(backend.api_key_env),
                           max_in_flight=max_in_flight, timeout_s=backend.timeout_s,
                           image_transport=backend.image_transport, run_dir=run_dir, token_ids=backend.token_ids,
                           logprobs_of=backend.logprobs_of)
    if name == "hf":
        from policy.hf_backend import HFModel
        return HFModel(backend.model, device=backend.device, max_batch=backend.max_batch)
    if name == "vllm":
        from policy.vllm_backend import VLLMModel
        return VLLMModel(backend.model)
    raise ValueError(f"unknown model backend {name!r}; choose one of {', '.join(MODEL_BACKENDS)}")


def make_policy(name: str, seed: int = 0, agent: AgentConfig | None = None, sampling: SamplingParams | None = None,
                backend: BackendConfig | None = None, max_in_flight: int = 128,
                run_dir: str | None = None) -> Policy:
    """A policy instance for ``name``; ValueError for unknown names or missing options."""
    if name == "scripted":
        from policy.scripted import ScriptedPolicy
        return ScriptedPolicy()
    if name == "random":
        from policy.random_policy import RandomPolicy
        return RandomPolicy(seed=seed, som=bool(agent and agent.som))
    if name == "instant":
        from policy.instant import InstantPolicy
        return InstantPolicy()
    if name == "miniwob-scripted":
        from policy.miniwob_scripted import MiniWobScriptedPolicy
        return MiniWobScriptedPolicy()
    if name in MODEL_BACKENDS:
        from policy.agent_policy import AgentPolicy
        model = make_model(name, backend or BackendConfig(), seed, max_in_flight, run_dir)
        return AgentPolicy(model, agent, sampling)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


def make_judge(cfg: JudgeConfig) -> RubricJudge:
    """The rubric judge on ``cfg.base_url`` (any OpenAI-compatible server); ValueError without one."""
    if not cfg.base_url or not cfg.model:
        raise ValueError("the judge needs JudgeConfig.base_url and JudgeConfig.model")
    from policy.openai_backend import OpenAIModel

    model = OpenAIModel(cfg.base_url, cfg.model, api_key=os.environ.get(cfg.api_key_env),
                        max_in_flight=cfg.concurrency, timeout_s=cfg.timeout_s, retries=cfg.retries,
                        backoff_s=cfg.backoff_s, backoff_max_s=cfg.backoff_max_s)
    return RubricJudge(cfg, model)
