"""OpenEnv's own client (the ``openenv`` package, ``.venv-openenv``) against ``webgym-engine openenv``: run by
tests/frameworks/test_openenv.py, which starts the server and reads what this prints (one JSON line).

``python tests/frameworks/openenv_client.py URL SESSIONS``: SESSIONS concurrent sessions of OpenEnv's
``GenericEnvClient``, half in the BrowserGym vocabulary, half in the engine's, each solving one bundled answer task
(a step that does nothing, then the answer); each BrowserGym observation is validated by a model with the fields of
OpenEnv's BrowserGym environment (``envs/browsergym_env/models.py``), as its ``BrowserGymEnv`` client takes them.
Then one session past the server's capacity, and one action the server must refuse.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from openenv.core import GenericEnvClient
from openenv.core.env_server.types import Observation, State

ANSWERS = {"shop-001": "SPRING10", "shop-002": "WELCOME5"}


class BrowserGymObservation(Observation):
    """The observation fields of OpenEnv's BrowserGym environment, as its client builds them."""

    text: str = ""
    url: str = ""
    screenshot: list[list[list[int]]] | None = None
    goal: str = ""
    axtree_txt: str = ""
    pruned_html: str = ""
    error: str = ""
    last_action_error: bool = False


class BrowserGymState(State):
    benchmark: str = ""
    task_name: str = ""
    task_id: str | None = None
    goal: str = ""
    current_url: str = ""
    max_steps: int | None = None
    cum_reward: float = 0.0


async def session(url: str, index: int) -> dict[str, Any]:
    task = sorted(ANSWERS)[index % 2]
    browsergym = index % 2 == 0
    # The first session takes BrowserGym's screenshot as its integer rows (about 10 MB a message); the others as JPEG.
    options = ({"task_name": task, "screenshot": "array" if index == 0 else "jpeg"} if browsergym
               else {"task_id": task, "vocabulary": "engine"})
    async with GenericEnvClient(base_url=url) as env:
        first = await env.reset(**options)
        if browsergym:
            obs = BrowserGymObservation(**first.observation, reward=first.reward, done=first.done)
            shape = [len(obs.screenshot), len(obs.screenshot[0]), len(obs.screenshot[0][0])] if obs.screenshot else None
            noop, answer = {"action_str": "noop()"}, {"action_str": f"send_msg_to_user('{ANSWERS[task]}')"}
        else:
            shape = None
            noop, answer = {"action": {"name": "wait", "seconds": 0}}, {"action": {"name": "answer",
                                                                               "text": ANSWERS[task]}}
        middle = await env.step(noop)
        last = await env.step(answer)
        state = await env.state()
        if browsergym:
            BrowserGymState(**state)
        return {"task": task, "vocabulary": "browsergym" if browsergym else "engine", "shape": shape,
                "jpeg": "screenshot_jpeg" in (first.observation.get("metadata") or {})
                        or bool(first.observation.get("screenshot_jpeg")),
                "rewards": [first.reward, middle.reward, last.reward], "done": [first.done, middle.done, last.done],
                "steps": state["step_count"], "episode_id": state["episode_id"]}


async def refused(url: str, coro: Any) -> str:
    try:
        await coro
    except RuntimeError as exc:  # the client's "Server error: ... (code: CODE)"
        return str(exc)
    return "not refused"


async def main(url: str, sessions: int) -> None:
    t0 = time.monotonic()
    results = await asyncio.gather(*(session(url, i) for i in range(sessions)))
    wall = time.monotonic() - t0
    # Capacity: as many sessions as the server takes, held open, and one more.
    clients = [GenericEnvClient(base_url=url) for _ in range(sessions + 1)]
    for client in clients[:-1]:
        await client.connect()
        await client.state()
    full = await refused(url, clients[-1].state())
    for client in clients:
        await client.close()
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(task_name="shop-001")
        invalid = await refused(url, env.step({"action": "noop()"}))
        still = (await env.step({"action_str": "noop()"})).done
    print(json.dumps({"results": results, "wall_s": wall, "full": full, "invalid": invalid,
                      "after_invalid_done": still}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
