"""Write each reference step's target as the accessibility tree names it into a task file.

A reference solution names its targets by CSS selector, which a text agent never sees. This replays every task's
solution in Chromium and, before each step that has a target, finds the target in the page's accessibility tree as
the worker reads it (``browserpool.axtree``): its role, its name and how many nodes of that role and name come
before it. The step gains ``"tree": [role, name, nth]``, which the tree-reading stand-in
(``policy.tree_scripted``) looks up in the tree text it is shown.

    python scripts/tree_targets.py engine/sites/tasks.jsonl

Re-run it when a bundled site or a solution changes; it rewrites the file in place and says which targets it could
not find (none, for the bundled tasks).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from playwright.async_api import CDPSession, Page, async_playwright

from browserpool.axtree import read_axtree
from browserpool.config import DEFAULT_CHROMIUM, WorkerConfig
from engine.sites.server import SiteServer
from engine.tasks.schema import SITES_PLACEHOLDER

# The first visible element that matches the selector (as the scripted policy's locate picks it).
_FIRST_VISIBLE = """(() => {
  for (const el of document.querySelectorAll(%s)) {
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    if (r.width >= 1 && r.height >= 1 && s.visibility !== 'hidden' && s.display !== 'none') return el;
  }
  return null;
})()"""


async def _backend_id(cdp: CDPSession, selector: str) -> int | None:
    for _ in range(50):  # the scripted policy waits for a target too
        res = await cdp.send("Runtime.evaluate", {"expression": _FIRST_VISIBLE % json.dumps(selector)})
        object_id = res.get("result", {}).get("objectId")
        if object_id:
            node = await cdp.send("DOM.describeNode", {"objectId": object_id})
            return int(node["node"]["backendNodeId"])
        await asyncio.sleep(0.1)
    return None


async def _tree_target(cdp: CDPSession, backend: int, cfg: WorkerConfig) -> list[Any] | None:
    nodes, _cut = await read_axtree(cdp, cfg.axtree_max_nodes, cfg.axtree_text_chars)
    for i, node in enumerate(nodes):
        if node.id == backend:
            nth = sum(1 for n in nodes[:i] if n.role == node.role and n.name == node.name)
            return [node.role, node.name, nth]
    return None


async def _act(page: Page, step: dict[str, Any]) -> None:
    kind, target = step["action"], step.get("target")
    handle = await page.wait_for_selector(target, state="visible") if target else None
    if kind == "click" and handle:
        await handle.click()
    elif kind == "type" and handle:
        if step.get("clear", True):
            await handle.fill(step.get("text", ""))
        else:
            await handle.type(step.get("text", ""))
        if step.get("enter", True):
            await page.keyboard.press("Enter")
    elif kind == "go_back":
        await page.go_back()
    await page.wait_for_load_state("load")
    await page.wait_for_timeout(150)  # the bundled pages' scripts render on load: let them


async def annotate(path: Path) -> int:
    cfg = WorkerConfig(endpoint="")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    missing = 0
    with SiteServer() as sites:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=["--no-sandbox"])
            for rec in records:
                context = await browser.new_context(viewport={"width": cfg.viewport_width,
                                                              "height": cfg.viewport_height})
                page = await context.new_page()
                cdp = await context.new_cdp_session(page)
                await page.goto(rec["website"].replace(SITES_PLACEHOLDER, sites.base_url))
                await page.wait_for_timeout(150)
                for step in rec.get("reference_solution", []):
                    step.pop("tree", None)
                    if step.get("target") and step["action"] in ("click", "type"):
                        backend = await _backend_id(cdp, step["target"])
                        found = await _tree_target(cdp, backend, cfg) if backend is not None else None
                        if found is None:
                            missing += 1
                            print(f"{rec['task_id']}: {step['target']} not in the tree", file=sys.stderr)
                        else:
                            step["tree"] = found
                    if step["action"] == "answer":
                        break
                    await _act(page, step)
                await context.close()
            await browser.close()
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return missing


if __name__ == "__main__":
    sys.exit(1 if asyncio.run(annotate(Path(sys.argv[1]))) else 0)
