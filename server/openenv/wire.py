"""OpenEnv's wire format (``openenv`` 0.10.0, ``core/env_server/types.py`` and ``http_server.py``): the client's
messages on ``/ws``, the server's replies and the error codes, as its server sends them.

A client frame is a JSON object ``{"type": T, "data": {...}}`` with T one of reset, step, state, close (``data``
optional for reset, required for step, absent otherwise); any other key is refused as OpenEnv's models refuse it
(``extra="forbid"``). Each frame gets one reply, in order: ``{"type": "observation" | "state" | "error", "data":
...}``; ``close`` gets none.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec


class ErrorCode(StrEnum):
    """OpenEnv's ``WSErrorCode``: the first four leave the session open, the others come once, before the close."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


MESSAGE_TYPES = ("reset", "step", "state", "close")


class WireError(Exception):
    """A frame the session answers with an error reply (``code``, ``message`` and OpenEnv's extra fields)."""

    def __init__(self, code: ErrorCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra

    def frame(self) -> bytes:
        return error_frame(self.code, str(self), **self.extra)


def invalid(loc: list[str | int], msg: str, kind: str = "value_error") -> WireError:
    """A ``VALIDATION_ERROR`` with one entry in pydantic's ``errors()`` shape (``type``, ``loc``, ``msg``)."""
    return WireError(ErrorCode.VALIDATION_ERROR, "Invalid message", errors=[{"type": kind, "loc": loc, "msg": msg}])


def read_message(raw: str | bytes, max_bytes: int) -> tuple[str, dict[str, Any] | None]:
    """A client frame's type and data; :class:`WireError` for what OpenEnv's server refuses (not JSON, not an
    object, an unknown type, keys beyond ``type`` and ``data``, a ``data`` that is not an object)."""
    size = len(raw)
    if size > max_bytes:
        raise invalid([], f"a message of {size} bytes: the limit is {max_bytes}", "too_long")
    try:
        message = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise WireError(ErrorCode.INVALID_JSON, f"Invalid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise invalid([], f"a message is a JSON object, not {type(message).__name__}", "model_type")
    kind = message.get("type", "")
    if kind not in MESSAGE_TYPES:
        raise WireError(ErrorCode.UNKNOWN_TYPE, f"Unknown message type: {kind}")
    extra = sorted(str(k) for k in message if k not in ("type", "data"))
    if extra:
        raise invalid([extra[0]], "Extra inputs are not permitted", "extra_forbidden")
    data = message.get("data")
    if kind == "step" and data is None:
        raise invalid(["data"], "Field required", "missing")
    if data is not None and not isinstance(data, dict):
        raise invalid(["data"], "Input should be a valid dictionary", "dict_type")
    if kind in ("state", "close") and data is not None:
        raise invalid(["data"], "Extra inputs are not permitted", "extra_forbidden")
    return kind, data


def error_frame(code: ErrorCode, message: str, **extra: Any) -> bytes:
    """``{"type": "error", "data": {"message", "code", ...}}``."""
    return msgspec.json.encode({"type": "error", "data": {"message": message, "code": code.value, **extra}})


def observation_frame(data: dict[str, Any]) -> bytes:
    """``{"type": "observation", "data": {"observation", "reward", "done", "metadata"?}}``."""
    return msgspec.json.encode({"type": "observation", "data": data})


def state_frame(data: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"type": "state", "data": data})


def step_result(observation: dict[str, Any], reward: float | None, done: bool) -> dict[str, Any]:
    """OpenEnv's ``serialize_observation``: the observation's fields less reward and done, those two beside it, and
    its metadata once more at the top when it has any."""
    result: dict[str, Any] = {"observation": observation, "reward": reward, "done": done}
    if observation.get("metadata"):
        result["metadata"] = observation["metadata"]
    return result
