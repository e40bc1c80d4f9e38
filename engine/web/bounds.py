"""Caps on the page text that enters the engine: titles, URLs, Set-of-Marks element lists, notes and probe
values. A page (or a worker) may send anything; records and prompts get at most these sizes.

:func:`bound_observation` is applied to every observation where it enters a rollout, before anything is
copied out of it, so the prompt, the step record and the monitor all see the same capped text. It also
masks credentials in the URL and the note (:mod:`engine.web.redact`): the rollout keeps the real URL only
where the engine itself needs it (the task's website to navigate, programmatic URL checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from engine.web.redact import mask_text, mask_url

ELLIPSIS = "\u2026"


@dataclass(frozen=True)
class PageLimits:
    """The caps (characters, elements); 0 turns one off."""

    url_chars: int = 2048
    title_chars: int = 512
    elements: int = 300  # Set-of-Marks elements listed per observation
    element_text_chars: int = 200  # per element (the worker itself cuts at 80; this holds for any worker)
    element_tag_chars: int = 32
    text_chars: int = 2000  # other page texts: the note, each string of a probe value, error messages
    probe_items: int = 200  # entries of a probe value's lists and objects (per container)
    events: int = 100  # page events (refused loads, popups, downloads...) reported with one observation
    axtree_nodes: int = 3000  # accessibility tree nodes per observation (names and values: element_text_chars)
    dom_nodes: int = 3000  # DOM snapshot elements per observation (tags: element_tag_chars)


DEFAULT_LIMITS = PageLimits()


def cap_text(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (the last one an ellipsis), or as it was when it fits."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[:limit - 1] + ELLIPSIS


def _fits(elements: list[Any], index: int, limit: int) -> bool:
    """Whether every element's field ``index`` is at most ``limit`` long, swept in C (no Python call per element);
    False also when some element does not have the usual shape, which the caller then checks one by one."""
    if not limit or not elements:
        return True
    try:
        return max(map(len, map(itemgetter(index), elements))) <= limit
    except (TypeError, IndexError, KeyError):  # an int tag, a short or odd element: let the slow path judge
        return False


def _cap_elements(elements: list[Any], limits: PageLimits, cut: set[str]) -> list[Any]:
    """At most ``limits.elements`` elements (the first ones: document order), each ``[id, tag, text, ...]``
    with its tag and text capped."""
    if limits.elements and len(elements) > limits.elements:
        elements = elements[:limits.elements]
        cut.add("elements")
    # The usual list (every tag and text within its cap) passes without a Python step per element: on a page of
    # hundreds of elements that loop was the largest cost of a step's observation.
    if _fits(elements, 1, limits.element_tag_chars) and _fits(elements, 2, limits.element_text_chars):
        return elements
    out = elements
    for i, e in enumerate(elements):
        if not isinstance(e, list) or len(e) < 3:
            continue
        tag, text = e[1], e[2]
        long_tag = isinstance(tag, str) and limits.element_tag_chars and len(tag) > limits.element_tag_chars
        long_text = isinstance(text, str) and limits.element_text_chars and len(text) > limits.element_text_chars
        if long_tag or long_text:
            if out is elements:
                out = list(elements)  # never change the caller's list in place
            e = list(e)
            if long_tag:
                e[1] = cap_text(tag, limits.element_tag_chars)
            if long_text:
                e[2] = cap_text(text, limits.element_text_chars)
            out[i] = e
            cut.add("element_text")
    return out


def _cap_tree(nodes: list[Any], limits: PageLimits, cut: set[str]) -> list[Any]:
    """At most ``limits.axtree_nodes`` nodes (the first ones: depth-first order), names and values capped, the URLs
    of their ``url=`` states masked like the page's own."""
    if limits.axtree_nodes and len(nodes) > limits.axtree_nodes:
        nodes = nodes[:limits.axtree_nodes]
        cut.add("axtree")
    chars = limits.element_text_chars
    for node in nodes:
        if chars and (len(node.name) > chars or len(node.value) > chars):
            node.name, node.value = cap_text(node.name, chars), cap_text(node.value, chars)
            cut.add("axtree")
        for i, state in enumerate(node.states):
            if state.startswith("url="):
                node.states[i] = "url=" + cap_text(mask_url(state[4:]), limits.url_chars)
    return nodes


def _cap_dom(nodes: list[Any], limits: PageLimits, cut: set[str]) -> list[Any]:
    """At most ``limits.dom_nodes`` elements (the first ones: document order), tags capped, a box or visibility
    that is no finite number made 0 (a record is JSON)."""
    if limits.dom_nodes and len(nodes) > limits.dom_nodes:
        nodes = nodes[:limits.dom_nodes]
        cut.add("dom")
    for node in nodes:
        if limits.element_tag_chars and len(node.tag) > limits.element_tag_chars:
            node.tag = cap_text(node.tag, limits.element_tag_chars)
        for name in ("x", "y", "w", "h", "visibility"):
            if not math.isfinite(getattr(node, name)):
                setattr(node, name, 0.0)
    return nodes


def cap_value(value: Any, limits: PageLimits, depth: int = 0) -> tuple[Any, bool]:
    """A JSON-like value from a page (a probe's result) with every string capped to ``text_chars``, every
    list/object to ``probe_items`` entries and nesting to 8 levels; returns (value, whether anything was cut)."""
    if isinstance(value, str):
        capped = cap_text(value, limits.text_chars)
        return capped, capped is not value
    if isinstance(value, list | dict) and depth >= 8:
        return None, True
    cut = False
    if isinstance(value, list):
        if limits.probe_items and len(value) > limits.probe_items:
            value, cut = value[:limits.probe_items], True
        items = []
        for v in value:
            v, c = cap_value(v, limits, depth + 1)
            items.append(v)
            cut |= c
        return items, cut
    if isinstance(value, dict):
        entries = list(value.items())
        if limits.probe_items and len(entries) > limits.probe_items:
            entries, cut = entries[:limits.probe_items], True
        out = {}
        for k, v in entries:
            k2 = cap_text(k, limits.text_chars) if isinstance(k, str) else k
            v, c = cap_value(v, limits, depth + 1)
            out[k2] = v
            cut |= c or k2 is not k
        return out, cut
    return value, False


def bound_observation(obs: Any, limits: PageLimits = DEFAULT_LIMITS) -> list[str]:
    """Cap and mask an observation's page texts in place; returns the names of the fields that were cut
    (``url``, ``title``, ``elements``, ``element_text``, ``note``, ``probe``, ``events``, ``axtree``, ``dom``), empty
    when nothing was.

    Works on any object with ``url``, ``title``, ``note``, ``elements``, ``probe`` and ``events`` attributes
    (the protocol's Observation; ``events`` hold ``url`` and ``detail``, masked and capped like the URL and
    the note; ``elements_cut``, when present, flags ``elements`` as the worker's own cut). A value of the wrong
    type is replaced by an empty one (and flagged)."""
    cut: set[str] = set()
    # Masked before it is cut: a cut through a secret could leave a part that no longer looks like one.
    url = mask_url(obs.url) if isinstance(obs.url, str) else ""
    if len(url) > limits.url_chars > 0:
        url = cap_text(url, limits.url_chars)
        cut.add("url")
    obs.url = url
    title = obs.title if isinstance(obs.title, str) else ""
    if len(title) > limits.title_chars > 0:
        title = cap_text(title, limits.title_chars)
        cut.add("title")
    obs.title = title
    if obs.note is not None:
        note = mask_text(obs.note if isinstance(obs.note, str) else str(obs.note))
        if len(note) > limits.text_chars > 0:
            note = cap_text(note, limits.text_chars)
            cut.add("note")
        obs.note = note
    if obs.elements is not None:
        if isinstance(obs.elements, list):
            obs.elements = _cap_elements(obs.elements, limits, cut)
        else:
            obs.elements = []
            cut.add("elements")
        if getattr(obs, "elements_cut", None):  # the worker's pass stopped early (at the open's cap, or its own)
            cut.add("elements")
    if obs.probe is not None:
        probe, probe_cut = cap_value(obs.probe, limits)
        if probe_cut:
            obs.probe = probe
            cut.add("probe")
    tree = getattr(obs, "axtree", None)
    if tree is not None:
        obs.axtree = _cap_tree(tree, limits, cut)
        if getattr(obs, "axtree_cut", False):
            cut.add("axtree")
    dom = getattr(obs, "dom", None)
    if dom is not None:
        obs.dom = _cap_dom(dom, limits, cut)
        if getattr(obs, "dom_cut", False):
            cut.add("dom")
    events = getattr(obs, "events", None)
    if events:
        if limits.events and len(events) > limits.events:
            obs.events = events = events[:limits.events]
            cut.add("events")
        for e in events:
            url = mask_url(e.url) if isinstance(e.url, str) else ""
            detail = mask_text(e.detail) if isinstance(e.detail, str) else ""
            if len(url) > limits.url_chars > 0 or len(detail) > limits.text_chars > 0:
                url, detail = cap_text(url, limits.url_chars), cap_text(detail, limits.text_chars)
                cut.add("events")
            e.url, e.detail = url, detail
    return sorted(cut)
