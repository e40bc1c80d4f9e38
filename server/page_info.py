"""What the server reads from a page for the Omniboxes API's information commands (``get_page_metadata``,
``get_webpage_text``, ``get_interactive_rects``, ``get_screenshot_info``), in the shapes its clients read.

Element ids are the numbers a Set-of-Marks pass gives the visible interactive elements (1..N in document order,
the numbers drawn on a set_of_marks screenshot): the same ids in ``get_interactive_rects``,
``get_screenshot_info`` and the ``*_id`` commands. The original numbers the DOM itself (``__elementId``, from
"10") and maps drawn numbers to those; here the drawn number is the id, so its ``id_mapping`` is the identity.
"""

from __future__ import annotations

from typing import Any

# The page's title, URL, meta tags, JSON-LD and microdata (the original's fields; only title and url are read by
# its clients). Bounded: at most 200 meta tags, 20 JSON-LD blocks and 50 microdata items, texts cut at 2,000.
PAGE_METADATA_JS = r"""
(() => {
  const cut = (s) => String(s == null ? '' : s).slice(0, 2000);
  const out = { title: cut(document.title).trim() || 'Unknown Page', url: location.href || 'about:blank' };
  const meta = {};
  for (const m of Array.from(document.querySelectorAll('meta[name], meta[property]')).slice(0, 200)) {
    const key = m.getAttribute('name') || m.getAttribute('property');
    if (key) meta[cut(key)] = cut(m.getAttribute('content'));
  }
  if (Object.keys(meta).length) out.meta_tags = meta;
  const blocks = Array.from(document.querySelectorAll('script[type="application/ld+json"]')).slice(0, 20)
    .map((s) => s.textContent || '');
  if (blocks.length) {
    try { out.jsonld = blocks.length === 1 ? JSON.parse(blocks[0]) : blocks.map((b) => cut(b)); }
    catch (e) { out.jsonld = blocks.map((b) => cut(b)); }
  }
  const items = Array.from(document.querySelectorAll('[itemscope]')).slice(0, 50).map((el) => {
    const item = { itemType: cut(el.getAttribute('itemtype')) };
    for (const p of Array.from(el.querySelectorAll('[itemprop]')).slice(0, 50)) {
      item[cut(p.getAttribute('itemprop'))] = cut(p.getAttribute('content') || p.textContent).trim();
    }
    return item;
  });
  if (items.length) out.microdata = items;
  return out;
})()
"""


def page_text_js(n_lines: int) -> str:
    """The first ``n_lines`` non-blank lines of the body's text, as ``{"text": ...}``."""
    return (f"(() => ({{text: ((document.body && document.body.innerText) || '').split('\\n')"
            f".map((l) => l.trim()).filter((l) => l).slice(0, {int(n_lines)}).join('\\n')}}))()")


# Roles a tag has without a role attribute (the small table the original uses for ``role``).
IMPLICIT_ROLES = {"a": "link", "button": "button", "input": "textbox", "select": "combobox",
                  "textarea": "textbox", "summary": "button", "option": "option"}


def region(element: list[Any]) -> dict[str, Any]:
    """One element ``[id, tag, text, x, y, w, h]`` of a Set-of-Marks pass as the original's interactive region:
    its tag, role, accessible name and one rect (viewport CSS px = screenshot px)."""
    _id, tag, text, x, y, w, h = element
    rect = {"x": x, "y": y, "width": w, "height": h, "top": y, "right": x + w, "bottom": y + h, "left": x}
    role = IMPLICIT_ROLES.get(str(tag).partition(",")[0], "")  # "input, type=text" is an input
    return {"tag_name": tag, "role": role, "aria_name": text, "v_scrollable": False, "rects": [rect]}


def interactive_regions(elements: list[list[Any]]) -> dict[str, dict[str, Any]]:
    """``get_interactive_rects``: the regions keyed by element id (a string, as the original's)."""
    return {str(e[0]): region(e) for e in elements}


def screenshot_info(elements: list[list[Any]]) -> dict[str, Any]:
    """``get_screenshot_info`` for the elements of a set_of_marks screenshot. The pass lists visible elements only,
    so ``rects_above`` and ``rects_below`` are always empty (the clients do not read them)."""
    ids = [str(e[0]) for e in elements]
    return {"visible_rects": ids, "rects_above": [], "rects_below": [],
            "interactive_regions": interactive_regions(elements), "id_mapping": {i: i for i in ids}}
