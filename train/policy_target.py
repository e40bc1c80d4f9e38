"""The RL loop's policy: the model the agent calls, and how new weights reach it.

- ``policy = "hf"``: the in-process ``hf`` backend of the model being trained (:class:`policy.hf_backend.HFModel`),
  updated in place (:class:`policy.weight_sync.InProcessSync`).
- ``policy = "vllm"`` | ``"sglang"``: the servers in ``servers`` (``vllm serve`` / SGLang, serving
  ``served_model``), one client each behind a :class:`policy.server_pool.ServerPool`, updated through their
  weight-update APIs (:func:`policy.weight_sync.server_sync`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.model_api import LanguageModel
from policy.weight_sync import InProcessSync, WeightSync, server_sync

if TYPE_CHECKING:
    from train.loop import LoopConfig

POLICIES = ("hf", "vllm", "sglang")
# What each server reports by default (vLLM: --logprobs-mode raw_logprobs; SGLang: log_softmax(logits / T)
# before top-k and top-p unless SGLANG_RETURN_ORIGINAL_LOGPROB=1).
DEFAULT_LOGPROBS = {"vllm": "model", "sglang": "temperature"}
# How each server is asked for the generated token ids (training needs them with the log-probs).
_TOKEN_ID_FIELDS = {"vllm": {}, "sglang": {"return_token_ids": True}}


@dataclass
class PolicyTarget:
    """The model the agent calls, and the push that makes it serve new weights."""

    model: LanguageModel
    sync: WeightSync


def make_target(cfg: LoopConfig, api_key_env: str = "OPENAI_API_KEY") -> PolicyTarget:
    """The policy of ``cfg`` (see the module docstring)."""
    if cfg.policy == "hf":
        from policy.hf_backend import HFModel

        model = HFModel(cfg.train.model_dir, device=cfg.device, max_batch=cfg.max_batch,
                        vision_attention=cfg.train.vision_attention)
        return PolicyTarget(model, InProcessSync(model))
    from policy.openai_backend import OpenAIModel
    from policy.server_pool import ServerPool

    clients = [OpenAIModel(url, cfg.served_model or cfg.train.model_dir, api_key=os.environ.get(api_key_env),
                           max_in_flight=cfg.concurrency, token_ids=cfg.policy == "vllm",
                           extra_body=_TOKEN_ID_FIELDS[cfg.policy],
                           logprobs_of=cfg.logprobs_of or DEFAULT_LOGPROBS[cfg.policy])
               for url in cfg.servers]
    return PolicyTarget(ServerPool(clients), server_sync(cfg.policy, clients, cfg.push_mode))  # type: ignore[arg-type]
