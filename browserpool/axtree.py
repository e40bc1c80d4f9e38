"""The page's accessibility tree as an observation: Chromium's own tree (CDP ``Accessibility.getFullAXTree``) of
every frame of the tab, nested where each iframe stands, pruned to what an agent reads and bounded in size.

Each kept node becomes one :class:`~browserpool.protocol.AXNode`: its id, depth, role, name, value and states. The
id is Chromium's backend node id of the node's DOM element: stable while the document lives, and what an action
names to act on the element (``BrowserAction.node``: the worker scrolls it into view and acts at its centre), so no
attribute is written into the page. Pruned: nodes Chromium marks ignored, nameless ``generic``/``none`` wrappers
(their children take their place), inline text boxes, and a text run that only repeats a part of its parent's name
(a link's own text).

Cross-site iframes are read like the others under the workers' headless shell, which keeps them in the tab's
renderer. A browser that isolates sites (the full Chromium) renders them in a renderer of their own, which this
session does not reach: their node stays, with the state ``cross-site frame not read``. Shadow roots are part of
Chromium's tree already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

from playwright.async_api import CDPSession
from playwright.async_api import Error as PlaywrightError

from browserpool.protocol import AXNode

# Roles whose nameless nodes are only wrappers: their children are listed in their place.
_WRAPPERS = frozenset({"generic", "none", "presentation", "group", "LayoutTable", "LayoutTableRow",
                       "LayoutTableCell", "Section", "strong", "emphasis", "mark", "subscript", "superscript",
                       "Abbr", "time"})
_SKIPPED_ROLES = frozenset({"InlineTextBox", "LineBreak"})
# Node properties shown as states: boolean ones by name when true, the others as name=value.
_FLAGS = ("focused", "disabled", "required", "readonly", "multiselectable", "modal", "editable")
_VALUED = ("checked", "pressed", "expanded", "selected", "level", "hasPopup", "invalid", "autocomplete",
           "valuemin", "valuemax", "url")
CROSS_SITE = "cross-site frame not read"


async def read_axtree(cdp: CDPSession, max_nodes: int, text_chars: int) -> tuple[list[AXNode], bool]:
    """The tab's tree as at most ``max_nodes`` nodes (names and values cut to ``text_chars``), and whether it was cut.
    Raises PlaywrightError when the document goes away meanwhile."""
    frames = (await cdp.send("Page.getFrameTree"))["frameTree"]
    top = await cdp.send("Accessibility.getFullAXTree")
    children: dict[int, list[dict[str, Any]]] = {}  # iframe element's backend id -> its frame's nodes
    unread: set[int] = set()
    child_frames = list(_child_frames(frames))
    if child_frames:
        owners = await asyncio.gather(*(cdp.send("DOM.getFrameOwner", {"frameId": f}) for f in child_frames),
                                      return_exceptions=True)
        trees = await asyncio.gather(*(cdp.send("Accessibility.getFullAXTree", {"frameId": f})
                                       for f in child_frames), return_exceptions=True)
        for owner, tree in zip(owners, trees, strict=True):
            if isinstance(owner, BaseException):
                if not isinstance(owner, PlaywrightError):
                    raise owner
                continue
            backend = owner.get("backendNodeId")
            if type(backend) is not int:
                continue
            if isinstance(tree, PlaywrightError) or not isinstance(tree, Mapping):
                unread.add(backend)  # an out-of-process (cross-site) frame: not on this session
            else:
                children[backend] = list(tree.get("nodes", []))
    return _flatten(top.get("nodes", []), children, unread, max_nodes, text_chars)


def _child_frames(tree: Mapping[str, Any]) -> Iterator[str]:
    stack = list(tree.get("childFrames", []))
    while stack:
        frame = stack.pop()
        yield frame["frame"]["id"]
        stack.extend(frame.get("childFrames", []))


def _flatten(nodes: list[dict[str, Any]], frames: dict[int, list[dict[str, Any]]], unread: set[int],
             max_nodes: int, text_chars: int) -> tuple[list[AXNode], bool]:
    """Depth-first, without recursion (a page can nest its DOM thousands deep)."""
    out: list[AXNode] = []
    # Work items: (node, depth, the parent's name, the node table it belongs to).
    stack: list[tuple[dict[str, Any], int, str, dict[str, dict[str, Any]]]] = []

    def push_roots(table_nodes: list[dict[str, Any]], depth: int, parent_name: str) -> None:
        table = {str(n.get("nodeId")): n for n in table_nodes}
        roots = [n for n in table_nodes if not n.get("parentId") or str(n.get("parentId")) not in table]
        stack.extend((r, depth, parent_name, table) for r in reversed(roots[:1]))

    push_roots(nodes, 0, "")
    seen: set[int] = set()  # node objects already walked: a malformed tree with a cycle ends
    while stack:
        node, depth, parent_name, table = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        role = _text(node.get("role"))
        name = _text(node.get("name"))
        backend = node.get("backendDOMNodeId")
        backend = backend if type(backend) is int and backend > 0 else 0
        kept = not (node.get("ignored") or role in _SKIPPED_ROLES or (role in _WRAPPERS and not name)
                    or (role == "StaticText" and name in parent_name))
        child_depth, child_parent = depth, parent_name
        if kept:
            if len(out) >= max_nodes:
                return out, True
            states = _states(node, text_chars)
            if backend in unread:
                states.append(CROSS_SITE)
            out.append(AXNode(id=backend, depth=depth, role=role[:64], name=_cut(name, text_chars),
                              value=_cut(_text(node.get("value")), text_chars), states=states))
            child_depth, child_parent = depth + 1, name
        if backend in frames:  # an iframe: its document's tree in its place
            push_roots(frames.pop(backend), child_depth, child_parent)
        kids = [table[str(c)] for c in node.get("childIds", []) if str(c) in table]
        stack.extend((k, child_depth, child_parent, table) for k in reversed(kids))
    return out, False


def _text(field: Any) -> str:
    """A CDP AXValue's value as text ("" when absent)."""
    if not isinstance(field, Mapping):
        return ""
    value = field.get("value")
    return "" if value is None else " ".join(str(value).split())


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "\u2026"


def _states(node: Mapping[str, Any], text_chars: int) -> list[str]:
    props = {p.get("name"): (p.get("value") or {}).get("value") for p in node.get("properties", [])
             if isinstance(p, Mapping)}
    states = [flag for flag in _FLAGS if props.get(flag) is True]
    for name in _VALUED:
        value = props.get(name)
        if value is None or value == "" or (name == "invalid" and value == "false"):
            continue
        states.append(f"{name}={_cut(str(value), text_chars)}")
    return states
