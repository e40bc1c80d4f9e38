"""Several servers of one model as one :class:`LanguageModel`: each request goes to the least busy server.

For a policy served by several vLLM or SGLang instances without a router in front (a router hides which
instance answered, and every instance must receive each weight push: :mod:`policy.weight_sync`).
"""

from __future__ import annotations

import asyncio

from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from policy.openai_backend import OpenAIModel


class ServerPool(LanguageModel):
    """Spreads requests over ``servers`` by the fewest requests in flight (ties: the first listed)."""

    name = "openai"

    def __init__(self, servers: list[OpenAIModel]) -> None:
        if not servers:
            raise ValueError("a server pool needs at least one server")
        self.servers = servers
        self.model_name = servers[0].model_name
        self._assigned = [0] * len(servers)  # requests given to each server and not answered yet

    async def start(self) -> None:
        await asyncio.gather(*(s.start() for s in self.servers))

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers))

    async def generate(self, request: ChatRequest) -> Generation:
        """One reply from the server with the fewest outstanding requests."""
        index = min(range(len(self.servers)), key=self._assigned.__getitem__)
        self._assigned[index] += 1
        try:
            return await self.servers[index].generate(request)
        finally:
            self._assigned[index] -= 1
