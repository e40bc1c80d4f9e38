"""Upstream proxies: the network proxy of each browser context reaches websites through one of them.

``WorkerConfig.proxies`` lists proxy URLs, ``http://HOST:PORT``, with credentials, where a proxy needs them,
named by environment variables: ``http://$PROXY_USER:$PROXY_PASS@HOST:PORT``. The names, not the values, are in
the configuration, the manifest and the logs; the values are read from the worker's environment (the pool passes
exactly these variables to the workers it spawns). Each context sticks to one proxy (the same address for a whole
episode, as a person's browser has); a proxy that fails (no connection, a refused CONNECT, a 407) is set aside for
``cooldown_s`` and the context moves to the next one. Every connection goes through the proxy as a CONNECT
tunnel to the address the network policy checked (so the proxy must allow CONNECT to the ports pages use, 80 and
443 at least).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

_ENV_NAME = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
MAX_REPLY_HEAD = 16 * 1024


class ProxyError(OSError):
    """No proxy of the pool could open the tunnel."""


class TargetUnreachable(OSError):
    """The proxy answered, but could not reach the target (its fault is the target's, not the proxy's)."""


@dataclass
class UpstreamProxy:
    """One proxy: where it is, its ``Proxy-Authorization`` (never shown), and until when it is set aside."""

    host: str
    port: int
    shown: str  # host:port, for logs and records
    authorization: str | None = None
    failed_until: float = 0.0
    failures: int = 0


def env_names(url: str) -> list[str]:
    """The environment variables a proxy URL names for its credentials."""
    parts = urlsplit(url)
    return [m.group(1) for v in (parts.username, parts.password) if v and (m := _ENV_NAME.match(v))]


def parse_proxy(url: str, env: Mapping[str, str] | None = None) -> UpstreamProxy:
    """An :class:`UpstreamProxy` from ``http://[$USER:$PASS@]HOST:PORT``; ValueError for anything else (a
    credential written out rather than named, a missing variable, another scheme)."""
    env = os.environ if env is None else env
    parts = urlsplit(url.strip())
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"a proxy is http://[$USER:$PASS@]HOST:PORT, not {_shown(url)!r}")
    authorization = None
    if parts.username is not None or parts.password is not None:
        names = env_names(url)
        if len(names) != 2:
            raise ValueError(f"proxy {_shown(url)}: name its credentials by environment variables "
                             "($USER_VAR:$PASS_VAR), never write them out")
        missing = [n for n in names if n not in env]
        if missing:
            raise ValueError(f"proxy {_shown(url)}: environment variable(s) {', '.join(missing)} not set")
        token = base64.b64encode(f"{env[names[0]]}:{env[names[1]]}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return UpstreamProxy(parts.hostname, parts.port, f"{parts.hostname}:{parts.port}", authorization)


def _shown(url: str) -> str:
    parts = urlsplit(url.strip())
    return f"{parts.scheme}://{parts.hostname}:{parts.port}" if parts.hostname else "(unparsable)"


class ProxyPool:
    """The worker's upstream proxies (see the module docstring)."""

    def __init__(self, urls: list[str], env: Mapping[str, str] | None = None, cooldown_s: float = 60.0,
                 timeout_s: float = 10.0) -> None:
        self.proxies = [parse_proxy(u, env) for u in urls]
        if not self.proxies:
            raise ValueError("a proxy pool needs at least one proxy")
        self.cooldown_s = cooldown_s
        self.timeout_s = timeout_s
        self._next = itertools.cycle(range(len(self.proxies)))

    def pick(self, current: UpstreamProxy | None = None) -> UpstreamProxy:
        """``current`` while it is healthy, else the next healthy proxy in turn (all set aside: the one back
        soonest)."""
        now = time.monotonic()
        if current is not None and current.failed_until <= now:
            return current
        for _ in range(len(self.proxies)):
            proxy = self.proxies[next(self._next)]
            if proxy.failed_until <= now:
                return proxy
        return min(self.proxies, key=lambda p: p.failed_until)

    def failed(self, proxy: UpstreamProxy) -> None:
        proxy.failures += 1
        proxy.failed_until = time.monotonic() + self.cooldown_s

    async def tunnel(self, host: str, port: int, current: UpstreamProxy | None
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, UpstreamProxy]:
        """A CONNECT tunnel to ``host:port`` through ``current`` or, when it fails, the next proxies in turn."""
        errors = []
        proxy = self.pick(current)
        for _ in range(len(self.proxies)):
            try:
                async with asyncio.timeout(self.timeout_s):
                    reader, writer = await self._connect(proxy, host, port)
                return reader, writer, proxy
            except TargetUnreachable:
                raise
            except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                self.failed(proxy)
                errors.append(f"{proxy.shown}: {type(exc).__name__}: {exc}")
                proxy = self.pick(None)
        raise ProxyError(f"no proxy could reach {host}:{port} ({'; '.join(errors)})")

    async def _connect(self, proxy: UpstreamProxy, host: str, port: int
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port, limit=MAX_REPLY_HEAD)
        try:
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            if proxy.authorization:
                head += f"Proxy-Authorization: {proxy.authorization}\r\n"
            writer.write((head + "\r\n").encode("latin-1"))
            reply = await reader.readuntil(b"\r\n\r\n")
            status = reply.split(b" ", 2)[1:2]
            if status != [b"200"]:
                line = reply.split(b"\r\n", 1)[0].decode("latin-1", "replace")[:120]
                if status == [b"407"]:  # the proxy refuses us: its credentials
                    raise OSError(f"CONNECT refused: {line}")
                raise TargetUnreachable(f"via {proxy.shown}: {line}")
            return reader, writer
        except BaseException:
            writer.transport.abort()
            raise
