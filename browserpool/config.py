"""Configuration of a browser worker (passed to worker processes as JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import msgspec

from browserpool.consent import ConsentMode
from browserpool.protocol import NetSettings
from browserpool.typed_config import ConfigError, check_choices, config_from

# Chromium's headless shell (Debian's chromium-headless-shell; Playwright's own default for headless runs): the same
# Blink and V8 without the desktop browser's layer, so contexts, pages and navigations cost a third to nearly half
# less CPU (docs/architecture.md, "The browser build"). The full browser (FULL_CHROMIUM, `--chromium`) stays usable,
# e.g. on the open web where a site may need what only it has.
DEFAULT_CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
FULL_CHROMIUM = "/usr/lib/chromium/chromium"

# Flags that keep a headless Chromium quiet and fast on a machine with no outside network (CHROMIUM_FLAGS, below,
# adds the feature switches).
QUIET_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--mute-audio",
]

#: The features Playwright (1.65) switches off and on with its own ``--disable-features`` / ``--enable-features``.
#: Chromium keeps only the last value of a repeated switch, and Playwright puts the caller's flags after its own, so
#: a ``--disable-features`` of the engine's would silently drop Playwright's list (``PaintHolding``,
#: ``HttpsUpgrades``, ...): :func:`launch_flags` merges them into one. ``tests/test_chromium_flags.py`` reads a
#: running browser's command line, so a Playwright release that changes its lists fails there.
PLAYWRIGHT_DISABLED_FEATURES = (
    "AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose", "HttpsUpgrades",
    "HttpsFirstBalancedModeAutoEnable", "LensOverlay", "MediaRouter", "PaintHolding", "ThirdPartyStoragePartitioning",
    "AvoidCorsURLLoaderRestartOnRedirect", "TcpPortRandomizationWin", "OptimizationHints",
    "NetworkTimeServiceQuerying", "AimEnabled", "PreconnectToSearch", "msForceBrowserSignIn",
    "msEdgeUpdateLaunchServicesPreferredVersion",
)
PLAYWRIGHT_ENABLED_FEATURES = ("CDPScreenshotNewSurface", "SkipListAccountsWithoutGaiaCookies")
#: Of Playwright's, the one the engine leaves on: third-party storage partitioning is the web's default (Chrome
#: ships it), and the tab reset clears each partition (browserpool/tab_reset.py). Without it a cross-site frame's
#: storage would be one store shared by every site that embeds it, and the reset's partition keys are refused.
ENGINE_KEEPS_ON = ("ThirdPartyStoragePartitioning",)
#: The engine's own: the omnibox WebUI features give every headless window (one per context) its own hidden
#: renderer process, ~22 MiB each; the rest phone home.
ENGINE_DISABLED_FEATURES = ("Translate", "MediaRouter", "OptimizationHints", "WebUIOmniboxPopup",
                            "WebUIOmniboxAimPopup", "WebUIOmniboxFullPopup", "AutofillServerCommunication")
_FEATURE_SWITCHES = {"--disable-features": PLAYWRIGHT_DISABLED_FEATURES,
                     "--enable-features": PLAYWRIGHT_ENABLED_FEATURES}


def launch_flags(flags: list[str]) -> list[str]:
    """``flags`` as Chromium is launched with them: each of ``--disable-features`` and ``--enable-features`` given
    once, at the end, holding Playwright's names and every value the flags gave it, less :data:`ENGINE_KEEPS_ON`
    (the comment above :data:`PLAYWRIGHT_DISABLED_FEATURES`)."""
    out: list[str] = []
    names: dict[str, dict[str, None]] = {}
    for flag in flags:
        switch, eq, value = flag.partition("=")
        if eq and switch in _FEATURE_SWITCHES:
            merged = names.setdefault(switch, dict.fromkeys(_FEATURE_SWITCHES[switch]))
            merged.update(dict.fromkeys(v for v in value.split(",") if v))
        else:
            out.append(flag)
    keep_on = set(ENGINE_KEEPS_ON)
    return out + [f"{switch}={','.join(n for n in merged if switch != '--disable-features' or n not in keep_on)}"
                  for switch, merged in names.items()]


#: The workers' Chromium flags.
CHROMIUM_FLAGS = launch_flags([*QUIET_FLAGS, "--disable-features=" + ",".join(ENGINE_DISABLED_FEATURES)])


# The default caps of a Set-of-Marks pass (WorkerConfig.som_max_elements, som_budget_ms).
SOM_MAX_ELEMENTS = 1000
SOM_BUDGET_MS = 2000


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
    # A start page that fails in a way that may pass (an unreachable host, HTTP 5xx) is loaded again up to
    # open_retries times, after open_backoff_s, then twice that, ... (the episode then goes on with what it got).
    open_retries: int = 2
    open_backoff_s: float = 1.0
    screenshot_timeout_s: float = 10.0
    # A capture Chromium refuses ("Unable to capture screenshot", a page that is fine, under load) is tried again up
    # to capture_retries times within screenshot_timeout_s; one still refused ends the episode (browser_capture).
    capture_retries: int = 3
    # A Set-of-Marks pass lists (and draws) at most som_max_elements elements, and stops after som_budget_ms: on a
    # page of tens of thousands of targets it would otherwise run past the screenshot's timeout (hit tests cost
    # more the more elements a page has). The observation's note says when a pass was cut.
    som_max_elements: int = SOM_MAX_ELEMENTS
    som_budget_ms: int = SOM_BUDGET_MS
    # An accessibility tree (episodes opened with axtree) keeps at most axtree_max_nodes nodes, each name and value
    # cut to axtree_text_chars: a page of a hundred thousand nodes would otherwise fill the prompt and the message.
    axtree_max_nodes: int = 3000
    axtree_text_chars: int = 200
    dom_max_nodes: int = 3000  # elements of a DOM snapshot (episodes opened with dom), the first in document order
    context_reuse: int = 50  # episodes per BrowserContext before it is recycled
    # Pages an episode's pages may open (popups, new tabs: browserpool/popup_guard.py) that are let load; every one
    # past them is closed before it sends a request, and recorded. Each one that loads can take a renderer of its
    # own, so a page that opened dozens took the worker's memory from every other episode. 0: none loads (a popup
    # the agent's action opened still takes the episode's tab to its URL).
    max_popups: int = 4
    heartbeat_s: float = 1.0
    allowed_schemes: tuple[str, ...] = ("http", "https", "about")
    # The network policy for pages (browserpool.netpolicy; its fields in browserpool.protocol.NetSettings).
    net: NetSettings = field(default_factory=NetSettings)
    # Upstream proxies (browserpool.upstream): http://[$USER_VAR:$PASS_VAR@]HOST:PORT, credentials named by
    # environment variables; each context sticks to one, a failing one is set aside for proxy_cooldown_s.
    proxies: list[str] = field(default_factory=list)
    proxy_cooldown_s: float = 60.0
    # Request rules (browserpool.request_rules): hosts files or EasyList files whose hosts' requests are refused
    # in the worker (ads, trackers); paths on the worker's host. Empty: nothing is blocked.
    request_rules: list[str] = field(default_factory=list)
    # The browser's User-Agent (None: headless Chromium's own, which names it HeadlessChrome; navigator.webdriver
    # and the other automation tells are left as they are: docs/open-web.md says why).
    user_agent: str | None = None
    # Consent walls (browserpool.consent): "off" (the default: the model sees the wall as a person would),
    # "reject" or "accept": click that button of a standard consent manager before the first screenshot.
    consent: ConsentMode = "off"
    # Page events (refused loads, popups, downloads, dialogs) reported per observation; the rest are counted.
    max_events_per_observation: int = 32
    # Renderer memory watch (0 turns a cap off). A context whose page's JS heap is above context_memory_mib
    # when its episode ends is discarded instead of reused; a browser whose process tree's PSS (sampled every
    # memory_check_s in a thread, and reported in the heartbeats) is above browser_memory_mib is recycled once it
    # has no live episode (the worker reports itself draining meanwhile, so that the pool leases it no new episodes).
    context_memory_mib: int = 512
    browser_memory_mib: int = 8192
    memory_check_s: float = 5.0
    # The in-episode bound (browserpool.renderer_watch; 0: off): every page_memory_check_s, a renderer holding more
    # private resident memory than page_memory_mib is ended and its episode recorded ``page_memory``.
    page_memory_mib: int = 1024
    page_memory_check_s: float = 0.05
    # The shared-memory ring's name; the pool names its workers' rings (browserpool.instance) so that stale
    # ones can be told from live ones. None: a name of the worker's own choosing (hand-started workers).
    shm_name: str | None = None
    # CURVE (tcp endpoints): the engine's public key file and this worker's secret key file; ``insecure``
    # allows tcp without them.
    server_key_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        check_choices(self, "worker config")

    def to_json(self) -> str:
        """The config as the worker's ``--config`` argument (JSON), the engine's own sites exempt in ``net``."""
        from browserpool.netpolicy import with_engine_sites  # here: config stays import-light

        return msgspec.json.encode(replace(self, net=with_engine_sites(self.net))).decode()

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """A config from :meth:`to_json`'s text, each field checked against its type (a :class:`ConfigError`, a
        ``ValueError``, names the field: ``worker config: slot_count: expected an integer, got 'x'``)."""
        try:
            data = msgspec.json.decode(text)
        except msgspec.DecodeError as exc:  # malformed JSON
            raise ConfigError(f"worker config: {exc}") from None
        return config_from(cls, data, "worker config")
