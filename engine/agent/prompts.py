"""The prompt of the Qwen-VL web agent: tool definitions, response formats and the message templates.

The system message holds the tool JSON inside ``<tools></tools>``, the ``<tool_call>`` instruction and
the response format, as in the original. Users with their own prompts override any template from a
file (see :meth:`PromptTemplates.from_file`); templates use ``string.Template`` placeholders
(``$task``, ``${tools}``...) so that JSON examples with braces need no escaping.
"""

from __future__ import annotations

import functools
import json
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from browserpool.typed_config import check_choices
from engine import json_input

Interaction = Literal["coordinates", "som"]
ResponseFormat = Literal["complete", "vanilla"]
CoordSystem = Literal["grid", "pixels"]
ActionFormat = Literal["qwen", "uitars", "pyautogui", "browsergym"]  # engine.agent.formats
ObserveKind = Literal["screenshot", "axtree", "dom"]  # what each step shows the model (AgentConfig.observe)
INTERACTIONS: tuple[Interaction, ...] = get_args(Interaction)
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = get_args(ResponseFormat)
COORD_SYSTEMS: tuple[CoordSystem, ...] = get_args(CoordSystem)
ACTION_FORMATS: tuple[ActionFormat, ...] = get_args(ActionFormat)
OBSERVE_KINDS: tuple[ObserveKind, ...] = get_args(ObserveKind)
ID_FORMATS: frozenset[str] = frozenset({"browsergym"})  # formats whose actions name the tree's elements by id

_COORD_ACTIONS = ["left_click", "type", "scroll", "wait", "go_back", "navigate", "answer"]
_SOM_ACTIONS = ["left_click", "type", "hover", "select", "scroll", "wait", "go_back", "navigate", "answer"]

_ACTION_HELP = {
    "left_click": "Click the left mouse button on the element at `coordinate`.",
    "type": "Click the text field at `coordinate`, clear it, type `text`, then press Enter.",
    "hover": "Move the mouse over an element.",
    "select": "Choose the option `text` in a drop-down list.",
    "scroll": "Scroll the page by one screen in `direction` (up or down).",
    "wait": "Wait `time` seconds for the page to change.",
    "go_back": "Go back to the previous page.",
    "navigate": "Open `url` in the current tab.",
    "answer": "Finish the task and give the final answer in `text`.",
}

SYSTEM_TEMPLATE = """\
You are a web agent. You operate a web browser to complete the user's task. After every action you \
see a screenshot of the current page.

# Tools

You may call one function to interact with the browser.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
${tools}
</tools>

For the function call, return a json object with the function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>

# Response format

${response_format}"""

# Both formats end with the action sentence and the one tool call.
_ACTION_AND_CALL = """\
Action: one sentence that describes the next action
<tool_call>
{"name": "computer_use", "arguments": {...}}
</tool_call>
Call exactly one function per reply. When the task is complete, use the `answer` action with your \
final answer."""

COMPLETE_FORMAT = """\
Reply in exactly this format:
Memory: a JSON list of the facts from earlier pages that you will need later; copy your previous Memory \
and append to it, never remove anything
Progress: a JSON object mapping each part of the task to "done", "in progress" or "todo"
Intention: what you want to achieve with the next action
""" + _ACTION_AND_CALL

VANILLA_FORMAT = "Reply in exactly this format:\n" + _ACTION_AND_CALL

FIRST_USER_TEMPLATE = "Task: $task\nInitial website: $website"
SUMMARY_HEADER = "Previous actions:"
SUMMARY_LINE = "Step $step on [$title]: $action -> $effect"
STEP_USER_TEMPLATE = ""  # later turns carry only the screenshot (plus the element list in SoM mode)
ELEMENTS_HEADER = "Interactive elements on the screenshot:"
ELEMENT_LINE = "id: $id, text: $text, tag: $tag"
PAGE_LINE = "Page: $title ($url)"  # each step's page in the modes that show the accessibility tree
TREE_HEADER = "Accessibility tree of the page (ids in brackets):"


@dataclass(frozen=True)
class PromptTemplates:
    """Every template of the prompt; any of them can be overridden from a file."""

    system: str = SYSTEM_TEMPLATE
    complete_format: str = COMPLETE_FORMAT
    vanilla_format: str = VANILLA_FORMAT
    first_user: str = FIRST_USER_TEMPLATE
    summary_header: str = SUMMARY_HEADER
    summary_line: str = SUMMARY_LINE
    step_user: str = STEP_USER_TEMPLATE
    elements_header: str = ELEMENTS_HEADER
    element_line: str = ELEMENT_LINE
    page_line: str = PAGE_LINE
    tree_header: str = TREE_HEADER

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplates:
        """Templates from ``path``: a ``.json`` object with any of the field names, or a text file that
        replaces the system template. Unknown keys and unknown placeholders are errors."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{p}: cannot read prompt template: {exc.strerror}") from None
        if p.suffix != ".json":
            overrides: dict[str, Any] = {"system": text}
        else:
            try:
                overrides = json_input.loads(text)
            except ValueError as exc:
                raise ValueError(f"{p}: invalid JSON: {exc}") from None
            if not isinstance(overrides, dict):
                raise ValueError(f"{p}: expected a JSON object of templates")
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"{p}: unknown template {key!r}; expected one of {', '.join(sorted(known))}")
            if not isinstance(value, str):
                raise ValueError(f"{p}: template {key!r} must be a string")
        templates = replace(cls(), **overrides)
        templates.check()
        return templates

    def check(self) -> None:
        """Raise ValueError when a template uses a placeholder it will not be given."""
        for f in fields(self):
            allowed = _PLACEHOLDERS[f.name]
            for name in _placeholders(getattr(self, f.name)):
                if name not in allowed:
                    raise ValueError(f"template {f.name!r}: unknown placeholder ${name}; "
                                     f"available: {', '.join('$' + a for a in sorted(allowed)) or 'none'}")


_PLACEHOLDERS: dict[str, set[str]] = {
    "system": {"tools", "response_format", "screen_width", "screen_height"},
    "complete_format": set(),
    "vanilla_format": set(),
    "first_user": {"task", "website"},
    "summary_header": set(),
    "summary_line": {"step", "title", "url", "action", "effect"},
    "step_user": {"step", "title", "url"},
    "elements_header": set(),
    "element_line": {"id", "text", "tag"},
    "page_line": {"step", "title", "url"},
    "tree_header": set(),
}


def _placeholders(template: str) -> set[str]:
    names: set[str] = set()
    for _, named, braced, _ in string.Template.pattern.findall(template):
        if named or braced:
            names.add(named or braced)
    return names


class _KeepMissing(dict[str, Any]):
    """Values for ``str.format_map``; a name without a value comes back as it was written."""

    def __missing__(self, key: str) -> str:
        if key.startswith(_BRACED):
            name = key[len(_BRACED):]
            return self[name] if name in self else "${" + name + "}"
        return "$" + key


_BRACED = "\x00"  # marks a ${name} placeholder in the compiled string, so that it is kept as written


@functools.lru_cache(maxsize=128)
def _format_string(template: str) -> str:
    """``template`` as a ``str.format`` string: filled once per element and step, so it is compiled once."""
    def convert(m: re.Match[str]) -> str:
        if m.group("escaped") is not None:
            return "$"
        if m.group("named") is not None:
            return "{" + m.group("named") + "}"
        if m.group("braced") is not None:
            return "{" + _BRACED + m.group("braced") + "}"
        return m.group(0)  # a lone "$" stays as written, like safe_substitute
    out, last = [], 0
    for m in string.Template.pattern.finditer(template):
        out.append(template[last:m.start()].replace("{", "{{").replace("}", "}}"))
        out.append(convert(m))
        last = m.end()
    out.append(template[last:].replace("{", "{{").replace("}", "}}"))
    return "".join(out)


def fill(template: str, **values: Any) -> str:
    """Substitute ``values`` into ``template`` with ``string.Template`` rules (``$$`` is a literal dollar;
    missing names stay as written), through a cached ``str.format`` string (a prompt has hundreds)."""
    return _format_string(template).format_map(_KeepMissing({k: str(v) for k, v in values.items()}))


def fill_rows(template: str, rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """``fill`` of one template per row of values (the Set-of-Marks element lines: one per element and step)."""
    fmt = _format_string(template).format_map
    return [fmt(_KeepMissing(row)) for row in rows]


@dataclass(frozen=True)
class AgentConfig:
    """How the agent talks to the model."""

    interaction: Interaction = "coordinates"
    response_format: ResponseFormat = "complete"
    coords: CoordSystem = "grid"  # grid (0..1000, Qwen3-VL) | pixels (smart_resize'd image, Qwen2.5-VL / UI-TARS)
    action_format: ActionFormat = "qwen"  # the grammar of the replies (engine.agent.formats)
    # What each step shows the model: the screenshot, the page's accessibility tree (engine.agent.tree_text), or
    # both (a hybrid agent); without the screenshot the prompt has no image (text-only models).
    observe: tuple[ObserveKind, ...] = ("screenshot",)
    window: int = 4  # rounds kept as full multimodal messages
    template_file: str | None = None
    # smart_resize parameters of the model's image processor (pixels mode and the recorded frames).
    resize_factor: int | None = None  # default: 32 for grid (Qwen3-VL), 28 for pixels (Qwen2.5-VL)
    min_pixels: int | None = None
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        check_choices(self)
        if self.som and self.action_format != "qwen" and not (self.action_format in ID_FORMATS and self.axtree):
            raise ValueError(f"Set-of-Marks needs the qwen action format, or an id-based one with the tree: "
                             f"{self.action_format} has no element ids")
        if self.window < 0:
            raise ValueError("the context window must be >= 0 rounds")
        observe = tuple(self.observe)
        object.__setattr__(self, "observe", observe)  # a list from a file is kept as a tuple (hashable, frozen)
        if not observe or len(set(observe)) != len(observe) or any(k not in OBSERVE_KINDS for k in observe):
            raise ValueError(f"observe must name each of {', '.join(OBSERVE_KINDS)} at most once (at least one), "
                             f"not {','.join(map(str, observe)) or 'nothing'}")
        if self.dom and not (self.screenshot or self.axtree):
            raise ValueError("the DOM snapshot marks the tree's elements (and is recorded beside the screenshot): "
                             "observe axtree or screenshot too")
        if self.action_format in ID_FORMATS and not self.axtree:
            raise ValueError(f"the {self.action_format} action format names elements of the accessibility tree: "
                             "observe axtree too")
        if not self.screenshot and self.action_format not in ID_FORMATS:
            raise ValueError(f"without the screenshot the model has no coordinates to give: the "
                             f"{self.action_format} action format needs it (or use browsergym, which names the "
                             "tree's elements)")
        if self.som and not self.screenshot:
            raise ValueError("Set-of-Marks draws on the screenshot: observe screenshot too")

    @property
    def som(self) -> bool:
        return self.interaction == "som"

    @property
    def axtree(self) -> bool:
        """Each step shows the page's accessibility tree."""
        return "axtree" in self.observe

    @property
    def dom(self) -> bool:
        """Each step carries the page's DOM snapshot: its marks (clickable, visible) on the tree's lines."""
        return "dom" in self.observe

    @property
    def screenshot(self) -> bool:
        """Each step shows the screenshot."""
        return "screenshot" in self.observe

    def templates(self) -> PromptTemplates:
        return PromptTemplates.from_file(self.template_file) if self.template_file else PromptTemplates()


def tool_schema(cfg: AgentConfig, screen_width: int, screen_height: int) -> dict[str, Any]:
    """The ``computer_use`` function definition (Qwen-Agent's shape) for this interaction mode."""
    actions = _SOM_ACTIONS if cfg.som else _COORD_ACTIONS
    if cfg.coords == "grid":
        screen = ("The screen's coordinates run from 0 to 1000 on both axes, whatever its real size: "
                  "(0, 0) is the top-left corner and (1000, 1000) the bottom-right corner.")
    else:
        screen = f"The screen's resolution is {screen_width}x{screen_height} pixels."
    description = ("Use a mouse and keyboard to interact with a web browser, and take screenshots.\n"
                   f"* {screen}\n"
                   "* Aim at the centre of an element, not its edge.\n"
                   "* The actions are:\n" + "\n".join(f"  - `{a}`: {_ACTION_HELP[a]}" for a in actions))
    properties: dict[str, Any] = {
        "action": {"description": "The action to perform.", "enum": actions, "type": "string"},
        "coordinate": {"description": "(x, y): the point to click or type at, on the screen's coordinates.",
                       "type": "array"},
        "text": {"description": "Text to type, option to select, or the final answer.", "type": "string"},
        "direction": {"description": "Scroll direction.", "enum": ["up", "down"], "type": "string"},
        "time": {"description": "Seconds to wait.", "type": "number"},
        "url": {"description": "The URL to open.", "type": "string"},
    }
    if cfg.som:
        description += ("\n* Elements are marked on the screenshot with numbered boxes and listed with their id; "
                        "give `element_id` instead of `coordinate` to act on one.")
        properties["element_id"] = {"description": "The number of a marked element.", "type": "integer"}
    return {"type": "function", "function": {
        "name": "computer_use", "description": description,
        "parameters": {"properties": properties, "required": ["action"], "type": "object"}}}


def system_prompt(cfg: AgentConfig, templates: PromptTemplates, screen_width: int, screen_height: int) -> str:
    """The system message for a screen (or model image) of the given size."""
    tools = json.dumps(tool_schema(cfg, screen_width, screen_height), ensure_ascii=False)
    fmt = templates.complete_format if cfg.response_format == "complete" else templates.vanilla_format
    return fill(templates.system, tools=tools, response_format=fmt,
                screen_width=screen_width, screen_height=screen_height)
