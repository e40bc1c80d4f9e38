"""The instant policy: answers at once with the same harmless in-page click, for throughput
benchmarks where the policy must cost nothing. Not an agent."""

from __future__ import annotations

from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyReply, PolicyRequest


class InstantPolicy(Policy):
    """Clicks a fixed point (default: the top-left corner, usually inert) every step."""

    name = "instant"
    reads_pixels = False

    def __init__(self, x: float = 5.0, y: float = 5.0) -> None:
        self.x, self.y = x, y

    async def act(self, request: PolicyRequest) -> PolicyReply:
        return PolicyReply(AgentAction("left_click", x=self.x, y=self.y), text="instant")
