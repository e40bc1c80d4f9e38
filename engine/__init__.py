"""webgym-engine: an asynchronous rollout engine for visual web agents.

What a library user needs is importable from here (``from engine import EngineCore, RunConfig``); each name is
loaded on first use, so ``import engine.store.records`` (a worker, a viewer) does not load the core. The rooms:

- ``engine.core``: the engine core (:class:`EngineCore`), its configuration, the plan feeder, the straggler cut;
- ``engine.clients``: thin clients of the core (``run``'s runner, :class:`RolloutService`, the environments);
- ``engine.episode``: one episode's state machine;
- ``engine.agent``: the action vocabulary, the policy and model interfaces, the Qwen-VL agent protocol;
- ``engine.tasks``: the task schema, task files, MiniWoB++;
- ``engine.rewards``: programmatic rubric checks, the judge and its queue;
- ``engine.store``: the run directory and its records;
- ``engine.telemetry``: the live feed for monitors;
- ``engine.web``: domains, the blocklist, credentials in URLs, bounds on page text;
- ``engine.sites``: the bundled websites and their server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine._version import __version__

#: Each exported name and the module that defines it.
_EXPORTS = {
    "EngineCore": "engine.core.core",
    "RunConfig": "engine.core.config",
    "RolloutService": "engine.clients.service",
    "AsyncWebEnv": "engine.clients.env",
    "WebEnv": "engine.clients.gym_env",
    "Task": "engine.tasks.schema",
    "load_tasks": "engine.tasks.loading",
    "Policy": "engine.agent.policy_api",
    "EpisodeRecord": "engine.store.records",
    "read_records": "engine.store.run_dir",
}

__all__ = ["AsyncWebEnv", "EngineCore", "EpisodeRecord", "Policy", "RolloutService", "RunConfig", "Task", "WebEnv",
           "__version__", "load_tasks", "read_records"]

if TYPE_CHECKING:
    from engine.agent.policy_api import Policy
    from engine.clients.env import AsyncWebEnv
    from engine.clients.gym_env import WebEnv
    from engine.clients.service import RolloutService
    from engine.core.config import RunConfig
    from engine.core.core import EngineCore
    from engine.store.records import EpisodeRecord
    from engine.store.run_dir import read_records
    from engine.tasks.loading import load_tasks
    from engine.tasks.schema import Task


def __getattr__(name: str) -> Any:
    # An unknown name raises AttributeError, so ``from engine import _imgcodec`` still imports the submodule.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
