"""The ``/execute`` commands of the Omniboxes API, each as the pool's browser operations.

Every command has a typed argument struct (a missing, unknown or ill-typed argument is a 400 that names it) and
returns the original's response body. Action commands wait until the page has settled (the worker's settle
detection, capped) instead of the original's fixed sleeps, and take no screenshot: the client asks for one with
``/screenshot`` when it wants it. Element ids are those of the lease's last set_of_marks screenshot
(:mod:`server.page_info`); the ``*_node`` commands take the ids of the accessibility tree instead
(``get_accessibility_tree``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast

import msgspec

from browserpool.config import SOM_BUDGET_MS, SOM_MAX_ELEMENTS
from browserpool.keys import MODIFIER_BITS, canonical_key_name
from browserpool.page import SOM_TEXT_CHARS
from browserpool.page_scripts import som_expression
from browserpool.protocol import BrowserAction, DOMNode, ImageFormat
from engine.agent.tree_text import tree_text
from engine.store.records import ActionRecord
from server.leases import Lease, LeaseError
from server.page_info import PAGE_METADATA_JS, interactive_regions, page_text_js, screenshot_info

SUCCESS = {"status": "success"}
SLEEP_CAP_S = 60.0  # the longest `sleep` a client may ask for
MAX_TEXT_CHARS = 100_000  # the longest text a fill command may type
MAX_TEXT_LINES = 100_000  # the most lines get_webpage_text may ask for
MAX_SCROLL_PX = 1_000_000  # the longest scroll a client may ask for
# The original's names for modifiers that the engine's key names do not have (the rest match case-insensitively).
_MODIFIER_ALIASES = {"option": "Alt", "cmd": "Meta", "command": "Meta", "win": "Meta", "super": "Meta"}

Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
Direction = Literal["up", "down"]


# --- argument structs (one per argument shape; unknown arguments are refused) -------------------------------
class _Args(msgspec.Struct, forbid_unknown_fields=True):
    pass


class NoArgs(_Args):
    pass


class Url(_Args):
    url: str


class Point(_Args):
    x: float
    y: float


class Fill(_Args):
    x: float
    y: float
    value: Text
    press_enter: bool = True
    delete_existing: bool = False


class Scroll(_Args):
    amount: Annotated[int, msgspec.Meta(gt=0, le=MAX_SCROLL_PX)] = 200
    full_page: bool = False


class ElementId(_Args):
    id: str | int


class FillId(_Args):
    id: str | int
    value: Text
    press_enter: bool = True
    delete_existing: bool = False


class HoverScroll(_Args):
    x: float
    y: float
    direction: Direction = "down"


class ScrollId(_Args):
    id: str | int
    direction: Direction = "down"


class SelectOption(_Args):
    id: str | int
    value: str | None = None  # an option's label or value for a <select>; without it the element is clicked


class Sleep(_Args):
    duration: Annotated[float, msgspec.Meta(ge=0, le=SLEEP_CAP_S)] = 1.0


class KeyPress(_Args):
    keys: list[str]


class PageText(_Args):
    n_lines: Annotated[int, msgspec.Meta(ge=0, le=MAX_TEXT_LINES)] = 100


class Shot(_Args):
    interaction_mode: str = "set_of_marks"


NodeIdValue = Annotated[int, msgspec.Meta(ge=1, le=2**31)]


class NodeId(_Args):
    id: NodeIdValue  # an element's id in the lease's accessibility tree (get_accessibility_tree)


class FillNode(_Args):
    id: NodeIdValue
    value: Text
    press_enter: bool = False
    delete_existing: bool = True


class SelectNode(_Args):
    id: NodeIdValue
    value: str


class PressNode(_Args):
    id: NodeIdValue
    keys: list[str]


@dataclass(frozen=True)
class Command:
    """A command's argument type, its handler and whether it is an action (a step of the lease's record)."""

    args: type[_Args]
    run: Callable[[Lease, Any], Awaitable[dict[str, Any]]]
    action: bool = True


class CommandError(Exception):
    """A command the browser refused (a URL without a scheme, a key it does not know): a 400."""


def decode_args(command: Command, raw: Any) -> _Args:
    """The command's arguments as its struct; LeaseError 400 naming the bad argument."""
    try:
        return msgspec.convert(raw if raw is not None else {}, command.args)
    except msgspec.ValidationError as exc:
        raise LeaseError(400, f"Invalid arguments: {exc}") from None


# --- helpers ----------------------------------------------------------------------------------------------
async def _act(lease: Lease, action: BrowserAction) -> dict[str, Any]:
    """Run one browser action without a screenshot; the lease remembers where the page now is."""
    await lease.ready()
    obs, frame = await lease.session.act(action, shot=False)
    frame.release()
    lease.url, lease.title = obs.url, obs.title
    lease.result = {"url": obs.url, "title": obs.title, "settle": obs.settle, "point": obs.point,
                    "timings": obs.timings_ms}
    return SUCCESS


def _centre(lease: Lease, element_id: str | int) -> tuple[float, float]:
    _id, _tag, _text, x, y, w, h = lease.element(element_id)
    return x + w / 2, y + h / 2


async def _evaluate(lease: Lease, expression: str) -> Any:
    await lease.ready()
    (value,) = await lease.session.evaluate([expression])
    if isinstance(value, dict) and set(value) == {"error"}:
        raise CommandError(f"the page's script failed: {value['error']}")
    return value


def _combo(keys: list[str]) -> str:
    """The original's chord (every key down in order, released in reverse) as the engine's key combinations:
    the modifiers held for each of the other keys in turn."""
    mods: list[str] = []
    others: list[str] = []
    for k in keys:
        name = _MODIFIER_ALIASES.get(k.strip().lower()) or canonical_key_name(k)
        (mods if name in MODIFIER_BITS else others).append(name)
    if not others:
        raise CommandError(f"keypress needs a key besides modifiers: {keys!r}"[:200])
    return " ".join("+".join([*mods, key]) for key in others)


# --- commands ---------------------------------------------------------------------------------------------
async def visit_page(lease: Lease, a: Url) -> dict[str, Any]:
    if not lease.opened:
        await lease.open(a.url)  # the lease's first command: one page load instead of a blank page and a load
        return SUCCESS
    return await _act(lease, BrowserAction("navigate", url=a.url))


async def click_coords(lease: Lease, a: Point) -> dict[str, Any]:
    return await _act(lease, BrowserAction("click", x=a.x, y=a.y))


async def hover_coords(lease: Lease, a: Point) -> dict[str, Any]:
    return await _act(lease, BrowserAction("hover", x=a.x, y=a.y))


async def fill_coords(lease: Lease, a: Fill) -> dict[str, Any]:
    return await _act(lease, BrowserAction("type", x=a.x, y=a.y, text=a.value, clear=a.delete_existing,
                                           enter=a.press_enter))


def _scroller(direction: str) -> Callable[[Lease, Scroll], Awaitable[dict[str, Any]]]:
    async def scroll(lease: Lease, a: Scroll) -> dict[str, Any]:
        # As the original: the wheel at (10, 10), by the viewport's height less 50 px with full_page.
        amount = lease.session.pool.cfg.worker.viewport_height - 50 if a.full_page else a.amount
        return await _act(lease, BrowserAction("scroll", x=10, y=10, direction=direction, amount=amount))
    return scroll


async def back(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    return await _act(lease, BrowserAction("go_back"))


async def click_id(lease: Lease, a: ElementId) -> dict[str, Any]:
    x, y = _centre(lease, a.id)
    return await _act(lease, BrowserAction("click", x=x, y=y))


async def hover_id(lease: Lease, a: ElementId) -> dict[str, Any]:
    x, y = _centre(lease, a.id)
    return await _act(lease, BrowserAction("hover", x=x, y=y))


async def fill_id(lease: Lease, a: FillId) -> dict[str, Any]:
    x, y = _centre(lease, a.id)
    return await _act(lease, BrowserAction("type", x=x, y=y, text=a.value, clear=a.delete_existing,
                                           enter=a.press_enter))


async def hover_and_scroll_coords(lease: Lease, a: HoverScroll) -> dict[str, Any]:
    await _act(lease, BrowserAction("hover", x=a.x, y=a.y))
    # The scrollable under the point (else the page) by 80% of the viewport, as the original's default.
    amount = int(0.8 * lease.session.pool.cfg.worker.viewport_height)
    return await _act(lease, BrowserAction("scroll", x=a.x, y=a.y, direction=a.direction, amount=amount))


async def scroll_id(lease: Lease, a: ScrollId) -> dict[str, Any]:
    _id, _tag, _text, x, y, w, h = lease.element(a.id)
    return await _act(lease, BrowserAction("scroll", x=x + w / 2, y=y + h / 2, direction=a.direction,
                                           amount=max(1, int(h))))


async def select_option(lease: Lease, a: SelectOption) -> dict[str, Any]:
    x, y = _centre(lease, a.id)
    if a.value is None:
        return await _act(lease, BrowserAction("click", x=x, y=y))
    return await _act(lease, BrowserAction("select", x=x, y=y, text=a.value))


async def keypress(lease: Lease, a: KeyPress) -> dict[str, Any]:
    return await _act(lease, BrowserAction("key", keys=_combo(a.keys)))


async def tab_and_enter(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    return await _act(lease, BrowserAction("key", keys="Tab Enter"))


async def sleep(lease: Lease, a: Sleep) -> dict[str, Any]:
    # The client's own wait (AsyncWebRL's `wait` action): asked for, so honoured, within a cap (Sleep).
    await asyncio.sleep(a.duration)
    lease.result = {"url": lease.url, "title": lease.title, "settle": "skipped"}
    return SUCCESS


async def get_page_metadata(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    value = await _evaluate(lease, PAGE_METADATA_JS)
    return value if isinstance(value, dict) else {"title": lease.title or "Unknown Page", "url": lease.url}


async def get_webpage_text(lease: Lease, a: PageText) -> dict[str, Any]:
    value = await _evaluate(lease, page_text_js(a.n_lines))
    return value if isinstance(value, dict) else {"text": ""}


async def get_interactive_rects(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    value = await _evaluate(lease, som_expression(SOM_TEXT_CHARS, SOM_MAX_ELEMENTS, SOM_BUDGET_MS))
    found = value[2] if isinstance(value, list) and len(value) == 4 and isinstance(value[2], list) else []
    lease.elements = [[i, *e] for i, e in enumerate(found, 1)]
    return interactive_regions(lease.elements)


async def get_screenshot_info(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    if lease.som_elements is None:
        return {"error": "No screenshot info available"}
    return screenshot_info(lease.som_elements)


async def get_accessibility_tree(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    """The page's accessibility tree: its text as agents read it (ids in brackets), its nodes as
    ``[id, depth, role, name, value, states]``, and whether the worker's cap cut it."""
    await lease.ready()
    obs, frame = await lease.session.observe(axtree=True)
    frame.release()
    lease.url, lease.title = obs.url, obs.title
    nodes = obs.axtree or []
    text = tree_text(nodes, obs.axtree_cut)
    lease.recorder.page_read(axtree=text)
    return {"axtree": text, "nodes": msgspec.to_builtins(nodes), "cut": obs.axtree_cut}


async def get_dom_snapshot(lease: Lease, _a: NoArgs) -> dict[str, Any]:
    """The page's elements with their boxes and visibility (DOM snapshot): rows of ``columns``, the same ids as the
    accessibility tree's, and whether the worker's cap cut them."""
    await lease.ready()
    obs, frame = await lease.session.observe(dom=True)
    frame.release()
    lease.url, lease.title = obs.url, obs.title
    rows = msgspec.to_builtins(obs.dom or [])
    lease.recorder.page_read(dom=rows)
    return {"dom": rows, "columns": list(DOMNode.__struct_fields__), "cut": obs.dom_cut}


async def click_node(lease: Lease, a: NodeId) -> dict[str, Any]:
    return await _act(lease, BrowserAction("click", node=a.id))


async def hover_node(lease: Lease, a: NodeId) -> dict[str, Any]:
    return await _act(lease, BrowserAction("hover", node=a.id))


async def fill_node(lease: Lease, a: FillNode) -> dict[str, Any]:
    return await _act(lease, BrowserAction("type", node=a.id, text=a.value, clear=a.delete_existing,
                                           enter=a.press_enter))


async def select_node(lease: Lease, a: SelectNode) -> dict[str, Any]:
    return await _act(lease, BrowserAction("select", node=a.id, text=a.value))


async def press_node(lease: Lease, a: PressNode) -> dict[str, Any]:
    return await _act(lease, BrowserAction("key", node=a.id, keys=_combo(a.keys)))


async def screenshot(lease: Lease, a: Shot) -> dict[str, Any]:
    await capture(lease, a.interaction_mode == "set_of_marks")
    return {"status": "screenshot_taken"}


async def capture(lease: Lease, som: bool, fmt: ImageFormat = "jpeg") -> bytes:
    """A screenshot of the lease's page now (``/screenshot`` and the ``screenshot`` command). It tells the lease
    where the page is and, with ``som``, its numbered elements (a pass that found none leaves the last ones in
    place, as the original's does); the lease's record keeps it."""
    await lease.ready()
    obs, frame = await lease.session.observe(som=som, fmt=fmt)
    with frame:
        image = bytes(frame.view)
    if not image:
        raise CommandError("the browser returned no screenshot")
    lease.url, lease.title = obs.url, obs.title
    if som and obs.elements:
        lease.elements = lease.som_elements = obs.elements
    lease.recorder.screenshot(image, obs.url, obs.title, fmt)
    return image


COMMANDS: dict[str, Command] = {
    "visit_page": Command(Url, visit_page),
    "click_coords": Command(Point, click_coords),
    "fill_coords": Command(Fill, fill_coords),
    "hover_coords": Command(Point, hover_coords),
    "hover_and_scroll_coords": Command(HoverScroll, hover_and_scroll_coords),
    "page_down": Command(Scroll, _scroller("down")),
    "page_up": Command(Scroll, _scroller("up")),
    "back": Command(NoArgs, back),
    "click_id": Command(ElementId, click_id),
    "fill_id": Command(FillId, fill_id),
    "hover_id": Command(ElementId, hover_id),
    "scroll_id": Command(ScrollId, scroll_id),
    "select_option": Command(SelectOption, select_option),
    "keypress": Command(KeyPress, keypress),
    "tab_and_enter": Command(NoArgs, tab_and_enter),
    "sleep": Command(Sleep, sleep),
    "get_page_metadata": Command(NoArgs, get_page_metadata, action=False),
    "get_webpage_text": Command(PageText, get_webpage_text, action=False),
    "get_interactive_rects": Command(NoArgs, get_interactive_rects, action=False),
    "get_screenshot_info": Command(NoArgs, get_screenshot_info, action=False),
    "screenshot": Command(Shot, screenshot, action=False),
    # Beyond the original: the accessibility tree, and actions on its elements by id (BrowserGym-style clients).
    "get_accessibility_tree": Command(NoArgs, get_accessibility_tree, action=False),
    "get_dom_snapshot": Command(NoArgs, get_dom_snapshot, action=False),
    "click_node": Command(NodeId, click_node),
    "hover_node": Command(NodeId, hover_node),
    "fill_node": Command(FillNode, fill_node),
    "select_node": Command(SelectNode, select_node),
    "press_node": Command(PressNode, press_node),
}


def action_record(name: str, args: _Args) -> ActionRecord:
    """A command as the records' action (ActionRecord's field names where they fit, the rest as given)."""
    raw = msgspec.to_builtins(args)
    out: dict[str, Any] = {"name": name}
    renames = {"value": "text", "press_enter": "enter", "delete_existing": "clear", "duration": "seconds"}
    for key, value in raw.items():
        if key == "id":
            out["element_id"] = int(value) if str(value).isdigit() else None
            out["target"] = str(value)
        elif key == "keys":
            out["keys"] = " ".join(value)
        else:
            out[renames.get(key, key)] = value
    # ActionRecord's keys where they fit (typed as it types them), and the command's other arguments as given.
    return cast("ActionRecord", out)


