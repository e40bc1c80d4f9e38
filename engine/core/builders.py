"""What the engine core builds from its configuration: a fresh run directory, its CURVE keys, the pool's settings."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from browserpool.auth import KeyFileError, ServerKeys
from browserpool.pool import PoolConfig
from browserpool.protocol import MAX_SLOTS
from engine.core.config import RunConfig


def new_run_dir(output_dir: str) -> Path:
    """A fresh, time-stamped run directory under ``output_dir``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"run-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    path.mkdir(parents=True)
    return path


def server_keys(cfg: RunConfig) -> ServerKeys | None:
    """The engine's CURVE keys for its tcp sockets, or None when none were given."""
    if cfg.server_key is None:
        if cfg.allow_keys is not None:
            raise KeyFileError("RunConfig.allow_keys needs RunConfig.server_key (the engine's own secret key)")
        return None
    return ServerKeys.load(cfg.server_key, cfg.allow_keys)


def pool_config(cfg: RunConfig, log_path: str | None, secret_env: Iterable[str] = ()) -> PoolConfig:
    """The browser pool's settings for a run of ``cfg``."""
    per_worker = -(-cfg.concurrency // cfg.workers)
    # A rollout holds up to two screenshot slots (its last frame until it is written and handed back, and the new
    # one); with fewer slots than that, frames travel inline through the socket, a copy each way.
    slots = min(MAX_SLOTS, max(cfg.worker.slot_count, 2 * per_worker))
    worker = cfg.worker if slots == cfg.worker.slot_count else replace(cfg.worker, slot_count=slots)
    return PoolConfig(workers=cfg.workers, worker=worker, listen=cfg.listen, spawn=cfg.spawn_workers,
                      max_episodes_per_worker=max(2 * per_worker, per_worker + 4),
                      ops_per_worker=cfg.ops_per_worker, log_path=log_path,
                      server_keys=server_keys(cfg), insecure=cfg.insecure,
                      secret_env=tuple(dict.fromkeys([*cfg.secret_env, *secret_env])))
