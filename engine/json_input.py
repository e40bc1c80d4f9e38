"""JSON from outside the engine (task files, a model server's replies, HTTP bodies, files other runs share), read
so that every refusal is a ``ValueError``.

``json.loads`` refuses most bad input with ``ValueError`` (``JSONDecodeError``, and an integer of more than 4,300
digits), but arrays or objects nested deeper than the parser recurses raise ``RecursionError``, which callers that
catch ``ValueError`` let through: 100 kB of ``[`` is enough.
"""

from __future__ import annotations

import json
from typing import Any


class NestedTooDeep(ValueError):
    """JSON nested deeper than the parser goes (its ``RecursionError``, as a ``ValueError``)."""


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``; raises ``ValueError`` for anything it cannot read (:class:`NestedTooDeep` for nesting)."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise NestedTooDeep(str(exc)) from None
