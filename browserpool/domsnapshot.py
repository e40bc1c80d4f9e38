"""The page's elements with their boxes and visibility, from Chromium's DOM snapshot (CDP
``DOMSnapshot.captureSnapshot``): one call that returns every same-process document of the tab, its layout and the
computed styles asked for, without running a script in the page.

Each element that has a layout box becomes one :class:`~browserpool.protocol.DOMNode`, in document order (an
iframe's elements after the iframe's own node): its id (Chromium's backend node id, the same id the accessibility
tree gives it and that actions accept), its parent element's id, its tag, its box in viewport CSS px and how much of
it is visible, 0 to 1: the part of the box inside the viewport (and inside its iframe's box), 0 when its computed
``visibility`` is not ``visible`` or it or an ancestor has ``opacity: 0``. What the snapshot cannot see is not
counted: an element covered by another, or clipped by an ancestor's ``overflow``, still counts as visible.
``clickable``: Chromium's own mark (a click listener, a link) or a native control (a button, a form field, a
``<summary>``).

Cross-site iframes are in it under the workers' headless shell, which keeps them in the tab's renderer; a browser
that isolates sites (the full Chromium) renders them in a renderer of their own, and there they are not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playwright.async_api import CDPSession

from browserpool.protocol import DOMNode

# The computed styles read per layout object, in this order (their values come back as string-table indices).
_STYLES = ("visibility", "opacity", "border-left-width", "border-top-width", "padding-left", "padding-top")
_ELEMENT = 1  # DOM nodeType of an element
# Elements a click acts on without any listener of the page's (Chromium marks only listeners and links).
_CONTROLS = frozenset({"button", "input", "select", "textarea", "summary", "option", "label"})


@dataclass(frozen=True, slots=True)
class _Frame:
    """Where a document's (0, 0) lies in the viewport, and the box its elements are clipped to."""

    dx: float
    dy: float
    clip: tuple[float, float, float, float]  # x0, y0, x1, y1 in viewport CSS px
    hidden: bool  # the iframe that holds it is invisible
    owner: int  # the id of the iframe element that holds it (0: the top document)


async def read_dom(cdp: CDPSession, max_nodes: int, viewport: tuple[int, int]) -> tuple[list[DOMNode], bool]:
    """The tab's elements as at most ``max_nodes`` nodes, and whether they were cut. ``viewport``: its size in CSS px.
    Raises PlaywrightError when the document goes away meanwhile."""
    snap = await cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": list(_STYLES)})
    return snapshot_nodes(snap, max_nodes, viewport)


def snapshot_nodes(snap: Mapping[str, Any], max_nodes: int, viewport: tuple[int, int]
                   ) -> tuple[list[DOMNode], bool]:
    """The elements of a ``captureSnapshot`` reply (see :func:`read_dom`). A malformed reply gives fewer nodes, never
    an exception."""
    strings = [s if isinstance(s, str) else "" for s in _list(snap.get("strings"))]
    documents = [d for d in _list(snap.get("documents")) if isinstance(d, Mapping)]
    frames = {0: _Frame(0.0, 0.0, (0.0, 0.0, float(viewport[0]), float(viewport[1])), False, 0)}
    out: list[DOMNode] = []
    # Documents come in document order (the top one first, each iframe's after the one that holds it), so a
    # document's frame is known before its own elements are read.
    for index, doc in enumerate(documents):
        frame = frames.get(index)
        if frame is None:  # a document whose owner was not seen (a malformed reply): its boxes mean nothing
            continue
        if _read_document(doc, strings, frame, frames, out, max_nodes):
            return out, True
    return out, False


def _read_document(doc: Mapping[str, Any], strings: list[str], frame: _Frame, frames: dict[int, _Frame],
                   out: list[DOMNode], max_nodes: int) -> bool:
    """Appends the document's elements to ``out``; True when ``max_nodes`` cut them."""
    nodes, layout = _mapping(doc.get("nodes")), _mapping(doc.get("layout"))
    parents, types = _list(nodes.get("parentIndex")), _list(nodes.get("nodeType"))
    names, backends = _list(nodes.get("nodeName")), _list(nodes.get("backendNodeId"))
    clickable = set(_rare_indices(nodes.get("isClickable")))
    content_docs = dict(_rare_values(nodes.get("contentDocumentIndex")))
    boxes: dict[int, tuple[Sequence[Any], Sequence[Any]]] = {}  # node index -> (bounds, styles): its first box
    for node_index, bounds, styles in zip(_list(layout.get("nodeIndex")), _list(layout.get("bounds")),
                                          _list(layout.get("styles")), strict=False):
        if type(node_index) is int and node_index not in boxes:
            boxes[node_index] = (_list(bounds), _list(styles))
    scroll_x, scroll_y = _number(doc.get("scrollOffsetX")), _number(doc.get("scrollOffsetY"))
    # Per node, in one pass (a parent comes before its children): whether it or an ancestor has opacity 0, and the
    # id of its nearest element ancestor (the owning iframe's for the document's root).
    transparent: list[bool] = []
    element_above: list[int] = []
    for i in range(len(types)):
        parent = parents[i] if i < len(parents) and type(parents[i]) is int and 0 <= parents[i] < i else -1
        style = boxes[i][1] if i in boxes else ()
        transparent.append((transparent[parent] if parent >= 0 else frame.hidden)
                           or _string(strings, style, 1) in ("0", "0.0"))
        backend = backends[i] if i < len(backends) and type(backends[i]) is int else 0
        parent_id = element_above[parent] if parent >= 0 else frame.owner
        element_above.append(backend if types[i] == _ELEMENT else parent_id)
        if types[i] != _ELEMENT or i not in boxes:
            continue
        bounds = boxes[i][0]
        if len(bounds) < 4:
            continue
        x = frame.dx + _number(bounds[0]) - scroll_x
        y = frame.dy + _number(bounds[1]) - scroll_y
        w, h = max(0.0, _number(bounds[2])), max(0.0, _number(bounds[3]))
        shown = not transparent[i] and _string(strings, style, 0) in ("visible", "")
        visibility = _inside(x, y, w, h, frame.clip) if shown else 0.0
        if len(out) >= max_nodes:
            return True
        tag = _string(strings, names, i).lower()[:64]
        out.append(DOMNode(id=backend, parent=parent_id, tag=tag, x=round(x, 1), y=round(y, 1), w=round(w, 1),
                           h=round(h, 1), visibility=round(visibility, 3),
                           clickable=i in clickable or tag in _CONTROLS))
        if i in content_docs:  # an iframe: its document starts at its content box, clipped to it
            left = x + _px(strings, style, 2) + _px(strings, style, 4)
            top = y + _px(strings, style, 3) + _px(strings, style, 5)
            clip = frame.clip
            frames[content_docs[i]] = _Frame(left, top, (max(clip[0], x), max(clip[1], y), min(clip[2], x + w),
                                                         min(clip[3], y + h)), visibility == 0.0, backend)
    return False


def _inside(x: float, y: float, w: float, h: float, clip: tuple[float, float, float, float]) -> float:
    """The fraction of the box inside ``clip`` (0 for a box without area)."""
    if w <= 0 or h <= 0:
        return 0.0
    cw = min(x + w, clip[2]) - max(x, clip[0])
    ch = min(y + h, clip[3]) - max(y, clip[1])
    return 0.0 if cw <= 0 or ch <= 0 else min(1.0, cw * ch / (w * h))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float:
    return float(value) if type(value) in (int, float) else 0.0


def _string(strings: list[str], indices: Sequence[Any], at: int) -> str:
    """The string at position ``at`` of a list of string-table indices ("" when absent)."""
    if at >= len(indices):
        return ""
    index = indices[at]
    return strings[index] if type(index) is int and 0 <= index < len(strings) else ""


def _px(strings: list[str], style: Sequence[Any], at: int) -> float:
    """A computed length (``"2px"``) in CSS px (0 when absent or not in px)."""
    text = _string(strings, style, at)
    try:
        return float(text[:-2]) if text.endswith("px") else 0.0
    except ValueError:
        return 0.0


def _rare_indices(data: Any) -> list[int]:
    """The node indices of a RareBooleanData."""
    if not isinstance(data, Mapping):
        return []
    return [i for i in _list(data.get("index")) if type(i) is int]


def _rare_values(data: Any) -> list[tuple[int, int]]:
    """The (node index, value) pairs of a RareIntegerData."""
    if not isinstance(data, Mapping):
        return []
    return [(i, v) for i, v in zip(_list(data.get("index")), _list(data.get("value")), strict=False)
            if type(i) is int and type(v) is int]
