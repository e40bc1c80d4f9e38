"""A client of the Omniboxes API written from its reference (../shared/reference-omniboxes.md, sections 1-3 and
7): what WebGym's MasterClient and AsyncWebRL's workflow send, with their headers, parameters and body shapes.
The tests and the benchmark drive ``webgym-engine serve`` through it; it knows nothing of the engine."""

from __future__ import annotations

from typing import Any

import aiohttp


class OmniboxError(Exception):
    """A non-200 answer; ``status`` and ``body`` as received."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"Error: {status} - {body}")  # WebGym's error text (its retry keywords match on it)
        self.status = status
        self.body = body


class OmniboxClient:
    """One client session against a master URL. A lease is the ``/get`` body, echoed back whole on every call."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"x-api-key": api_key} if api_key else {}
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def close(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> OmniboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      json: Any = None, headers: dict[str, str] | None = None, data: bytes | None = None,
                      ) -> tuple[int, Any, str]:
        """The raw answer: (status, body as JSON or bytes, content type)."""
        async with self._http.request(method, self.base_url + path, params=params, json=json, data=data,
                                      headers=self.headers if headers is None else headers) as resp:
            raw = await resp.read()
            ctype = resp.headers.get("Content-Type", "")
            if ctype.startswith("application/json"):
                import json as _json
                return resp.status, _json.loads(raw), ctype
            return resp.status, raw, ctype

    async def _ok(self, method: str, path: str, **kw: Any) -> Any:
        status, body, _ = await self.request(method, path, **kw)
        if status != 200:
            raise OmniboxError(status, body)
        return body

    async def get(self, lifetime_mins: int = 45) -> dict[str, str]:
        return await self._ok("POST", "/get", params={"lifetime_mins": lifetime_mins})

    async def reset(self, lease: dict[str, str]) -> Any:
        return await self._ok("POST", "/reset", params=lease)

    async def screenshot(self, lease: dict[str, str], interaction_mode: str = "coordinates",
                         **extra: str) -> tuple[bytes, str]:
        status, body, ctype = await self.request("GET", "/screenshot",
                                                 params={**lease, "interaction_mode": interaction_mode, **extra})
        if status != 200:
            raise OmniboxError(status, body)
        return body, ctype

    async def execute(self, lease: dict[str, str], command: str, args: dict[str, Any] | None = None) -> Any:
        return await self._ok("POST", "/execute", json={**lease, command: args or {}})

    async def metadata(self, lease: dict[str, str]) -> dict[str, Any]:
        return await self._ok("GET", "/metadata", params=lease)

    async def probe(self, lease: dict[str, str]) -> dict[str, Any]:
        return await self._ok("GET", "/probe", params=lease)

    async def info(self) -> dict[str, Any]:
        return await self._ok("GET", "/info")
