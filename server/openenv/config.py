"""How the OpenEnv server listens and what its sessions speak (``webgym-engine openenv``'s options)."""

from __future__ import annotations

from dataclasses import dataclass

from server.openenv.vocabularies import ScreenshotForm, VocabularyName


@dataclass
class OpenEnvConfig:
    """The OpenEnv server's settings; the command line's defaults are these fields'."""

    host: str = "127.0.0.1"
    port: int = 8000  # OpenEnv's environments listen on 8000
    # The key every request must carry (``Authorization: Bearer KEY`` or ``x-api-key``; the OpenEnv client's
    # ``headers``); None: no check, for loopback use only.
    api_key: str | None = None
    capacity: int = 64  # sessions at once; one more gets CAPACITY_REACHED at once
    vocabulary: VocabularyName = "browsergym"  # a reset's "vocabulary" chooses for its session
    screenshot: ScreenshotForm = "array"  # the browsergym vocabulary's screenshot field (a reset's "screenshot")
    # A session that sends nothing this long has its episode ended (recorded as client_idle) and is closed. Long
    # enough for a model's generation between steps; the pings below keep a quiet connection open meanwhile.
    idle_timeout_s: float = 900.0
    heartbeat_s: float = 20.0  # a ping this often; a peer that does not answer one is gone
    max_message_bytes: int = 1 << 20  # a larger client message gets a VALIDATION_ERROR
    max_body_bytes: int = 1 << 20  # an HTTP request body past it: 413
