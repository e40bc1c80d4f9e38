"""Telling a program's request from one a web page sent, for the engine's HTTP servers on this machine (the lease
API of ``webgym-engine serve`` and the viewer's ``--serve``).

Loopback is not private from the web browser on the same machine. A page of any site can send requests to
``127.0.0.1`` without asking first (a ``no-cors`` fetch, an image), and a site that points its own name at
``127.0.0.1`` (DNS rebinding) can read the answers too. The browser marks such requests (``Origin``,
``Sec-Fetch-Site``) and names the site's host in ``Host``; the engine's own clients are programs, which do neither.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol


class Headers(Protocol):
    """A request's headers (aiohttp's, or http.server's message)."""

    def get(self, name: str) -> str | None: ...


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name or address of a ``Host`` header, without its port or IPv6 brackets, lowercased."""
    host = host_header.lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def web_page_refusal(headers: Headers, bound_host: str, own_origin: str | None = None) -> str | None:
    """Why a request to a server bound on ``bound_host`` must be refused as one a web page sent, or None.

    Refused: a request the browser marks as a page's (``Sec-Fetch-Site`` other than ``same-origin``, or ``none``
    for the user's own navigation), an ``Origin`` other than ``own_origin``, and, on loopback, a ``Host`` that is
    not a loopback name (a browser always sends one)."""
    site = headers.get("Sec-Fetch-Site")
    origin = headers.get("Origin")
    if (site is not None and site not in ("same-origin", "none")) or (origin is not None and origin != own_origin):
        return "requests from web pages of other sites are refused"
    host = headers.get("Host")
    if host is not None and is_loopback(bound_host) and not is_loopback(host_name(host)):
        return f"Host {host[:100]!r} is not a loopback name: this server listens on {bound_host} only"
    return None
