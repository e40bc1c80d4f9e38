"""The RL loop's policy: the model the agent calls, and how new weights reach it.

- ``policy = "hf"``: the in-process ``hf`` backend of the model being trained (:class:`policy.hf_backend.HFModel`),
  updated in place (:class:`policy.weight_sync.InProcessSync`).
- ``policy = "vllm"`` | ``"sglang"``: the servers in ``servers`` (``vllm serve`` / SGLang, serving
  ``served_model``), one client each behind a :class:`policy.server_pool.ServerPool`, updated through their
  weight-update APIs (:func:`policy.weight_sync.server_sync`).
- ``policy = "stand_in"``: the served path end to end where no GPU can run vLLM: the loop starts
  :class:`policy.served_stand_in.ServedStandInServer` (the OpenAI API over real HTTP on 127.0.0.1 around the
  in-process ``hf`` backend, with vLLM's control routes), talks to it as to a vLLM server and pushes
  every update through vLLM's HTTP calls. A stand-in for CPU runs, demonstrations and tests, not a server to
  deploy.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.agent.model_api import LanguageModel
from policy.weight_sync import InProcessSync, WeightSync, server_sync

if TYPE_CHECKING:
    from train.loop_config import LoopConfig

# What each server reports by default (vLLM: --logprobs-mode raw_logprobs; SGLang: log_softmax(logits / T)
# before top-k and top-p unless SGLANG_RETURN_ORIGINAL_LOGPROB=1).
DEFAULT_LOGPROBS = {"vllm": "model", "sglang": "temperature"}
# How each server is asked for the generated token ids (training needs them with the log-probs).
_TOKEN_ID_FIELDS = {"vllm": {}, "sglang": {"return_token_ids": True}}
STAND_IN_NAME = "policy"  # the name the stand-in serves the model under


@dataclass
class PolicyTarget:
    """The model the agent calls, the push that makes it serve new weights, and the stand-in server the loop
    runs itself (``policy = "stand_in"``; None otherwise)."""

    model: LanguageModel
    sync: WeightSync
    server: Any = None  # an async context manager: entered by start(), left by close()
    _stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack, repr=False)

    async def start(self) -> None:
        """Start the stand-in server (if any), then label the weights served now as version 0."""
        if self.server is not None:
            await self._stack.enter_async_context(self.server)
        await self.sync.start()

    async def close(self) -> None:
        try:
            await self.sync.close()
        finally:
            await self._stack.aclose()


def make_target(cfg: LoopConfig, api_key_env: str = "OPENAI_API_KEY") -> PolicyTarget:
    """The policy of ``cfg`` (see the module docstring)."""
    from policy.hf_backend import HFModel

    if cfg.policy == "hf":
        model = HFModel(cfg.train.model_dir, device=cfg.device, max_batch=cfg.max_batch,
                        vision_attention=cfg.train.vision_attention)
        return PolicyTarget(model, InProcessSync(model))
    from policy.openai_backend import OpenAIModel
    from policy.server_pool import ServerPool

    if cfg.policy == "stand_in":
        from policy.served_stand_in import ServedStandInServer

        hf = HFModel(cfg.train.model_dir, device=cfg.device, max_batch=cfg.max_batch,
                     vision_attention=cfg.train.vision_attention)
        port = free_port()
        server = ServedStandInServer(hf, "vllm", STAND_IN_NAME, port=port)
        client = OpenAIModel(f"http://127.0.0.1:{port}/v1", STAND_IN_NAME, max_in_flight=cfg.concurrency,
                             token_ids=True, logprobs_of=DEFAULT_LOGPROBS["vllm"])
        return PolicyTarget(ServerPool([client]), server_sync("vllm", [client], cfg.push_mode),
                            server=server)
    clients = [OpenAIModel(url, cfg.served_model or cfg.train.model_dir, api_key=os.environ.get(api_key_env),
                           max_in_flight=cfg.concurrency, token_ids=cfg.policy == "vllm",
                           extra_body=_TOKEN_ID_FIELDS[cfg.policy],
                           logprobs_of=cfg.logprobs_of or DEFAULT_LOGPROBS[cfg.policy])
               for url in cfg.servers]
    return PolicyTarget(ServerPool(clients), server_sync(cfg.policy, clients, cfg.push_mode))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the stand-in's client needs its URL before it starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
