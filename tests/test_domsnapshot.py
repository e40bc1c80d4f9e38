"""DOM snapshot observations: the worker reads each element's box in viewport CSS px and how much of it is visible
(hidden by style, faded to nothing, out of the viewport, inside an iframe's border and padding), Chromium's clickable
mark, and the same ids as the accessibility tree's; a malformed snapshot gives fewer nodes, never an exception. The
tree's lines carry its marks as BrowserGym writes them, and a run records it and the viewer shows it.

Real Chromium through the shared pool (tests/fixtures/dom_boxes.html); the reading's bounds on synthetic replies.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from browserpool.domsnapshot import snapshot_nodes
from browserpool.pool import BrowserPool
from browserpool.protocol import AXNode, BrowserAction, DOMNode
from engine.agent.prompts import AgentConfig
from engine.agent.tree_text import tree_text
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from policy.agent_policy import AgentPolicy
from policy.tree_scripted import TreeScriptedModel
from tests.conftest import open_session, subset, viewer_episode
from viewer.report import build_report


def by_name(nodes: list[DOMNode], tree: dict[int, str], name: str) -> DOMNode:
    """The DOM node whose accessibility-tree node is named ``name``."""
    return next(n for n in nodes if tree.get(n.id) == name)


@pytest.mark.asyncio(loop_scope="session")
async def test_boxes_visibility_and_clickable_marks_as_the_page_lays_them_out(
        pool: BrowserPool, fixture_url: Callable[[str], str]) -> None:
    async with open_session(pool, fixture_url("dom_boxes.html"), axtree=True, dom=True) as (session, obs, _):
        assert obs.dom is not None and obs.axtree is not None and not obs.dom_cut and "dom_ms" in obs.timings_ms
        assert obs.note is None
        dom = {n.id: n for n in obs.dom}
        names = {n.id: n.name for n in obs.axtree if n.id}
        shown = by_name(obs.dom, names, "shown")
        assert (shown.tag, shown.x, shown.y, shown.w, shown.h, shown.visibility) == ("button", 10, 20, 80, 30, 1)
        assert shown.clickable  # a native control
        body = next(n for n in obs.dom if n.tag == "body")
        # The body's elements in document order (the page's markup).
        _, hidden, faded, half, below, plain, listener, iframe = [n for n in obs.dom if n.parent == body.id]
        assert hidden.visibility == 0 and hidden.w == 50  # visibility: hidden keeps its box
        child = next(n for n in obs.dom if n.parent == faded.id)
        assert faded.visibility == 0 and child.visibility == 0 and child.w == 20  # opacity 0 on its parent
        assert half.visibility == 0.5  # half of it past the viewport's right edge (1280 px)
        assert below.visibility == 0 and below.y == 2000
        assert listener.clickable and not plain.clickable  # Chromium's mark: an onclick listener
        # Inside the iframe: its box (100, 300) plus its border (5 px) and padding (7 px); the iframe element is
        # the parent of its document's root.
        inner = by_name(obs.dom, names, "inner button")
        assert (inner.x, inner.y, inner.w, inner.h, inner.visibility) == (132, 342, 100, 40, 1)
        assert iframe.tag == "iframe"
        root = dom[inner.parent]
        while root.tag != "html":
            root = dom[root.parent]
        assert root.parent == iframe.id and obs.dom.index(root) > obs.dom.index(iframe)
        top_root = obs.dom[0]
        assert top_root.tag == "html" and top_root.parent == 0
        # Every element the tree names is in the snapshot under the same id (its documents and text runs are no
        # elements).
        elements = {n.id for n in obs.axtree if n.id and n.role not in ("RootWebArea", "StaticText")}
        assert elements and elements <= set(dom)
        # Scrolled down by 1,500 px: the boxes move with the page, the one below the fold comes into view.
        obs, frame = await session.act(BrowserAction("scroll", direction="down", amount=1500))
        frame.release()
        assert obs.dom is not None
        moved = {n.id: n for n in obs.dom}
        assert moved[below.id].y == 500 and moved[below.id].visibility == 1
        assert moved[shown.id].y == -1480 and moved[shown.id].visibility == 0
        # Asked for once by an episode that did not open with it.
        plain_obs, frame = await session.observe(dom=False, axtree=False)
        frame.release()
        assert plain_obs.dom is None and plain_obs.axtree is None


@pytest.mark.asyncio(loop_scope="session")
async def test_an_episode_opened_without_the_snapshot_can_ask_for_it(
        pool: BrowserPool, fixture_url: Callable[[str], str]) -> None:
    async with open_session(pool, fixture_url("dom_boxes.html"), shot=False) as (session, obs, _):
        assert obs.dom is None
        obs, frame = await session.observe(dom=True)
        frame.release()
        assert obs.dom and any(n.tag == "button" for n in obs.dom) and obs.axtree is None


def _snapshot(count: int) -> dict[str, object]:
    """A captureSnapshot reply of one document: an html element with ``count`` div children, 10 px apart."""
    n = count + 1
    return {"strings": ["HTML", "DIV", "visible", "1"],
            "documents": [{"nodes": {"parentIndex": [-1] + [0] * count, "nodeType": [1] * n,
                                     "nodeName": [0] + [1] * count, "backendNodeId": list(range(1, n + 1))},
                           "layout": {"nodeIndex": list(range(n)), "bounds": [[0, 10 * i, 100, 10] for i in range(n)],
                                      "styles": [[2, 3]] * n},
                           "scrollOffsetX": 0, "scrollOffsetY": 0}]}


def test_a_big_or_malformed_snapshot_is_read_within_its_bounds() -> None:
    nodes, cut = snapshot_nodes(_snapshot(10), 100, (1280, 768))
    assert not cut and len(nodes) == 11 and nodes[3] == DOMNode(id=4, parent=1, tag="div", x=0, y=30, w=100, h=10,
                                                                  visibility=1.0)
    nodes, cut = snapshot_nodes(_snapshot(10_000), 50, (1280, 768))
    assert cut and len(nodes) == 50
    # Garbage where lists and numbers belong, a parent index pointing forward (a cycle), an iframe document whose
    # owner never appears: fewer nodes, no exception.
    broken = _snapshot(3)
    doc = broken["documents"][0]  # type: ignore[index]
    doc["nodes"]["parentIndex"] = [2, 0, 3, "x"]
    doc["layout"]["bounds"][1] = ["a", None]
    doc["layout"]["styles"][2] = [99, -1]
    doc["scrollOffsetY"] = "far"
    broken["documents"].append({"nodes": "nope"})  # type: ignore[union-attr]
    nodes, cut = snapshot_nodes(broken, 100, (1280, 768))
    assert not cut and [n.id for n in nodes] == [1, 3, 4]
    assert snapshot_nodes({"documents": "x", "strings": None}, 10, (1, 1)) == ([], False)
    assert snapshot_nodes({}, 10, (1, 1)) == ([], False)


def test_the_trees_lines_carry_the_snapshots_marks() -> None:
    tree = [AXNode(id=2, depth=0, role="RootWebArea", name="Shop"),
            AXNode(id=31, depth=1, role="searchbox", name="Search", states=["focused"]),
            AXNode(id=40, depth=1, role="link", name="Far", states=["url=http://x/a"]),
            AXNode(id=0, depth=2, role="StaticText", name="text")]
    dom = [DOMNode(id=31, parent=2, tag="input", x=0, y=0, w=10, h=10, visibility=1.0, clickable=True),
           DOMNode(id=40, parent=2, tag="a", x=0, y=900, w=10, h=10, visibility=0.2, clickable=True),
           DOMNode(id=2, parent=0, tag="html", x=0, y=0, w=10, h=10, visibility=0.5)]
    assert tree_text(tree, dom=dom).splitlines() == [
        "[2] RootWebArea 'Shop', visible",
        "\t[31] searchbox 'Search', clickable, visible, focused",
        "\t[40] link 'Far', clickable, url=http://x/a",
        "\t\tStaticText 'text'"]
    assert tree_text(tree) == tree_text(tree, dom=[])  # no snapshot, no marks
    assert AgentConfig(observe=("screenshot", "dom")).dom  # recorded beside the screenshot
    with pytest.raises(ValueError, match="observe axtree or screenshot too"):
        AgentConfig(observe=("dom",), action_format="browsergym")


@pytest.mark.asyncio(loop_scope="session")
async def test_a_run_records_each_steps_snapshot_and_the_viewer_shows_it(
        tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks_file = subset(tmp_path, per_site=1, max_len=6)
    tasks = load_tasks(tasks_file, sites)
    policy = AgentPolicy(TreeScriptedModel(tasks), AgentConfig(observe=("axtree", "dom"), action_format="browsergym"))
    assert policy.dom and policy.axtree
    cfg = RunConfig(tasks=str(tasks_file), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1,
                    telemetry=None, step_caps=(20, 30, 40))
    _, run_dir = await run(cfg, policy, sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == len(tasks) and all(r["status"] == "success" for r in records)
    steps = [s for r in records for s in r["steps"]]
    for s in steps:
        assert s["dom"] and all(len(row) == 9 for row in s["dom"])
        visible = {row[0] for row in s["dom"] if row[7] >= 0.5}
        marked = {int(line.strip()[1:].split("]")[0]) for line in s["axtree"].splitlines()
                  if ", visible" in line and line.strip().startswith("[")}
        assert marked and marked <= visible  # the tree's marks are the snapshot's
    # The viewer shows each step's snapshot, folded, as a table of its elements.
    index = build_report(run_dir)
    async with viewer_episode(index) as page:
        counts = await page.eval_on_selector_all("details.dom table", "ts => ts.map(t => t.rows.length - 1)")
        summary = await page.eval_on_selector("details.dom summary", "s => s.textContent")
    assert counts == [len(s["dom"]) for s in records[0]["steps"]]
    assert summary.startswith(f"{len(records[0]['steps'][0]['dom'])} elements (")
