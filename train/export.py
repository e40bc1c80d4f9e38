"""Export a run as a supervised fine-tuning set for LLaMA-Factory (the original WebGym's trainer).

LLaMA-Factory's ``sharegpt`` format, one sample per step::

    {"conversations": [{"from": "human", "value": "<image>Task: ..."}, {"from": "gpt", "value": "..."}, ...,
                       {"from": "gpt", "value": "<the step's reply>"}],
     "system": "<the system prompt>",
     "images": ["/abs/run/frames/ep/000.jpg", ...]}

The conversation is the step's full context as the model saw it (the context window's earlier rounds with
their replies, then the current observation) and ends with the step's reply. Human turns are at odd
positions and gpt turns at even ones, as LLaMA-Factory requires. Each image part becomes an ``<image>``
placeholder where it stood (text and image parts are concatenated as the Qwen chat template does, with no
separator), and ``images`` lists the files in the same order: there are exactly as many placeholders as
images. Register the file in LLaMA-Factory's ``dataset_info.json`` with :func:`dataset_info`.

Records of non-model policies (scripted) have no messages; they are converted into demonstrations first
(:mod:`train.demos`). LLaMA-Factory trains on every gpt turn unless told otherwise: set
``mask_history: true`` to train on the last reply only, as the original did.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.agent.prompts import AgentConfig
from engine.store.records import EpisodeRecord, StepRecord, reward_value
from engine.store.run_dir import FrameRefError, frame_file, read_manifest, read_records
from train.demos import demonstration_record

IMAGE_PLACEHOLDER = "<image>"
_OUTSIDE = "an image outside the run directory"  # why a step is left out: a reference frame_file refuses


def _turn_text(content: Any, images: list[str], image_path: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content or []:
        if part.get("type") == "image":
            parts.append(IMAGE_PLACEHOLDER)
            images.append(image_path(part["image"]))
        elif "text" in part:
            parts.append(str(part["text"]))
    return "".join(parts)


def step_conversation(record: EpisodeRecord, step: StepRecord, run_dir: Path,
                      relative_to: Path | None = None) -> dict[str, Any]:
    """One step as a sharegpt sample (see the module docstring). Images are absolute paths, or relative to
    ``relative_to`` (LLaMA-Factory's ``media_dir``) when given."""
    images: list[str] = []

    def image_path(ref: str) -> str:
        path = frame_file(run_dir, ref)
        return str(path.relative_to(relative_to.resolve())) if relative_to is not None else str(path)

    system = record.get("system_prompt")
    conversations: list[dict[str, str]] = []
    for message in step["messages"]:
        role = message.get("role")
        if role == "system":  # a step whose system message differed from the episode's
            system = message["content"]
            continue
        text = _turn_text(message.get("content"), images, image_path)
        conversations.append({"from": "gpt" if role == "assistant" else "human", "value": text})
    conversations.append({"from": "gpt", "value": step.get("reply") or ""})
    sample: dict[str, Any] = {"conversations": conversations}
    if system:
        sample["system"] = system
    sample["images"] = images
    return sample


def sharegpt_samples(records: Iterable[EpisodeRecord], run_dir: str | Path, *, only_success: bool = True,
                     agent: AgentConfig | None = None, relative_to: str | Path | None = None,
                     counts: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The sharegpt samples of ``records`` (of the run ``run_dir``); non-model records become demonstrations
    with ``agent`` (default: the run manifest's agent config). ``counts`` collects what was left out."""
    run_dir = Path(run_dir)
    counts = counts if counts is not None else {}
    rel = Path(relative_to) if relative_to is not None else None
    manifest = read_manifest(run_dir)
    if agent is None:
        known = {"interaction", "response_format", "coords", "action_format", "window", "template_file",
                 "resize_factor", "min_pixels", "max_pixels"}
        agent_cfg = {k: v for k, v in ((manifest.get("config") or {}).get("agent") or {}).items() if k in known}
        agent = AgentConfig(**agent_cfg)
    out: list[dict[str, Any]] = []
    for record in records:
        if only_success and reward_value(record) != 1.0:
            counts["not successful"] = counts.get("not successful", 0) + 1
            continue
        steps = record.get("steps") or []
        try:
            if steps and not any(s.get("messages") for s in steps):
                record = demonstration_record(record, run_dir, agent, manifest=manifest)
                steps = record["steps"]
        except FrameRefError:  # a run directory from elsewhere: its images are never read
            counts[_OUTSIDE] = counts.get(_OUTSIDE, 0) + len(steps)
            continue
        for step in steps:
            if not step.get("messages"):
                counts["no messages"] = counts.get("no messages", 0) + 1
                continue
            try:
                out.append(step_conversation(record, step, run_dir, rel))
            except FrameRefError:
                counts[_OUTSIDE] = counts.get(_OUTSIDE, 0) + 1
    return out


def export_sharegpt(run_dir: str | Path, out_path: str | Path, only_success: bool = True, *,
                    agent: AgentConfig | None = None, relative_to: str | Path | None = None) -> dict[str, Any]:
    """Write the steps of ``run_dir`` as a LLaMA-Factory sharegpt file (a JSON array; JSON lines when
    ``out_path`` ends in ``.jsonl``). Returns ``{"samples": n, "skipped": {...}, "out": path}``."""
    run_dir = Path(run_dir)
    counts: dict[str, int] = {}
    samples = sharegpt_samples(read_records(run_dir), run_dir, only_success=only_success, agent=agent,
                               relative_to=relative_to, counts=counts)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        if out.suffix == ".jsonl":
            for sample in samples:
                f.write(json.dumps(sample, ensure_ascii=False) + "\n")
        else:
            json.dump(samples, f, ensure_ascii=False, indent=1)
    tmp.replace(out)  # never a half-written data set
    return {"samples": len(samples), "skipped": counts, "out": str(out)}


def dataset_info(name: str, file_name: str) -> dict[str, Any]:
    """The ``dataset_info.json`` entry that makes LLaMA-Factory read an exported file."""
    return {name: {"file_name": file_name, "formatting": "sharegpt",
                   "columns": {"messages": "conversations", "system": "system", "images": "images"}}}
