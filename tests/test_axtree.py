"""Accessibility-tree observations and id-based actions: the worker reads Chromium's tree (iframes nested in place,
wrappers pruned, bounded), actions name its elements by id, text agents read it in BrowserGym's conventions, and a
run of the bundled tasks by a stand-in that sees only the tree (no image) solves them.

Real Chromium through the shared pool (tests/fixtures pages); the flattening's bounds on synthetic CDP trees.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from browserpool.axtree import CROSS_SITE, _flatten
from browserpool.pool import BrowserOpError, BrowserPool
from browserpool.protocol import AXNode, BrowserAction, Observation
from engine.agent.actions import AgentAction
from engine.agent.formats import action_format
from engine.agent.policy_api import StepView
from engine.agent.prompts import AgentConfig
from engine.agent.protocol import AgentProtocol
from engine.agent.tree_text import tree_ids, tree_text
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.tasks.schema import Task
from policy.agent_policy import AgentPolicy
from policy.tree_scripted import TreeScriptedModel
from tests.conftest import open_session, openweb_pool, subset, viewer_episode
from tests.openweb import OpenWeb
from viewer.report import build_report

_episodes = iter(range(10**6))


async def observe_tree(pool: BrowserPool, url: str) -> tuple[Any, Observation]:
    session = await pool.lease(f"axtree-{next(_episodes)}")
    obs, frame = await session.open(url, axtree=True)
    frame.release()
    return session, obs


def find(nodes: list[AXNode], role: str, name: str) -> AXNode:
    return next(n for n in nodes if n.role == role and n.name == name)


async def act(session: Any, action: BrowserAction) -> Observation:
    obs, frame = await session.act(action)
    frame.release()
    return obs


# --- the tree as the worker reads it ------------------------------------------------------------------------------

@pytest.mark.asyncio(loop_scope="session")
async def test_the_tree_has_roles_names_values_and_each_iframe_in_place(
        pool: BrowserPool, fixture_url: Callable[[str], str]) -> None:
    session, obs = await observe_tree(pool, fixture_url("som_iframe.html"))
    try:
        nodes = obs.axtree
        assert nodes is not None and not obs.axtree_cut and "axtree_ms" in obs.timings_ms
        assert nodes[0].role == "RootWebArea" and nodes[0].name == "som iframe" and nodes[0].depth == 0
        frame = find(nodes, "Iframe", "")
        inner = find(nodes, "button", "inner button")
        # The frame's document comes right under its iframe element, one level deeper.
        assert nodes.index(inner) > nodes.index(frame) and inner.depth > frame.depth + 1
        fruit = next(n for n in nodes if n.role == "combobox")
        assert fruit.value == "Apple" and "expanded=False" in fruit.states
        assert [n.name for n in nodes if n.role == "option"] == ["Apple", "Banana", "Cherry"]
        assert not [n for n in nodes if n.role in ("InlineTextBox", "generic") and not n.name]  # pruned
        ids = [n.id for n in nodes if n.id]
        assert len(ids) == len(set(ids))
        # The element below the iframe's fold is clicked by id: scrolled into view inside its frame first.
        below = find(nodes, "button", "below the fold")
        clicked = await act(session, BrowserAction("click", node=below.id))
        assert clicked.point is not None and 150 <= clicked.point[1] <= 362  # within the iframe's box
    finally:
        await session.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_actions_name_elements_by_id_and_a_stale_id_is_refused(
        pool: BrowserPool, fixture_url: Callable[[str], str]) -> None:
    session, obs = await observe_tree(pool, fixture_url("select.html"))
    try:
        fruit = next(n for n in obs.axtree or [] if n.role == "combobox")
        picked = await act(session, BrowserAction("select", node=fruit.id, text="Cherry"))
        assert any(n.role == "StaticText" and n.name == "picked cherry" for n in picked.axtree or [])
        with pytest.raises(BrowserOpError, match=r"element 999999: .*last observation's tree") as err:
            await act(session, BrowserAction("click", node=999999))
        assert err.value.kind == "refused"
        # The episode goes on: fill a field by id, then submit it with Enter pressed in it.
        form = await session.act(BrowserAction("navigate", url=fixture_url("form.html")))
        form[1].release()
        fields = [n for n in form[0].axtree or [] if n.role == "textbox"]
        assert [f.value for f in fields] == ["old text", "abc"]
        await act(session, BrowserAction("type", node=fields[0].id, text="tree", clear=True, enter=False))
        sent = await act(session, BrowserAction("key", node=fields[0].id, keys="Enter"))
        assert sent.url.endswith("/_test/echo?q=tree")
        back = await act(session, BrowserAction("go_back"))
        assert back.url.endswith("form.html")
        forward = await act(session, BrowserAction("go_forward"))
        assert forward.url.endswith("/_test/echo?q=tree")
    finally:
        await session.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_an_input_is_listed_with_its_type_as_the_original_writes_it(
        pool: BrowserPool, fixture_url: Callable[[str], str]) -> None:
    session = await pool.lease(f"axtree-{next(_episodes)}")
    try:
        obs, frame = await session.open(fixture_url("som_names.html"), som=True)
        frame.release()
        tags = {e[1] for e in obs.elements or []}
        assert {"input, type=submit", "input, type=password", "input"} <= tags, tags
    finally:
        await session.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_a_hybrid_episodes_marks_carry_the_trees_ids(pool: BrowserPool,
                                                          fixture_url: Callable[[str], str]) -> None:
    session = await pool.lease(f"axtree-{next(_episodes)}")
    try:
        plain, frame = await session.open(fixture_url("som_collect.html"), som=True)
        frame.release()
        obs, frame = await session.open(fixture_url("som_collect.html"), som=True, axtree=True)
        with frame:
            assert frame.view[:2] == b"\xff\xd8"
        marks, tree = obs.elements or [], obs.axtree or []
        # The same elements, boxes and tags as the plain pass; their ids are the tree's.
        assert [e[1:] for e in marks] == [e[1:] for e in plain.elements or []] and marks
        assert [e[0] for e in plain.elements or []] == list(range(1, len(marks) + 1))
        ids = {n.id for n in tree}
        # The controls are in the tree under the same ids (a nameless div with an onclick is pruned from the tree:
        # its mark keeps its own id, which the id-based format accepts too: below).
        controls = [e for e in marks if e[1].split(",")[0] in ("a", "button", "input", "select", "textarea")]
        assert len(controls) >= 5 and all(e[0] in ids for e in controls), (marks, tree_text(tree))
        assert len({e[0] for e in marks}) == len(marks)
        # One id names the element in both: a click by the mark's id is a click on that element's box.
        first = marks[0]
        clicked = await act(session, BrowserAction("click", node=first[0]))
        x, y, w, h = first[3:]
        assert clicked.point is not None and x <= clicked.point[0] <= x + w and y <= clicked.point[1] <= y + h
    finally:
        await session.close()
    hybrid = AgentProtocol(AgentConfig(interaction="som", observe=("screenshot", "axtree"),
                                       action_format="browsergym"))
    view = StepView("u", "t", b"", 1280, 768, True, None, [[9999, "div", "box", 0, 0, 10, 10]], axtree=list(TREE))
    assert hybrid.read("click('9999')", view).action == AgentAction("left_click", node=9999)  # a mark, not in the tree


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def web_pool(openweb: OpenWeb) -> AsyncIterator[BrowserPool]:
    """A worker with the default browser (the headless shell) that reaches the local open web's named hosts."""
    async with openweb_pool(openweb) as p:
        yield p


@pytest.mark.asyncio(loop_scope="session")
async def test_a_cross_site_frame_is_read_and_acted_on_in_the_default_browser(
        web_pool: BrowserPool, openweb: OpenWeb) -> None:
    # The headless shell keeps a cross-site iframe in the tab's renderer (no strict site isolation): its document
    # is in the tree and the snapshot like a same-site frame's, under the top page's ids.
    url = openweb.url("shop.test", "/framed?src=" + openweb.url("news.test", "/changing"))
    async with open_session(web_pool, url, axtree=True, dom=True) as (session, obs, _):
        nodes = obs.axtree or []
        frame = find(nodes, "Iframe", "")
        link = find(nodes, "link", "next")
        assert nodes.index(link) > nodes.index(frame) and link.depth > frame.depth
        assert not [n for n in nodes if CROSS_SITE in n.states]
        box = next(e for e in obs.dom or [] if e.tag == "iframe")
        inner = next(e for e in obs.dom or [] if e.id == link.id)  # the snapshot holds the frame's elements too
        assert box.x <= inner.x and box.y <= inner.y + inner.h <= box.y + box.h
        before = openweb.hits["news.test"]
        clicked = await act(session, BrowserAction("click", node=link.id))
        assert clicked.point is not None and box.y <= clicked.point[1] <= box.y + box.h
        assert openweb.hits["news.test"] > before  # the frame followed its link


def _cdp_node(node_id: int, role: str, name: str = "", children: tuple[int, ...] = (), backend: int | None = None,
              **extra: Any) -> dict[str, Any]:
    return {"nodeId": str(node_id), "role": {"value": role}, "name": {"value": name},
            "childIds": [str(c) for c in children], "backendDOMNodeId": backend or node_id, **extra}


def test_a_deep_or_huge_or_cyclic_tree_is_flattened_within_its_bounds() -> None:
    # 20,000 nested groups with names (no recursion limit), then a cap on the nodes kept.
    deep = [_cdp_node(i, "group", f"g{i}", (i + 1,)) for i in range(1, 20_000)] + [_cdp_node(20_000, "button", "x")]
    t0 = time.perf_counter()
    nodes, cut = _flatten(deep, {}, set(), 100_000, 50)
    assert not cut and len(nodes) == 20_000 and nodes[-1].depth == 19_999 and time.perf_counter() - t0 < 2
    assert tree_text(nodes[-3:]).count("\t") < 200  # the text's indentation is capped
    nodes, cut = _flatten(deep, {}, set(), 10, 50)
    assert cut and len(nodes) == 10
    # A malformed tree whose nodes are each other's children ends.
    cyclic = [_cdp_node(1, "button", "a", (2,)), _cdp_node(2, "button", "b", (1,))]
    assert [n.name for n in _flatten(cyclic, {}, set(), 10, 50)[0]] == ["a", "b"]
    # Wrappers without a name give their place to their children; a link's own text is not repeated.
    wrapped = [_cdp_node(1, "RootWebArea", "page", (2,)), _cdp_node(2, "generic", "", (3,)),
               _cdp_node(3, "link", "Cart (0)", (4, 5)), _cdp_node(4, "StaticText", "Cart"),
               _cdp_node(5, "StaticText", "x" * 80), _cdp_node(6, "button", "ignored", ignored=True)]
    nodes, _ = _flatten(wrapped, {}, {3}, 10, 20)
    assert [(n.role, n.depth) for n in nodes] == [("RootWebArea", 0), ("link", 1), ("StaticText", 2)]
    assert len(nodes[2].name) == 20 and nodes[2].name.endswith("\u2026") and CROSS_SITE in nodes[1].states


# --- the tree in the agent's prompt and reply ---------------------------------------------------------------------

TREE = [AXNode(id=2, depth=0, role="RootWebArea", name="Maple Market", states=["focused"]),
        AXNode(id=31, depth=1, role="searchbox", name="Search products"),
        AXNode(id=40, depth=1, role="link", name="It's here", states=["url=http://x/a"]),
        AXNode(id=0, depth=2, role="StaticText", name="no element")]


def test_the_tree_reads_as_browsergyms_agents_read_it() -> None:
    assert tree_text(TREE, cut=True).splitlines() == [
        "[2] RootWebArea 'Maple Market', focused",
        "\t[31] searchbox 'Search products'",
        "\t[40] link 'It\\'s here', url=http://x/a",
        "\t\tStaticText 'no element'",
        "(the tree was cut at the worker's node cap: the page has more)"]
    assert tree_ids(TREE) == frozenset({2, 31, 40})


IDS = tree_ids(TREE)
BROWSERGYM_CORPUS = [
    ("The search box is [31].\n```\nfill('31', 'mug')\n```", AgentAction("type", node=31, text="mug", enter=False),
     None),
    ("click('40')", AgentAction("left_click", node=40), None),
    ("```python\nclick(\"[40]\", button='left')\n```", AgentAction("left_click", node=40), None),
    ("dblclick('a40')", AgentAction("left_click", node=40), None),
    ("press('31', 'Enter')", AgentAction("keypress", node=31, keys="Enter"), None),
    ("select_option('31', ['Blue', 'Red'])", AgentAction("select", node=31, text="Blue"), None),
    ("scroll(0, -300)", AgentAction("scroll", direction="up"), None),
    ("goto('example.com')", AgentAction("navigate", url="https://example.com"), None),
    ("go_forward()", AgentAction("go_forward"), None),
    ("send_msg_to_user('SPRING10')", AgentAction("answer", text="SPRING10"), None),
    ("noop(500)", AgentAction("wait", seconds=0.5), None),
    ("click('77')", AgentAction("wait"), "no element [77] in the page's tree"),
    ("click(__import__('os').system('x'))", AgentAction("wait"), "arguments must be literals"),
    ("new_tab()", AgentAction("wait"), "no action in reply"),
    ("scroll(0, 0)", AgentAction("wait"), "only vertical scrolling"),
]


@pytest.mark.parametrize(("text", "expected", "error"), BROWSERGYM_CORPUS,
                         ids=[t[:30] for t, _, _ in BROWSERGYM_CORPUS])
def test_browsergym_replies(text: str, expected: AgentAction, error: str | None) -> None:
    action, info = action_format("browsergym").read(text, AgentProtocol().coord_frame(_view()), None, IDS)
    assert action == expected, info
    assert (info["error"] is None) if error is None else (error in info["error"]), info["error"]


def _view(jpeg: bytes | None = b"\xff\xd8", frame: str | None = "frames/0.jpg") -> StepView:
    return StepView("http://x/", "Maple", jpeg, 1280, 768, True, frame, axtree=list(TREE))


def test_a_text_only_prompt_has_no_image_and_a_hybrid_one_has_both() -> None:
    task = Task(task_id="t", task_name="Find the code", website="http://x/")
    text_only = AgentProtocol(AgentConfig(observe=("axtree",), action_format="browsergym"))
    messages, images = text_only.messages(task, [_view(None, "frames/0.jpg")], _view(None, "frames/1.jpg"))
    parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"]]
    assert not images and all(p["type"] == "text" for p in parts)
    assert "\t[31] searchbox 'Search products'" in parts[-1]["text"]
    assert "screenshot" not in messages[0]["content"]
    assert json.dumps(messages).count("[31] searchbox") == 1  # the tree of the page now only
    hybrid = AgentProtocol(AgentConfig(observe=("screenshot", "axtree"), action_format="browsergym"))
    messages, images = hybrid.messages(task, [], _view())
    assert list(images) == ["frames/0.jpg"] and "screenshot" in messages[0]["content"]
    assert [p["type"] for p in messages[-1]["content"]] == ["text", "text", "image", "text"]
    with pytest.raises(ValueError, match="observe axtree too"):
        AgentConfig(action_format="browsergym")
    with pytest.raises(ValueError, match="needs it"):
        AgentConfig(observe=("axtree",))


# --- a run of the bundled tasks from the tree alone ---------------------------------------------------------------

@pytest.mark.asyncio(loop_scope="session")
async def test_a_stand_in_reading_only_the_tree_solves_the_bundled_tasks(
        tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks_file = subset(tmp_path, per_site=3, max_len=12)
    tasks = load_tasks(tasks_file, sites)
    agent = AgentConfig(observe=("axtree",), action_format="browsergym")
    policy = AgentPolicy(TreeScriptedModel(tasks), agent)
    assert policy.axtree and not policy.reads_pixels
    # Each typed text a text agent submits is one more step (fill, then press Enter): caps with room for it.
    cfg = RunConfig(tasks=str(tasks_file), output_dir=str(tmp_path / "runs"), concurrency=6, workers=1,
                    telemetry=None, step_caps=(20, 30, 40))
    _, run_dir = await run(cfg, policy, sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == len(tasks) >= 12
    assert [r["task"]["task_id"] for r in records if r["status"] != "success"] == []
    steps = [s for r in records for s in r["steps"]]
    assert all("[" in s["axtree"] and s["parse_error"] is None for s in steps)
    assert {s["action"]["name"] for s in steps} >= {"left_click", "type", "keypress", "answer"}
    acted = [s for s in steps if s["action"]["name"] in ("left_click", "type", "keypress", "select")]
    assert acted and all(s["action"]["node"] and f"[{s['action']['node']}] " in s["axtree"] for s in acted)
    for s in steps:  # the prompt as sent: text only, the tree of the page the step acted on
        parts = [p for m in s["messages"] if isinstance(m["content"], list) for p in m["content"]]
        assert all(p["type"] == "text" for p in parts) and s["axtree"] in parts[-1]["text"]
    # The viewer shows each step's tree (folded) beside its screenshot.
    index = build_report(run_dir)
    async with viewer_episode(index) as page:
        shown = await page.eval_on_selector_all("details.axtree pre", "ps => ps.map(p => p.textContent)")
    assert shown == [s["axtree"] for s in records[0]["steps"]]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_tiny_text_only_model_runs_on_the_tree_and_its_sequences_rebuild_exactly(
        tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    pytest.importorskip("torch")
    from engine.agent.model_api import SamplingParams
    from engine.clients.service import RolloutService
    from engine.tasks.schema import StepCaps
    from policy.registry import BackendConfig, make_policy
    from policy.tiny_models import build_tiny_model
    from train.samples import Processing, build_samples

    model_dir = build_tiny_model(tmp_path / "qwen2", "qwen2")
    assert not (model_dir / "preprocessor_config.json").exists()  # no image processor: a text-only model
    tasks = load_tasks(subset(tmp_path, per_site=1), sites, step_caps=StepCaps(train=(2, 2, 2)))[:2]
    agent = AgentConfig(observe=("axtree",), action_format="browsergym", window=1)
    policy = make_policy("hf", agent=agent, sampling=SamplingParams(max_tokens=8, seed=0),
                         backend=BackendConfig(model=str(model_dir), device="cpu", max_batch=2))
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    async with RolloutService(cfg, base_url=sites, pool=pool) as service:
        records = await service.gather(service.submit(tasks, policy))
        assert service.run_dir is not None
        run_dir = service.run_dir
    assert len(records) == 2 and not [r for r in records if r["status"] == "error"]
    steps = [s for r in records for s in r["steps"]]
    assert steps and all(s["token_ids"] and s["axtree"] for s in steps)  # random text: mostly waits
    assert all(p["type"] == "text" for s in steps for m in s["messages"] if isinstance(m["content"], list)
               for p in m["content"])
    # The trainer rebuilds every step's exact prompt (its sha256 equals the recorded one), with no image in it.
    result = build_samples([run_dir], Processing.load(model_dir), on_mismatch="raise")
    assert len(result) == len(steps) == result.prompts_checked
    assert all(not s.images for s in result.samples)
