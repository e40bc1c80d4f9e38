"""Configuration of a browser worker (passed to worker processes as JSON)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

DEFAULT_CHROMIUM = "/usr/lib/chromium/chromium"

# Flags that keep a headless Chromium quiet and fast on a machine with no outside network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    # The omnibox WebUI features give every headless window (one per context) its own hidden
    # renderer process, ~22 MiB each: off.
    "--disable-features=Translate,MediaRouter,OptimizationHints,"
    "WebUIOmniboxPopup,WebUIOmniboxAimPopup,WebUIOmniboxFullPopup",
    "--mute-audio",
]


@dataclass(slots=True)
class WorkerConfig:
    """Everything one worker needs; the pool fills it and hands it over on the command line."""

    endpoint: str
    worker_id: str = "w0"
    chromium_path: str = DEFAULT_CHROMIUM
    chromium_flags: list[str] = field(default_factory=lambda: list(CHROMIUM_FLAGS))
    viewport_width: int = 1280
    viewport_height: int = 768
    jpeg_quality: int = 80
    slot_count: int = 64
    slot_size: int = 1 << 20
    quiet_ms: int = 40  # DOM/network quiet period that counts as settled
    idle_cap_ms: int = 2000  # after load, give up waiting for quiet ("busy") after this long
    settle_timeout_s: float = 10.0  # hard cap on one action plus settle, navigation included
    open_timeout_s: float = 30.0  # hard cap on an episode's first page load
    screenshot_timeout_s: float = 10.0
    context_reuse: int = 50  # episodes per BrowserContext before it is recycled
    heartbeat_s: float = 1.0
    allowed_schemes: tuple[str, ...] = ("http", "https", "about")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        d = json.loads(text)
        if "allowed_schemes" in d:
            d["allowed_schemes"] = tuple(d["allowed_schemes"])
        return cls(**d)
