"""The engine as an OpenEnv environment server: ``webgym-engine openenv`` (docs/openenv.md).

OpenEnv's ``/ws`` session channel (reset, step, state, close), its stateless HTTP routes, ``/health``, ``/schema``,
``/metadata`` and its task routes, on the engine's own HTTP stack (aiohttp on the core's event loop): each session is
an :class:`engine.clients.env.AsyncWebEnv` of the one core, so every session's episode is leased, bounded, rewarded,
judged and recorded as ``webgym-engine run`` does it, and hundreds of sessions share one pool of browsers.
"""
