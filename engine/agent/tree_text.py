"""An accessibility tree as the text agents read: one node per line, a tab per level of depth, in the conventions of
BrowserGym's agents (``[id] role 'name', value='...', state, name=value``). The ids in brackets are what id-based
actions name (``click('412')``); a node that is no element has none. With the page's DOM snapshot too, an element
the snapshot marks says so before its states, as BrowserGym's ``with_clickable`` and ``with_visible`` write it:
``clickable``, and ``visible`` when at least half of its box is in view.
"""

from __future__ import annotations

from collections.abc import Sequence

from browserpool.protocol import AXNode, DOMNode

CUT_LINE = "(the tree was cut at the worker's node cap: the page has more)"
VISIBLE = 0.5  # the part of an element's box in view from which it is ``visible``


def tree_text(nodes: Sequence[AXNode], cut: bool = False, dom: Sequence[DOMNode] | None = None) -> str:
    """The tree's lines (and one that says so when it was cut); with ``dom``, its marks on the elements."""
    marks = {e.id: _marks(e) for e in dom} if dom else {}
    lines = [_line(n, marks.get(n.id, ())) for n in nodes]
    if cut:
        lines.append(CUT_LINE)
    return "\n".join(lines)


def _marks(element: DOMNode) -> tuple[str, ...]:
    return (("clickable",) if element.clickable else ()) + (("visible",) if element.visibility >= VISIBLE else ())


def _line(node: AXNode, marks: tuple[str, ...]) -> str:
    indent = "\t" * min(node.depth, 64)
    label = f"[{node.id}] " if node.id else ""
    parts = [f"{indent}{label}{node.role} {_quoted(node.name)}"]
    if node.value and node.value != node.name:
        parts.append(f"value={_quoted(node.value)}")
    parts.extend(marks)
    parts.extend(node.states)
    return ", ".join(parts)


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def tree_ids(nodes: Sequence[AXNode]) -> frozenset[int]:
    """The ids an action may name in this tree."""
    return frozenset(n.id for n in nodes if n.id)
