"""The random policy: random valid actions on the visible viewport (seeded per episode).

With ``som=True`` the episode's observations list the interactive elements (Set-of-Marks), and most
clicks and typing go to the centre of a random element instead of a random point: a fairer random
baseline on pages whose targets are small (MiniWoB++'s task area is 3% of the viewport).
"""

from __future__ import annotations

import random
import zlib

from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyReply, PolicyRequest

_WORDS = ("mug", "lamp", "paris", "london", "history", "review", "blue", "2", "hello", "search")
_KEYS = ("Enter", "Tab", "ArrowDown", "Escape", "PageDown")


class RandomPolicy(Policy):
    """Clicks, types, scrolls, presses keys, goes back, and now and then answers."""

    name = "random"
    reads_pixels = False

    def __init__(self, seed: int = 0, answer_prob: float = 0.03, som: bool = False) -> None:
        self.seed = seed
        self.answer_prob = answer_prob
        self.som = som
        self._rngs: dict[str, random.Random] = {}

    async def act(self, request: PolicyRequest) -> PolicyReply:
        rng = self._rngs.get(request.episode_id)
        if rng is None:
            rng = self._rngs[request.episode_id] = random.Random(
                self.seed * 1_000_003 + zlib.crc32(request.episode_id.encode()))
        obs = request.observation
        if obs.elements and rng.random() < 0.8:
            _, _, _, ex, ey, ew, eh = rng.choice(obs.elements)
            x, y = ex + ew / 2, ey + eh / 2
        else:
            x = round(rng.uniform(0, obs.width - 1), 1)
            y = round(rng.uniform(0, obs.height - 1), 1)
        r = rng.random()
        if r < self.answer_prob:
            action = AgentAction("answer", text=rng.choice(_WORDS))
        elif r < 0.55:
            action = AgentAction("left_click", x=x, y=y)
        elif r < 0.68:
            action = AgentAction("scroll", direction=rng.choice(("up", "down")))
        elif r < 0.80:
            action = AgentAction("type", x=x, y=y, text=rng.choice(_WORDS), enter=rng.random() < 0.5)
        elif r < 0.86:
            action = AgentAction("go_back")
        elif r < 0.92:
            action = AgentAction("keypress", keys=rng.choice(_KEYS))
        else:
            action = AgentAction("wait", seconds=1.0)
        return PolicyReply(action, text=action.describe())

    async def end_episode(self, episode_id: str) -> None:
        self._rngs.pop(episode_id, None)
