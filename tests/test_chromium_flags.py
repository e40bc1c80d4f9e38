"""The workers' Chromium gets every feature switch it is given: Playwright's lists and the engine's, merged.

Chromium keeps only the last value of a repeated ``--disable-features`` (or ``--enable-features``), and Playwright
puts the caller's flags after its own. Before, the engine's ``--disable-features`` silently dropped Playwright's
list (``PaintHolding``, ``HttpsUpgrades``, ...). The engine leaves one of Playwright's on, on purpose
(``ENGINE_KEEPS_ON``: third-party storage partitioning). The test reads the command line
of a real browser process launched as the workers launch it, so a Playwright release that changes its lists fails
here, naming what it added.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psutil
import pytest
from playwright.sync_api import sync_playwright

from browserpool.config import (
    CHROMIUM_FLAGS,
    DEFAULT_CHROMIUM,
    ENGINE_DISABLED_FEATURES,
    ENGINE_KEEPS_ON,
    launch_flags,
)


def browser_command_line(flags: list[str]) -> list[str]:
    """The command line of the browser process Playwright starts with ``flags`` (the workers' launch call)."""
    def browsers() -> dict[int, list[str]]:  # this process's Chromium browser processes (not their renderers)
        found = {}
        for p in psutil.Process(os.getpid()).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                line = p.cmdline()
                if line[:1] == [DEFAULT_CHROMIUM] and not any(a.startswith("--type=") for a in line):
                    found[p.pid] = line
        return found

    before = browsers()  # another test's, in this process
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=flags, headless=True)
        try:
            lines = [line for pid, line in browsers().items() if pid not in before]
        finally:
            browser.close()
    assert len(lines) == 1, lines
    return lines[0]


def values(command_line: list[str], switch: str) -> Iterator[list[str]]:
    """Each value of ``switch`` on ``command_line``, in order, as its list of names."""
    for arg in command_line:
        name, eq, value = arg.partition("=")
        if eq and name == switch:
            yield [v for v in value.split(",") if v]


@pytest.mark.parametrize("switch", ["--disable-features", "--enable-features"])
def test_the_value_chromium_keeps_holds_every_name_any_switch_gave(switch: str) -> None:
    given = launch_flags([*CHROMIUM_FLAGS, "--disable-features=BackForwardCache", "--enable-features=NetworkService"])
    seen = list(values(browser_command_line(given), switch))
    assert len(seen) >= 2, seen  # Playwright's own switch, then ours
    kept, every = seen[-1], {name for value in seen for name in value}
    dropped = every - set(kept) - (set(ENGINE_KEEPS_ON) if switch == "--disable-features" else set())
    assert not dropped, f"dropped by the last {switch}: {sorted(dropped)}"


def test_the_workers_flags_turn_off_the_engines_features_and_playwrights() -> None:
    [kept] = list(values(launch_flags(CHROMIUM_FLAGS), "--disable-features"))
    assert {"PaintHolding", "HttpsUpgrades", *ENGINE_DISABLED_FEATURES} <= set(kept)
    assert not set(ENGINE_KEEPS_ON) & set(kept)  # third-party storage stays partitioned, as on the web
    assert launch_flags(launch_flags(CHROMIUM_FLAGS)) == launch_flags(CHROMIUM_FLAGS)  # merging twice changes nothing
