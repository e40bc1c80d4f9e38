"""Hosts, ports and IP addresses as the network rules (``netpolicy.py``) and the forward proxy (``proxy.py``) parse
and compare them."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _norm_host(host: str) -> str:
    """A host as the rules compare it: lowercased, without a trailing dot or IPv6 brackets."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # a zone index (fe80::1%eth0) does not change the rule
    except ValueError:
        return None


def _split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address -> (host, port or None)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"unclosed bracket in {text!r}")
        if not rest:
            return host, None
        if not rest.startswith(":") or not rest[1:].isdigit():
            raise ValueError(f"bad port in {text!r}")
        return host, _port(rest[1:], text)
    if text.count(":") > 1:
        return text, None  # a bare IPv6 address
    host, sep, port = text.partition(":")
    if not sep:
        return host, None
    if not port.isdigit():
        raise ValueError(f"bad port in {text!r}")
    return host, _port(port, text)


def _port(text: str, entry: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {entry!r}")
    return port


_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
