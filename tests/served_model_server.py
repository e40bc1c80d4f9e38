"""A test server for served models: the vLLM / SGLang stand-in with the tests' hooks.

:class:`ServedModelTestServer` is :class:`policy.served_stand_in.ServedStandInServer` (the OpenAI protocol over
real HTTP around the in-process ``hf`` backend of a tiny model, with vLLM's control routes (``reload_weights``, or
the ``disk`` weight-transfer calls) or SGLang's update_weights_from_disk, pause and abort, version labels and
idle-time measurement) plus the chat test server's
fault injection (:class:`tests.chat_test_server.FaultInjectingServer`) and ``generation_delay_s``, which keeps
requests in flight for tests of what a push does to them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from engine.agent.model_api import ChatRequest, Generation
from policy.hf_backend import HFModel
from policy.served_stand_in import FLAVORS, ServedStandInServer
from tests.chat_test_server import FaultInjectingServer

__all__ = ["FLAVORS", "ServedModelTestServer"]


class ServedModelTestServer(FaultInjectingServer, ServedStandInServer):
    """A stand-in for a vLLM or SGLang server of ``model``, for tests (see the module docstring)."""

    def __init__(self, model: HFModel, flavor: str = "vllm", served_model_name: str = "policy", **kwargs: Any) -> None:
        super().__init__(model, flavor, served_model_name, **kwargs)
        self.generation_delay_s = 0.0  # added to every generation (abortable), to hold requests in flight
        self.generating = 0  # generations under way (a test waits for its requests to be in flight here)

    async def run_model(self, chat: ChatRequest) -> Generation:
        self.generating += 1
        try:
            if self.generation_delay_s:
                await asyncio.sleep(self.generation_delay_s)
            return await super().run_model(chat)
        finally:
            self.generating -= 1
