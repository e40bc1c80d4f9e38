"""Tolerant parsing of a Qwen-VL web agent reply (fields, ``<think>`` blocks, ``<tool_call>`` JSON).

Nothing here raises: a malformed reply yields a :class:`ParsedReply` whose ``error`` says what went wrong.
Parsing runs on the engine's event loop, so it is linear in the reply's length whatever the reply holds: tags are
found by literal patterns (no pattern that can backtrack over a long run of text), and a reply longer than
MAX_REPLY_CHARS (far more than a step's token budget) is cut there and flagged.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_REPLY_CHARS = 64_000  # ~16k tokens; a step's replies are capped far below that (max_tokens)
MAX_TOOL_CALLS = 16  # tool calls read per reply (the first valid one is the action); the rest are counted
_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
_TOOL_TAG = re.compile(r"<(/?)tool_call>", re.IGNORECASE)
_FIELD_NAMES = r"Thought|Action|Memory_Updated|Memory|Progress|Intention"
# A field's head at a line start ("Thought:", "**Action**:", "> Memory:"); its body runs to the next head. Possessive
# runs (*+): a long run of spaces before a word that is no field is read once, not backtracked.
_FIELD_HEAD = re.compile(rf"^[ \t>*#_-]*+(?P<name>{_FIELD_NAMES})[ \t*_]*+:[ \t*_]*+", re.IGNORECASE | re.MULTILINE)
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
    call_numbers: list[int] = field(default_factory=list)  # each decoded tool call's place among the reply's calls
    skipped: list[str] = field(default_factory=list)  # "tool_call N: why" for each call that could not be decoded
    truncated: bool = False  # the reply was longer than MAX_REPLY_CHARS: only its start was read


def _split_think(text: str) -> tuple[str, str | None]:
    """``(text without think blocks, the think content or None)``: each ``<think>`` pairs with the next
    ``</think>``; before the last ``</think>`` left without an opening tag, everything is thinking; tags left over
    are dropped."""
    if _THINK_TAG.search(text) is None:  # most replies: the history re-reads each one for several steps
        return text, None
    thoughts: list[str] = []
    rest: list[str] = []  # the text outside complete blocks
    pos, opened = 0, None  # opened: the <think> still waiting for its </think>
    for tag in _THINK_TAG.finditer(text):
        closing = bool(tag.group(1))
        if opened is None:
            if not closing:
                opened = tag
        elif closing:
            rest.append(text[pos:opened.start()])
            thoughts.append(text[opened.end():tag.start()].strip())
            pos, opened = tag.end(), None
    rest.append(text[pos:])
    body = "".join(rest)
    last_close = None
    for tag in _THINK_TAG.finditer(body):
        if tag.group(1):
            last_close = tag
    if last_close is not None:  # opening tag missing: everything before the last lone </think> is thinking
        head = _THINK_TAG.sub("", body[:last_close.start()]).strip()
        if head:
            thoughts.append(head)
        body = body[last_close.end():]
    body = _THINK_TAG.sub("", body)
    joined = "\n\n".join(t for t in thoughts if t)
    return body, (joined or None)


def _tool_call_bodies(text: str) -> tuple[list[str], str]:
    """The bodies of the ``<tool_call>`` blocks (each ends at ``</tool_call>``, the next ``<tool_call>`` or the
    end of the reply) and the text outside them."""
    bodies: list[str] = []
    outside: list[str] = []
    pos, start = 0, None  # start: where the open block's body begins
    for tag in _TOOL_TAG.finditer(text):
        if start is not None:
            bodies.append(text[start:tag.start()])
            start = None
            if tag.group(1):
                pos = tag.end()
                continue
            pos = tag.start()
        if not tag.group(1):  # an opening tag
            outside.append(text[pos:tag.start()])
            start = tag.end()
    if start is not None:
        bodies.append(text[start:])
    else:
        outside.append(text[pos:])
    return bodies, "".join(outside)


def _unfence(body: str) -> str:
    """A tool call body without a Markdown code fence around it (```json ... ```)."""
    body = body.strip()
    if body.startswith("```"):
        body = body[3:]
        if body[:4].lower() == "json":
            body = body[4:]
    if body.endswith("```"):
        body = body[:-3]
    return body.strip()


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
    body = _unfence(body)
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
    errors = reply.skipped
    calls, fields_text = _tool_call_bodies(body)
    for i, call in enumerate(calls[:MAX_TOOL_CALLS]):
        try:
            reply.tool_calls.append(_load_call(call))
            reply.call_numbers.append(i)
        except Exception as e:  # noqa: BLE001 - one broken call must not lose the next one
            errors.append(f"tool_call {i}: {skip_reason(e)}")
    if len(calls) > MAX_TOOL_CALLS:
        errors.append(f"{len(calls) - MAX_TOOL_CALLS} tool calls past the first {MAX_TOOL_CALLS} not read")
    heads = list(_FIELD_HEAD.finditer(fields_text))
    ends = [h.start() for h in heads[1:]] + [len(fields_text)]
    for m, end in zip(heads, ends, strict=False):  # no heads: no ends used
        name = m.group("name").lower()
        value = fields_text[m.end():end].strip()
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


def skip_reason(exc: BaseException) -> str:
    """Why a tool call was skipped, from what it raised: a ValueError's message, the type and message of others."""
    text = str(exc)[:300]
    return text if type(exc) is ValueError else f"{type(exc).__name__}: {text}"


def parse_reply(text: str) -> ParsedReply:
    """Parse a reply; never raises (problems go to ``error``). A reply over MAX_REPLY_CHARS is parsed up to
    there, with ``truncated`` set."""
    if not isinstance(text, str):
        return ParsedReply(error=f"reply is {type(text).__name__}, not str", raw="")
    truncated = len(text) > MAX_REPLY_CHARS
    if truncated:
        text = text[:MAX_REPLY_CHARS]
    try:
        reply = _parse(text)
    except Exception as e:  # noqa: BLE001 - never raise on model output
        reply = ParsedReply(error=f"parse failure: {e!r}", raw=text)
    reply.truncated = truncated
    return reply
