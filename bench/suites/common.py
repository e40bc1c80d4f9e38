"""What several suites share: the machine's size, the task mix on the bundled and heavy pages, and the facts
recorded about the pages each profile loads."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from bench import ceiling

CORES = max(1, os.cpu_count() or 1)
GiB = 2**30

HEAVY_TASK_PAGES = [("shop.html", "Find the cheapest Kettle in the Bazaar catalogue and add it to the cart"),
                    ("news.html", "Open the most read Science article of The Daily Heavy and report its author"),
                    ("shop.html?cat=Audio", "Which Audio product on Bazaar has the highest rating?"),
                    ("news.html?section=Tech", "How many minutes does the lead Tech story take to read?")]


def write_task_mix(path: Path, heavy: int, seed: int) -> int:
    """The async suite's task file: the bundled tasks plus ``heavy`` tasks on the heavy pages, shuffled (seeded)
    so that every batch mixes sites; returns the number of tasks."""
    from engine.tasks.schema import BUNDLED_TASKS

    rows = [json.loads(line) for line in Path(BUNDLED_TASKS).read_text().splitlines() if line.strip()]
    for i in range(heavy):
        page, text = HEAVY_TASK_PAGES[i % len(HEAVY_TASK_PAGES)]
        rows.append({"task_id": f"heavy-{i:03d}", "task_name": text, "website": "{SITES}/heavy/" + page,
                     "benchmark_name": "webgym-bench-heavy", "domain": "benchmark", "difficulty": 2,
                     "evaluator_reference": [{"id": 1, "description": "benchmark page", "facts": [text]}]})
    random.Random(seed).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def page_profile_facts(base: str, profiles: list[str], per_profile: int | None = None) -> dict[str, Any]:
    """DOM nodes, images (elements and distinct files) and bytes of each profile's pages (the first
    ``per_profile`` of them), as the benchmarks load them: recorded with the results."""
    from playwright.sync_api import sync_playwright

    from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM

    facts: dict[str, Any] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_context(viewport={"width": 1280, "height": 768}).new_page()
        for profile in profiles:
            rows = {}
            for path in ceiling.PROFILES[profile][:per_profile]:
                page.goto(base + path, wait_until="load")
                page.wait_for_timeout(300)
                rows[path] = page.evaluate("""() => ({dom_nodes: document.getElementsByTagName('*').length,
                    images: document.images.length, distinct_images: new Set([...document.images].map(i => i.src)).size,
                    bytes: performance.getEntriesByType('resource').reduce((s, e) => s + e.encodedBodySize, 0)
                           + performance.getEntriesByType('navigation')[0].encodedBodySize})""")
            facts[profile] = rows
        browser.close()
    return facts
