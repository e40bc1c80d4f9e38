"""Tolerant parsing of a Qwen-VL web agent reply (fields, ``<think>`` blocks, ``<tool_call>`` JSON).

Nothing here raises: a malformed reply yields a :class:`ParsedReply` whose ``error`` says what went wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_FIELD_NAMES = r"Thought|Action|Memory_Updated|Memory|Progress|Intention"
_FIELD = re.compile(
    rf"^[ \t>*#_-]*(?P<name>{_FIELD_NAMES})[ \t*_]*:[ \t*_]*(?P<body>.*?)"
    rf"(?=^[ \t>*#_-]*(?:{_FIELD_NAMES})[ \t*_]*:|<tool_call>|\Z)",
    re.DOTALL | re.IGNORECASE | re.MULTILINE,
)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$", re.IGNORECASE)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


@dataclass
class ParsedReply:
    """The parts of one assistant reply."""

    thought: str | None = None
    action_text: str | None = None
    memory: str | None = None
    progress: str | None = None
    intention: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    raw: str = ""


def _split_think(text: str) -> tuple[str, str | None]:
    """``(text without think blocks, the think content or None)``."""
    thoughts = [m.group(0)[7:-8].strip() for m in _THINK_BLOCK.finditer(text)]
    text = _THINK_BLOCK.sub("", text)
    close = list(_THINK_CLOSE.finditer(text))
    if close:  # opening tag missing: everything before the last lone </think> is thinking
        last = close[-1]
        head = _THINK_CLOSE.sub("", _THINK_OPEN.sub("", text[: last.start()])).strip()
        if head:
            thoughts.append(head)
        text = text[last.end():]
    text = _THINK_OPEN.sub("", text)
    joined = "\n\n".join(t for t in thoughts if t)
    return text, (joined or None)


def strip_think(text: str) -> str:
    """The reply without its ``<think>`` content (for the assistant history)."""
    try:
        return _split_think(text)[0].strip()
    except Exception:  # noqa: BLE001 - never raise on model output
        return text if isinstance(text, str) else ""


def _repair_json(s: str) -> str:
    """Fix only unambiguous defects: trailing commas, single-quoted strings, Python literals."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"' or c == "'":
            quote, j, buf = c, i + 1, []
            while j < n and s[j] != quote:
                if s[j] == "\\" and j + 1 < n:
                    nxt = s[j + 1]
                    buf.append("'" if nxt == "'" else "\\" + nxt)
                    j += 2
                    continue
                buf.append('\\"' if s[j] == '"' else s[j])
                j += 1
            if j >= n:
                raise ValueError("unterminated string")
            out.append('"' + "".join(buf) + '"')
            i = j + 1
        elif c == ",":
            j = i + 1
            while j < n and s[j].isspace():
                j += 1
            if j < n and s[j] in "}]":
                i += 1  # trailing comma
            else:
                out.append(c)
                i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (s[j].isalnum() or s[j] == "_"):
                j += 1
            word = s[i:j]
            out.append(_PY_LITERALS.get(word, word))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _load_call(body: str) -> dict[str, Any]:
    """Decode one tool call body, repairing it if needed; raises ValueError."""
    body = _FENCE.sub("", body.strip()).strip()
    start = body.find("{")
    if start < 0:
        raise ValueError("no JSON object")
    body = body[start:]
    dec = json.JSONDecoder(strict=False)
    try:
        obj, _ = dec.raw_decode(body)
    except ValueError as first:
        try:
            obj, _ = dec.raw_decode(_repair_json(body))
        except ValueError:
            raise ValueError(f"invalid JSON ({first})") from None
    if not isinstance(obj, dict):
        raise ValueError("tool call is not a JSON object")
    args = obj.get("arguments")
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            obj["arguments"] = json.loads(args)
        except ValueError:
            try:
                obj["arguments"] = json.loads(_repair_json(args))
            except ValueError:
                raise ValueError("arguments are a string that is not JSON") from None
    if not isinstance(obj.get("arguments", {}), dict):
        raise ValueError("arguments are not a JSON object")
    return obj


def _parse(text: str) -> ParsedReply:
    reply = ParsedReply(raw=text)
    body, think = _split_think(text)
    errors: list[str] = []
    for i, m in enumerate(_TOOL_CALL.finditer(body)):
        try:
            reply.tool_calls.append(_load_call(m.group(1)))
        except (ValueError, RecursionError) as e:
            errors.append(f"tool_call {i}: {e}")
    fields_text = _TOOL_CALL.sub("", body)
    for m in _FIELD.finditer(fields_text):
        name = m.group("name").lower()
        value = m.group("body").strip()
        attr = {"thought": "thought", "action": "action_text", "memory": "memory", "memory_updated": "memory",
                "progress": "progress", "intention": "intention"}[name]
        if getattr(reply, attr) is None:
            setattr(reply, attr, value)
    if reply.thought is None and think:
        reply.thought = think
    if not reply.tool_calls:
        if errors:
            reply.error = "; ".join(errors)
        elif not text.strip():
            reply.error = "empty reply"
        else:
            reply.error = "no <tool_call> in reply"
    elif errors:
        reply.error = "; ".join(errors)
    return reply


def parse_reply(text: str) -> ParsedReply:
    """Parse a reply; never raises (problems go to ``error``)."""
    if not isinstance(text, str):
        return ParsedReply(error=f"reply is {type(text).__name__}, not str", raw="")
    try:
        return _parse(text)
    except Exception as e:  # noqa: BLE001 - never raise on model output
        return ParsedReply(error=f"parse failure: {e!r}", raw=text)
