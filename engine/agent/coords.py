"""Mapping ``computer_use`` tool calls to :class:`AgentAction` in viewport CSS pixels.

Two coordinate frames exist: Qwen3-VL's ``grid`` (0..1000 on both axes, ``x_css = round(W * x / 1000)``)
and Qwen2.5-VL / UI-TARS ``pixels`` (absolute pixels on the ``smart_resize``'d screenshot, scaled by
``W / resized_w`` and ``H / resized_h``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from engine._imgcodec import QWEN3_VL, smart_resize
from engine.agent.actions import ActionName, AgentAction

from .parser import parse_reply, skip_reason

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ACTION_ALIASES = {"key": "keypress", "click": "left_click"}


@dataclass(frozen=True)
class CoordFrame:
    """How a model's coordinates relate to the viewport.

    ``mode`` is ``"grid"`` (0..1000) or ``"pixels"`` (the resized image); ``width``/``height`` are the
    viewport's CSS size; ``resized_width``/``resized_height`` the image size the model saw (required
    for ``pixels``, optional for ``grid`` where it only feeds :func:`describe_frames`).
    """

    mode: str
    width: int
    height: int
    resized_width: int | None = None
    resized_height: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("grid", "pixels"):
            raise ValueError(f"unknown coordinate mode {self.mode!r}; expected 'grid' or 'pixels'")
        if self.width <= 0 or self.height <= 0:
            raise ValueError(f"viewport size must be positive, got {self.width}x{self.height}")
        if self.mode == "pixels" and not (self.resized_width and self.resized_height):
            raise ValueError("pixels mode needs resized_width and resized_height")

    @classmethod
    def grid(cls, width: int, height: int, **resize: int) -> CoordFrame:
        """Qwen3-VL 0..1000 grid; the recorded image size is ``smart_resize(height, width, **resize)``
        (Qwen3-VL's parameters by default); it only feeds :func:`describe_frames`."""
        rh, rw = smart_resize(height, width, **(resize or QWEN3_VL))
        return cls("grid", width, height, rw, rh)

    @classmethod
    def pixels(cls, width: int, height: int, **resize: int) -> CoordFrame:
        """Absolute pixels on the screenshot after ``smart_resize(height, width, **resize)``."""
        rh, rw = smart_resize(height, width, **resize)
        return cls("pixels", width, height, rw, rh)

    @property
    def model_size(self) -> tuple[float, float]:
        """The extent of the model's coordinate space."""
        if self.mode == "grid":
            return 1000.0, 1000.0
        return float(self.resized_width), float(self.resized_height)  # type: ignore[arg-type]


def _numbers(value: Any) -> list[float]:
    if isinstance(value, str):
        nums: list[Any] = _NUMBER.findall(value)
    elif isinstance(value, (list, tuple)):
        nums = list(value)
        if len(nums) == 2 and all(isinstance(v, (list, tuple)) for v in nums):  # [[x0, y0], [x1, y1]]
            nums = [*nums[0], *nums[1]]
    else:
        raise ValueError(f"coordinate must be a list of numbers, got {type(value).__name__}")
    out: list[float] = []
    for v in nums:
        if isinstance(v, bool):
            raise ValueError("coordinate contains a boolean")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"coordinate contains a non-number {v!r}") from None
        if not math.isfinite(f):
            raise ValueError(f"coordinate contains a non-finite number {v!r}")
        out.append(f)
    if len(out) not in (2, 4):
        raise ValueError(f"coordinate must have 2 numbers (or 4 for a box), got {len(out)}")
    return out


def map_point(coordinate: Any, frame: CoordFrame) -> tuple[tuple[int, int], dict[str, Any], list[str]]:
    """``((x_css, y_css), frames, warnings)`` for a model coordinate; raises ValueError when invalid."""
    nums = _numbers(coordinate)
    warnings: list[str] = []
    if len(nums) == 4:
        x0, y0, x1, y1 = nums
        x, y = (x0 + x1) / 2, (y0 + y1) / 2
        warnings.append("box coordinate mapped to its centre")
    else:
        x, y = nums
    mw, mh = frame.model_size
    cx, cy = min(max(x, 0.0), mw), min(max(y, 0.0), mh)
    if (cx, cy) != (x, y):
        warnings.append(f"coordinate clamped: ({x:g}, {y:g}) outside 0..{mw:g} x 0..{mh:g}")
    css_x = min(max(round(frame.width * cx / mw), 0), frame.width - 1)
    css_y = min(max(round(frame.height * cy / mh), 0), frame.height - 1)
    frames: dict[str, Any] = {"model": [x, y], "mode": frame.mode}
    if frame.mode == "pixels":
        frames["screenshot_px"] = [cx, cy]
    elif frame.resized_width and frame.resized_height:
        frames["screenshot_px"] = [round(frame.resized_width * cx / 1000), round(frame.resized_height * cy / 1000)]
    else:
        frames["screenshot_px"] = None
    frames["css_px"] = [css_x, css_y]
    return (css_x, css_y), frames, warnings


def describe_frames(coordinate: Any, frame: CoordFrame) -> dict[str, Any]:
    """``{"model": [x, y], "screenshot_px": [...], "css_px": [...], "mode": ...}`` for one coordinate."""
    return map_point(coordinate, frame)[1]


def _text(args: dict[str, Any], key: str, action: str, *, allow_empty: bool = False) -> str:
    value = args.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ValueError(f"{action} needs a non-empty string {key!r}, got {value!r}")
    return value


# A host name (or IPv4 address) with an optional port, then the end or a path, query or fragment: what a URL
# without its scheme starts with. Labels end in a dot and the top-level name has none, so the possessive run of
# labels (++) never needs to give one back.
_BARE_HOST = re.compile(r"(?:localhost|(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)++[a-z]{2,63}|\d{1,3}(?:\.\d{1,3}){3})"
                        r"(?::\d{1,5})?(?:[/?#]|$)", re.IGNORECASE)
_SCHEMES = ("http", "https", "about", "data", "file", "javascript", "blob", "chrome", "view-source", "mailto")
MAX_URL_CHARS = 4096


def navigable_url(url: str) -> str:
    """A ``navigate`` target as the browser gets it: a URL with a scheme as it is (the worker's policy judges the
    scheme), a host name without one with ``https://`` (models often leave it out; task websites get the same
    rule); anything else (a path, words) raises ValueError."""
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"navigate URL longer than {MAX_URL_CHARS} characters")
    if _BARE_HOST.match(url):
        return "https://" + url
    scheme, colon, rest = url.partition(":")
    if colon and (rest.startswith("//") or scheme.lower() in _SCHEMES):
        return url
    raise ValueError(f"navigate needs an absolute URL or a host name, got {url[:200]!r}")


class Elements(Mapping[int, tuple[int, int]]):
    """Set-of-Marks element id -> the centre of its box (CSS px), from a worker's ``[id, tag, text, x, y, w, h]``
    list. Built on first use: only replies that name an element need it (not scrolls, keys, waits or answers),
    and a page may list hundreds."""

    def __init__(self, elements: Sequence[Sequence[Any]]) -> None:
        self._elements = elements
        self._centres: dict[int, tuple[int, int]] | None = None

    def _built(self) -> dict[int, tuple[int, int]]:
        if self._centres is None:
            # Reversed: an id listed twice names its first element, as the lookup by position finds it.
            self._centres = {int(e[0]): _centre(e) for e in reversed(self._elements)}
        return self._centres

    def __getitem__(self, element_id: int) -> tuple[int, int]:
        # Workers number elements 1..N in list order: look there first, without building every centre.
        if self._centres is None and 0 < element_id <= len(self._elements):
            e = self._elements[element_id - 1]
            if e[0] == element_id:
                return _centre(e)
        return self._built()[element_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._elements)


def _centre(element: Sequence[Any]) -> tuple[int, int]:
    """The centre of an ``[id, tag, text, x, y, w, h]`` element's box."""
    return round(element[3] + element[5] / 2), round(element[4] + element[6] / 2)


def element_centres(elements: Sequence[Sequence[Any]] | None) -> Elements | None:
    """Element id -> box centre, from a worker's ``[id, tag, text, x, y, w, h]`` list (None stays None)."""
    return None if elements is None else Elements(elements)


def _element_id(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"element_id must be an integer, got {value!r}")
    if isinstance(value, str) and value.strip().lstrip("#[").rstrip("]").isdigit():
        return int(value.strip().lstrip("#[").rstrip("]"))
    if isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    raise ValueError(f"element_id must be an integer, got {value!r}")


def _to_action(call: dict[str, Any], frame: CoordFrame,
               elements: Elements | None = None) -> tuple[AgentAction, list[str], dict[str, Any] | None]:
    if not isinstance(call, dict):
        raise ValueError(f"tool call must be a dict, got {type(call).__name__}")
    name = call.get("name", "computer_use")
    if name != "computer_use":
        raise ValueError(f"unknown tool {name!r}; expected 'computer_use'")
    args = call.get("arguments")
    if not isinstance(args, dict):
        raise ValueError("tool call has no 'arguments' object")
    action = args.get("action")
    if not isinstance(action, str) or not action:
        raise ValueError(f"missing or invalid 'action': {action!r}")
    action = _ACTION_ALIASES.get(action, action)
    warnings: list[str] = []
    frames: dict[str, Any] | None = None

    element: int | None = None

    def point(required: bool) -> tuple[int | None, int | None]:
        nonlocal frames, element
        if elements is not None and args.get("element_id") is not None:
            element = _element_id(args["element_id"])
            if element not in elements:
                known = f"1..{max(elements)}" if elements else "none"
                raise ValueError(f"no element {element} on this page (elements: {known})")
            x, y = elements[element]
            frames = {"mode": "som", "element_id": element, "css_px": [x, y]}
            return x, y
        coord = args.get("coordinate")
        if coord is None:
            if required:
                raise ValueError(f"{action} needs a 'coordinate'")
            return None, None
        (x, y), frames, w = map_point(coord, frame)
        warnings.extend(w)
        return x, y

    if action in ("left_click", "hover"):
        x, y = point(True)
        act = AgentAction(cast("ActionName", action), x=x, y=y)  # one of the two, by the condition
    elif action == "select":
        text = _text(args, "text", action)
        x, y = point(True)
        act = AgentAction("select", x=x, y=y, text=text)
    elif action == "type":
        text = _text(args, "text", action, allow_empty=True)
        x, y = point(False)
        act = AgentAction("type", x=x, y=y, text=text)
    elif action == "scroll":
        direction = args.get("direction")
        if direction not in ("up", "down"):
            raise ValueError(f"scroll needs direction 'up' or 'down', got {direction!r}")
        x, y = point(False)
        act = AgentAction("scroll", x=x, y=y, direction=direction)
    elif action == "wait":
        t = args.get("time", args.get("seconds"))
        seconds: float | None = None
        if t is not None:
            try:
                seconds = float(t)
            except (TypeError, ValueError):
                raise ValueError(f"wait 'time' must be a number, got {t!r}") from None
            if isinstance(t, bool) or not math.isfinite(seconds) or seconds < 0:
                raise ValueError(f"wait 'time' must be a finite number >= 0, got {t!r}")
        act = AgentAction("wait", seconds=seconds)
    elif action == "go_back":
        act = AgentAction("go_back")
    elif action == "navigate":
        act = AgentAction("navigate", url=navigable_url(_text(args, "url", action)))
    elif action == "answer":
        act = AgentAction("answer", text=_text(args, "text", action, allow_empty=True))
    elif action == "keypress":
        keys = args.get("keys", args.get("key", args.get("text")))
        if isinstance(keys, list) and keys and all(isinstance(k, str) and k for k in keys):
            keys = "+".join(keys)
        if not isinstance(keys, str) or not keys.strip():
            raise ValueError(f"keypress needs 'keys' (a string or list of strings), got {keys!r}")
        act = AgentAction("keypress", keys=keys.strip())
    else:
        raise ValueError(f"unknown action {action!r}")
    act.element_id = element
    return act, warnings, frames


def to_action(call: dict[str, Any], frame: CoordFrame,
              elements: Elements | None = None) -> tuple[AgentAction, list[str]]:
    """Map one ``computer_use`` call to an AgentAction (CSS pixels) and warnings; ValueError when invalid.

    With ``elements`` (Set-of-Marks mode) an ``element_id`` argument targets the centre of that element.
    """
    act, warnings, _ = _to_action(call, frame, elements)
    return act, warnings


def parse_action(text: str, frame: CoordFrame,
                 elements: Elements | None = None) -> tuple[AgentAction, dict[str, Any]]:
    """Reply text -> the action of its first valid tool call; anything unusable becomes ``wait``. Never raises.

    ``info`` holds ``reply`` (the :class:`ParsedReply`), ``call``, ``warnings``, ``frames`` and ``error``
    (None on success; otherwise why the reply became ``wait``; skipped calls are listed in ``skipped``).
    """
    info: dict[str, Any] = {"reply": None, "call": None, "warnings": [], "frames": None, "error": None,
                            "skipped": []}
    try:
        reply = parse_reply(text)
        info["reply"] = reply
        info["skipped"] = list(reply.skipped)  # calls that were not even JSON, then those that were no action
        for number, call in zip(reply.call_numbers, reply.tool_calls, strict=True):
            try:
                act, warnings, frames = _to_action(call, frame, elements)
            except Exception as e:  # noqa: BLE001 - any failure skips this call, and the next one may do
                info["skipped"].append(f"tool_call {number}: {skip_reason(e)}")
                continue
            info.update(call=call, warnings=warnings, frames=frames)
            return act, info
        info["error"] = "; ".join(info["skipped"]) or reply.error or "no usable tool call"
    except Exception as e:  # noqa: BLE001 - never raise on model output
        info["error"] = f"parse failure: {e!r}"
    return AgentAction("wait"), info
