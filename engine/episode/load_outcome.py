"""What happened to a page load, as a typed outcome the step records: the open web's failures are observations.

A page that does not load (a host that does not resolve or answer, a bad certificate, a download instead of a
document, an HTTP error) is not an engine error: the browser shows its error page, the policy sees it as a person
would, and the step says what it was. The outcome comes from three places: the browser's net error for the
navigation (``Observation.load_error``), the network proxy's events (it resolves and connects for the browser, so
it knows a DNS failure from a refused connection) and the main document's HTTP status.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Kinds of outcome, in the order the module docstring gives their sources.
LOAD_KINDS = ("dns", "connect", "timeout", "tls", "download", "unreachable", "http_error")

_NET_ERRORS = (  # prefix of the browser's net error -> kind
    ("net::ERR_NAME_NOT_RESOLVED", "dns"), ("net::ERR_NAME_RESOLUTION_FAILED", "dns"),
    ("net::ERR_CONNECTION_REFUSED", "connect"), ("net::ERR_CONNECTION_RESET", "connect"),
    ("net::ERR_CONNECTION_CLOSED", "connect"), ("net::ERR_ADDRESS_UNREACHABLE", "connect"),
    ("net::ERR_CONNECTION_TIMED_OUT", "timeout"), ("net::ERR_TIMED_OUT", "timeout"),
    ("net::ERR_CERT", "tls"), ("net::ERR_SSL", "tls"), ("net::ERR_BAD_SSL", "tls"),
)


def load_outcome(status: int | None, load_error: str | None, events: Iterable[Any] | None) -> dict[str, Any] | None:
    """The outcome of the page load an observation followed (``{"kind", "error", "status"}``, see LOAD_KINDS), or
    None when the document loaded with a status below 400. ``events`` are the observation's page events
    (objects or dicts with ``kind``, ``url``, ``detail``)."""
    found = [(_get(e, "kind"), str(_get(e, "detail") or "")) for e in events or ()]
    unreachable = next((detail for kind, detail in found if kind == "unreachable"), None)
    downloaded = any(kind == "download" for kind, _ in found)
    if load_error is not None:
        if downloaded and load_error.startswith("net::ERR_ABORTED"):
            return {"kind": "download", "error": load_error}
        for prefix, kind in _NET_ERRORS:
            if load_error.startswith(prefix):
                return {"kind": kind, "error": load_error}
        if unreachable is not None:  # the proxy's failure shows in the browser as a failed tunnel
            return {"kind": unreachable.split(":", 1)[0], "error": unreachable}
        return {"kind": "unreachable", "error": load_error}
    if unreachable is not None and status is not None and status >= 500:  # plain http: the proxy's 502 page
        return {"kind": unreachable.split(":", 1)[0], "error": unreachable, "status": status}
    if status is not None and status >= 400:
        return {"kind": "http_error", "status": status}
    if downloaded:
        return {"kind": "download", "error": next(d for k, d in found if k == "download")}
    return None


def _get(event: Any, key: str) -> Any:
    return event.get(key) if isinstance(event, dict) else getattr(event, key, None)
