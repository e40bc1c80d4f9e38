"""The Qwen-VL web agent protocol: reply parsing and coordinate mapping."""

from __future__ import annotations

from .coords import CoordFrame, describe_frames, parse_action, to_action
from .parser import ParsedReply, parse_reply, strip_think

__all__ = ["CoordFrame", "ParsedReply", "describe_frames", "parse_action", "parse_reply", "strip_think", "to_action"]
