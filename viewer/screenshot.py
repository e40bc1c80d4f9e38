"""PNG screenshots of a run's report (for the README): the index and one episode page.

``python -m viewer.screenshot RUN_DIR [OUT_DIR]`` builds the report, opens it in the project's headless
Chromium and writes OUT_DIR/viewer-index.png and OUT_DIR/viewer-episode.png (OUT_DIR defaults to docs/).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from playwright.async_api import async_playwright

from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM
from engine.store.records import EpisodeRecord
from engine.store.run_dir import read_records
from viewer.report import build_report


def showcase_episode(records: list[EpisodeRecord]) -> int:
    """The episode whose page shows the most: a success with the most kinds of page actions, then steps."""
    def score(r: EpisodeRecord) -> tuple[bool, int, int]:
        names = [s.get("action", {}).get("name") for s in r.get("steps", [])]
        acting = [n for n in names if n not in ("answer", "wait")]
        return r.get("status") == "success", len(set(acting)), len(acting)
    return max(range(len(records)), key=lambda n: (*score(records[n]), -n)) if records else 0


async def export_screenshots(run_dir: str | Path, out_dir: str | Path, chromium: str = DEFAULT_CHROMIUM
                             ) -> tuple[Path, Path]:
    """Write viewer-index.png and viewer-episode.png into ``out_dir``; returns their paths."""
    index = build_report(run_dir).resolve()
    n = showcase_episode(read_records(run_dir))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "viewer-index.png", out / "viewer-episode.png"
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(index.as_uri())
            await page.wait_for_selector("body[data-loaded='1']")
            await page.screenshot(path=str(paths[0]))
            await page.goto(index.with_name("episode.html").as_uri() + f"#{n}")
            await page.wait_for_selector(f"body[data-loaded='{n}']")
            # Tall enough for the header, the rubric and the first step with its marker.
            await page.set_viewport_size({"width": 1400, "height": 1250})
            await page.evaluate("Promise.all([...document.images].map(i => i.decode().catch(() => 0)))")
            await page.screenshot(path=str(paths[1]))
        finally:
            await browser.close()
    return paths


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m viewer.screenshot RUN_DIR [OUT_DIR]")
    for path in asyncio.run(export_screenshots(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "docs")):
        print(path)
