"""Demonstrations for behaviour cloning, from runs of the scripted (or any non-model) policy.

A scripted step records only the action (in CSS pixels), the page (URL, title) and the screenshot. This
module writes what a model-policy step would have recorded for it: the messages the agent protocol would
have given the model at that step (the same :func:`engine.agent.context.build_messages`, templates and
system prompt as :class:`policy.agent_policy.AgentPolicy`, with the demonstration replies of the earlier
steps as the assistant history) and a reply in the model's own format (``vanilla`` or ``complete``) whose
``<tool_call>`` is the recorded action in the model's coordinate frame (the 0..1000 grid by default:
``x_grid = round(1000 * x_css / width)``; or pixels of the ``smart_resize``'d screenshot).

The result has the shape of a model-policy record (``system_prompt``, per step ``messages`` and ``reply``),
so :func:`train.samples.samples_from_records` and :func:`train.export.export_sharegpt` take it as they take a
model run. Parsing a demonstration reply with :func:`engine.agent.coords.parse_action` gives back the
recorded action (coordinates within the frame's rounding: 1 CSS px on the grid for viewports up to 2000 px).

Not expressible in the tool schema, so reported per step in ``demo_warnings``: a ``type`` without the
clearing or the Enter key (the tool always clears and presses Enter). Set-of-Marks runs are converted in
coordinate mode (their element lists are not recorded per step).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine import _imgcodec as codec
from engine.agent.actions import AgentAction
from engine.agent.context import build_messages
from engine.agent.coords import CoordFrame
from engine.agent.model_api import LanguageModel
from engine.agent.policy_api import StepView
from engine.agent.prompts import AgentConfig
from engine.store.records import EpisodeRecord, StepRecord, TaskRecord, reward_value
from engine.store.run_dir import frame_file, read_manifest, read_records
from engine.tasks.schema import Task
from policy.agent_policy import AgentPolicy


class _NoModel(LanguageModel):
    """Stands in for the model so that :class:`AgentPolicy` computes frames and system prompts as it would."""

    name = "demo"

    def __init__(self, resize: dict[str, int] | None) -> None:
        self.resize = resize


def model_point(x: float, y: float, frame: CoordFrame) -> list[int]:
    """A CSS-pixel point in the model's coordinates (grid: 0..1000; pixels: the resized screenshot)."""
    mw, mh = frame.model_size
    return [round(mw * x / frame.width), round(mh * y / frame.height)]


def tool_call(action: AgentAction, frame: CoordFrame) -> tuple[dict[str, Any], list[str]]:
    """The ``computer_use`` call that performs ``action``, and what it cannot express."""
    args: dict[str, Any] = {"action": action.name}
    warnings: list[str] = []
    has_point = action.x is not None and action.y is not None
    if action.name in ("left_click", "hover", "select", "type", "scroll") and has_point:
        args["coordinate"] = model_point(float(action.x), float(action.y), frame)  # type: ignore[arg-type]
    elif action.name in ("left_click", "hover", "select"):
        raise ValueError(f"{action.name} without a point cannot be demonstrated")
    if action.name in ("type", "select", "answer"):
        args["text"] = action.text or ""
    if action.name == "type" and (not action.clear or not action.enter):
        warnings.append("type: the tool always clears the field and presses Enter")
    if action.name == "scroll":
        args["direction"] = action.direction or "down"
    if action.name == "wait" and action.seconds is not None:
        args["time"] = action.seconds
    if action.name == "navigate":
        args["url"] = action.url or ""
    if action.name == "keypress":
        args["keys"] = action.keys or ""
    return {"name": "computer_use", "arguments": args}, warnings


def action_sentence(action: AgentAction, title: str) -> str:
    """The one-sentence ``Action:`` line of a demonstration reply."""
    n = action.name
    page = f" on {title}" if title else ""
    if n == "left_click":
        return f"Click the element at the given point{page}."
    if n == "hover":
        return f"Move the mouse over the element at the given point{page}."
    if n == "type":
        return f"Type {json.dumps(action.text or '')} into the text field and press Enter."
    if n == "select":
        return f"Choose the option {json.dumps(action.text or '')} in the drop-down list."
    if n == "scroll":
        return f"Scroll {action.direction or 'down'} to see more of the page."
    if n == "wait":
        return "Wait for the page to finish loading."
    if n == "go_back":
        return "Go back to the previous page."
    if n == "navigate":
        return f"Open {action.url}."
    if n == "keypress":
        return f"Press {action.keys}."
    return f"Give the final answer: {action.text or ''}"


def demo_reply(action: AgentAction, frame: CoordFrame, response_format: str, *, title: str = "",
               memory: Sequence[str] = (), task_done: bool = False) -> tuple[str, str, list[str]]:
    """``(reply, action sentence, warnings)``: the reply a model in ``response_format`` would give for ``action``."""
    call, warnings = tool_call(action, frame)
    sentence = action_sentence(action, title)
    body = f"Action: {sentence}\n<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
    if response_format == "vanilla":
        return body, sentence, warnings
    progress = {"task": "done" if task_done else "in progress"}
    intention = "Finish the task with the answer." if action.ends_episode else sentence
    head = (f"Memory: {json.dumps(list(memory), ensure_ascii=False)}\nProgress: {json.dumps(progress)}\n"
            f"Intention: {intention}\n")
    return head + body, sentence, warnings


def _viewport(run_dir: Path, step: StepRecord, manifest: dict[str, Any]) -> tuple[int, int]:
    worker = ((manifest.get("config") or {}).get("worker")) or {}
    if worker.get("viewport_width") and worker.get("viewport_height"):
        return int(worker["viewport_width"]), int(worker["viewport_height"])
    # No manifest: the screenshot's size (the workers capture at device scale factor 1).
    return codec.jpeg_size(frame_file(run_dir, step.get("screenshot")).read_bytes())


def demonstration_record(record: EpisodeRecord, run_dir: str | Path, cfg: AgentConfig | None = None, *,
                         resize: dict[str, int] | None = None,
                         manifest: dict[str, Any] | None = None) -> EpisodeRecord:
    """One scripted record as a model-policy record: ``system_prompt``, and per step ``messages`` (without the
    system message), ``reply`` (the demonstration), ``parsed.action_text`` and ``demo_warnings``.

    ``cfg``: the agent protocol to demonstrate (response format, coordinates, context window, templates);
    ``resize``: the model's ``smart_resize`` parameters (as :attr:`LanguageModel.resize`), for pixel coordinates.
    """
    cfg = cfg or AgentConfig()
    if cfg.action_format != "qwen":
        raise ValueError(f"demonstrations are written in the qwen action format, not {cfg.action_format}")
    if cfg.som:  # the element lists are not in the records
        cfg = replace(cfg, interaction="coordinates")
    run_dir = Path(run_dir)
    if manifest is None:
        manifest = read_manifest(run_dir)
    agent = AgentPolicy(_NoModel(resize), cfg)
    task = _task(record["task"])
    out = copy.deepcopy(record)
    out["policy"] = f"demo:{record.get('policy')}"
    history: list[StepView] = []
    system: str | None = None
    for step in out.get("steps") or []:
        width, height = _viewport(run_dir, step, manifest)
        view = StepView(step.get("url", ""), step.get("title", ""), b"", width, height, bool(step.get("settled", True)),
                        step.get("screenshot"))
        frame = agent.coord_frame(view)
        action = AgentAction.from_dict(step["action"])
        messages, _ = build_messages(cfg, agent.templates, agent.system(frame), task, history, view)
        reply, sentence, warnings = demo_reply(action, frame, cfg.response_format, title=view.title,
                                               task_done=action.ends_episode)
        if system is None:
            system = messages[0]["content"]
        # As the rollout records it: the system message once per episode, kept in a step only when it differs.
        step["messages"] = messages[1:] if messages[0]["content"] == system else messages
        step["reply"] = reply
        step["parsed"] = {**(step.get("parsed") or {}), "action_text": sentence}
        step["demo_warnings"] = warnings
        step.pop("token_ids", None)
        step.pop("logprobs", None)
        view.action, view.action_text, view.reply = action, sentence, reply
        view.page_changed = step.get("page_changed")
        history.append(view)
    out["system_prompt"] = system
    return out


def _task(d: TaskRecord) -> Task:
    # Only what the prompt reads: the instruction (the recorded one: MiniWoB's comes from the page) and the
    # start page.
    return Task(task_id=str(d.get("task_id")), task_name=str(d.get("task_name", "")), website=str(d.get("website", "")))


def demonstration_records(run_dir: str | Path, cfg: AgentConfig | None = None, *, only_success: bool = True,
                          resize: dict[str, int] | None = None) -> list[EpisodeRecord]:
    """:func:`demonstration_record` for every record of a run (only the successful ones by default)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    out = []
    for record in read_records(run_dir):
        if only_success and reward_value(record) != 1.0:
            continue
        if not record.get("steps"):
            continue
        out.append(demonstration_record(record, run_dir, cfg, resize=resize, manifest=manifest))
    return out
