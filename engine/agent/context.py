"""The context window: which past steps the model sees, and how.

The last ``window`` rounds (screenshot, reply) are full multimodal messages; older steps shrink to one
line each in the first user message (``Step i on [title]: action -> page changed``). With the accessibility tree
observed, every round names its page and the current one shows the tree (only it: a tree is thousands of tokens);
without the screenshot, no round has an image. Replies enter the
history without their ``<think>`` blocks. With a window of 4 the model sees five screenshots: four
rounds plus the current page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.agent.policy_api import StepView, view_tree_text
from engine.tasks.schema import Task

from .parser import strip_think
from .prompts import AgentConfig, PromptTemplates, fill, fill_rows


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def element_list(elements: Sequence[Sequence[Any]], templates: PromptTemplates) -> str:
    """The Set-of-Marks text list: one ``id: N, text: <name>, tag: <tag>`` line per element."""
    lines = fill_rows(templates.element_line, ({"id": e[0], "text": e[2], "tag": e[1]} for e in elements))
    return "\n".join([templates.elements_header, *lines]) if lines else templates.elements_header + " none"


def summary_line(step: int, view: StepView, templates: PromptTemplates) -> str:
    """One older step as a line of text."""
    action = view.action_text or (view.action.describe() if view.action else "no action")
    effect = {True: "page changed", False: "page unchanged", None: "page change unknown"}[view.page_changed]
    return fill(templates.summary_line, step=step, title=view.title or view.url, url=view.url,
                action=action, effect=effect)


def build_messages(cfg: AgentConfig, templates: PromptTemplates, system: str, task: Task,
                   history: Sequence[StepView], current: StepView) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """The chat for one decision and the JPEG bytes of every image it references.

    ``history[i]`` is the observation step ``i`` acted on (with its reply); ``current`` is the page now.
    """
    keep = min(cfg.window, len(history))
    older, recent = history[:len(history) - keep], history[len(history) - keep:]
    first = fill(templates.first_user, task=task.task_name, website=task.website)
    if older:
        lines = [summary_line(i, v, templates) for i, v in enumerate(older)]
        first = "\n\n".join([first, "\n".join([templates.summary_header, *lines])])

    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    images: dict[str, bytes] = {}
    start = len(older)
    for offset, view in enumerate([*recent, current]):
        parts: list[dict[str, Any]] = []
        if offset == 0:
            parts.append(_text(first))
        step_text = fill(templates.step_user, step=start + offset, title=view.title, url=view.url)
        if step_text:
            parts.append(_text(step_text))
        if cfg.axtree:  # which page the step was on; the tree itself only for the page now (a tree is long)
            parts.append(_text(fill(templates.page_line, step=start + offset, title=view.title, url=view.url)))
        if cfg.screenshot and view.frame is not None and view.jpeg is not None:
            parts.append({"type": "image", "image": view.frame})
            images[view.frame] = bytes(view.jpeg)
        if cfg.som and view.elements is not None:
            if view.elements_text is None:  # a view stays in the window for several steps: format it once
                view.elements_text = element_list(view.elements, templates)
            parts.append(_text(view.elements_text))
        if cfg.axtree and view is current:
            parts.append(_text(f"{templates.tree_header}\n{view_tree_text(view)}"))
        messages.append({"role": "user", "content": parts})
        if view is not current:
            messages.append({"role": "assistant", "content": strip_think(view.reply or "")})
    return messages, images
