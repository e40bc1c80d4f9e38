"""Weight pushes: make the policy serve a new checkpoint in place, without restarting anything.

The RL loop (:mod:`train.loop`) calls :meth:`WeightSync.push` after every update with the checkpoint the trainer
wrote (a Hugging Face model directory) and the new policy version:

- :class:`InProcessSync`: the in-process ``hf`` backend swaps the weights between two generate calls.
- :class:`VLLMSync`: ``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1`` (its control routes). At start it reads the
  server's weight-transfer backend from ``GET /server_info?config_format=json`` (reload where that fails).
  Released vLLM (0.32: backends nccl, ipc and others that move tensors, no ``disk``) reloads the checkpoint through
  ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": CHECKPOINT}}`` and labels it
  with ``/update_weight_version``; a server started with ``--weight-transfer-config '{"backend": "disk"}'`` (a
  vLLM build with that backend) gets its weight-transfer calls: ``/init_weight_transfer_engine`` at start, then
  ``/start_weight_update``, ``/update_weights`` ``{"update_info": {"path": CHECKPOINT}}``,
  ``/finish_weight_update`` with the label. Either way inside ``POST /pause?mode=abort|wait`` ... ``/resume``;
  the served version is read back from ``GET /weight_info``.
- :class:`SGLangDiskSync`: SGLang's ``POST /update_weights_from_disk`` (``model_path``, ``weight_version``,
  ``abort_all_requests``, ``flush_cache``; SGLang's "SGLang for RL" guide); the served version is read back from
  ``GET /model_info``, and every chat reply carries it (``metadata.weight_version``).

What happens to requests in flight during a push (``mode``): ``"wait"`` lets them finish on the old weights,
recorded with the old version, before the weights change; ``"abort"`` has the server abort them and sends them
again on the new weights (the whole request: a reply never mixes versions). AReaL instead interrupts and resumes a
request with its partial output; a chat request's partial reply cannot be continued through the OpenAI API, and a
reply from one version keeps every recorded token's version exact. The client side of both (no request sent
during a push; aborted ones sent again) is :meth:`policy.openai_backend.OpenAIModel.hold`.

Checkpoints must be on storage every server sees at the same absolute path (vLLM loads an absolute local
directory of safetensors files).

A push that fails (a missing or corrupt checkpoint, a server that answers 500 or drops the connection) raises
:class:`PolicyError` and stops the loop; the servers are resumed on a fresh connection (vLLM closes the one a 500
came on), or the error says which one may be left paused. The clients are then closed to requests: what they
would answer comes from weights of unknown version, and nothing is recorded under a version it is not.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import aiohttp

from engine.agent.policy_api import PolicyError
from policy.hf_backend import HFModel
from policy.openai_backend import OpenAIModel

PushMode = Literal["abort", "wait"]
PUSH_MODES: tuple[PushMode, ...] = get_args(PushMode)
SERVER_KINDS = ("vllm", "sglang")
#: How a vLLM server loads a checkpoint: its ``disk`` weight-transfer backend, or ``reload_weights`` (every release).
VLLMUpdate = Literal["disk", "reload"]
RESUME_TRIES = 3


@dataclass
class PushReport:
    """What one push did, for the loop's log."""

    version: int
    held_s: float  # no request was sent for this long (the browsers' rollouts waited on the policy)
    update_s: float  # the servers' own update calls
    in_flight: int  # requests in flight when the push began
    resent: int  # requests aborted by the push and sent again (mode "abort")


class WeightSync:
    """Pushes checkpoints into the policy's weights; one per loop."""

    async def start(self) -> None:
        """Label the weights being served now as version 0."""

    async def push(self, checkpoint: str | Path, version: int) -> PushReport:
        raise NotImplementedError

    async def close(self) -> None:
        """Release the control connections."""


class InProcessSync(WeightSync):
    """The in-process ``hf`` backend: the weights are swapped on the model's thread between two batches."""

    def __init__(self, model: HFModel) -> None:
        self.model = model

    async def start(self) -> None:
        self.model.version = 0

    async def push(self, checkpoint: str | Path, version: int) -> PushReport:
        t0 = time.monotonic()
        await self.model.load_weights(checkpoint, version)
        return PushReport(version=version, held_s=0.0, update_s=time.monotonic() - t0, in_flight=0, resent=0)


class ServerSync(WeightSync):
    """Common to the served backends: one control session, every server held, updated and released together."""

    def __init__(self, models: list[OpenAIModel], mode: PushMode = "abort", timeout_s: float = 600.0) -> None:
        if mode not in PUSH_MODES:
            raise ValueError(f"push mode must be one of {PUSH_MODES}, not {mode!r}")
        if not models:
            raise ValueError("no policy servers to push to")
        self.models = models
        self.mode = mode
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def root(model: OpenAIModel) -> str:
        """The server's root URL (the control endpoints are not under the API's ``/v1``)."""
        base = model.base_url
        return base[: -len("/v1")] if base.endswith("/v1") else base

    async def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.request(method, url, **kwargs) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise PolicyError(f"weight push: {method} {url} answered HTTP {resp.status}: {text[:500]}")
                try:
                    return await resp.json(content_type=None) if text.strip() else None
                except ValueError:
                    return text
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PolicyError(f"weight push: {method} {url}: {type(exc).__name__}: {exc}") from exc

    async def start(self) -> None:
        await asyncio.gather(*(self._label(m, 0) for m in self.models))
        for model in self.models:
            model.release(0)

    async def push(self, checkpoint: str | Path, version: int) -> PushReport:
        path = Path(checkpoint).resolve()
        if not path.is_dir():
            raise PolicyError(f"weight push: {path} is not a checkpoint directory")
        t0 = time.monotonic()
        resent_before = sum(m.resent for m in self.models)
        in_flight = sum(await asyncio.gather(*(m.hold(drain=self.mode == "wait") for m in self.models)))
        t1 = time.monotonic()
        try:
            results = await asyncio.gather(*(self._update(m, path, version) for m in self.models),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
            served = await asyncio.gather(*(self.served_version(m) for m in self.models))
            wrong = [(m.base_url, v) for m, v in zip(self.models, served, strict=True) if v != str(version)]
            if wrong:
                raise PolicyError(f"weight push: servers report other versions than {version}: {wrong}")
        except BaseException as exc:
            # The served weights are now of no known version: the held requests, and any later one, fail rather
            # than be recorded under a version they are not (the loop stops with this error).
            for model in self.models:
                model.refuse(f"the weight push of version {version} failed: {exc}")
            raise
        update_s = time.monotonic() - t1
        # Counted before the release: an aborted request is counted when its (thrown away) reply arrives.
        resent = sum(m.resent for m in self.models) - resent_before
        for model in self.models:
            model.release(version)
        return PushReport(version=version, held_s=time.monotonic() - t0, update_s=update_s, in_flight=in_flight,
                          resent=resent)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _label(self, model: OpenAIModel, version: int) -> None:
        raise NotImplementedError

    async def _update(self, model: OpenAIModel, path: Path, version: int) -> None:
        raise NotImplementedError

    async def served_version(self, model: OpenAIModel) -> str | None:
        """The version label the server reports for the weights it serves."""
        raise NotImplementedError


class VLLMSync(ServerSync):
    """``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1``: ``reload_weights``, or the ``disk`` weight-transfer backend
    where the server has it (see the module docstring)."""

    def __init__(self, models: list[OpenAIModel], mode: PushMode = "abort", timeout_s: float = 600.0) -> None:
        super().__init__(models, mode, timeout_s)
        self.updates: dict[str, VLLMUpdate] = {}  # by server root, read at start

    async def start(self) -> None:
        kinds = await asyncio.gather(*(self._update_kind(m) for m in self.models))
        self.updates = {self.root(m): kind for m, kind in zip(self.models, kinds, strict=True)}
        # The disk backend needs no rendezvous: its init handshake carries an empty init_info.
        await asyncio.gather(*(self._call("POST", f"{self.root(m)}/init_weight_transfer_engine",
                                          json={"init_info": {}})
                               for m in self.models if self.updates[self.root(m)] == "disk"))
        await super().start()

    async def _update_kind(self, model: OpenAIModel) -> VLLMUpdate:
        """``disk`` if the server was started with that weight-transfer backend, else ``reload``."""
        root = self.root(model)
        try:
            await self._call("GET", f"{root}/is_paused")
        except PolicyError as exc:
            raise PolicyError(f"weight push: {root} has no control routes (start vLLM with VLLM_SERVER_DEV_MODE=1): "
                              f"{exc}") from exc
        # /server_info also reports the machine (vLLM's collect_env), which fails on some (vLLM 0.32 on a CPU-only
        # machine: HTTP 500, "'NoneType' object has no attribute 'splitlines'"): the backend cannot be read there,
        # and reload_weights, which every dev-mode server has, is used. Asked on a connection of its own: after
        # that 500, the control session's next request was reset.
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session, \
                    session.get(f"{root}/server_info", params={"config_format": "json"}) as resp:
                info = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            info = None
        config = info.get("vllm_config") if isinstance(info, dict) else None
        transfer = config.get("weight_transfer_config") if isinstance(config, dict) else None
        backend = transfer.get("backend") if isinstance(transfer, dict) else None
        return "disk" if backend == "disk" else "reload"

    async def _label(self, model: OpenAIModel, version: int) -> None:
        await self._call("POST", f"{self.root(model)}/update_weight_version", json={"new_version": str(version)})

    async def _update(self, model: OpenAIModel, path: Path, version: int) -> None:
        root = self.root(model)
        await self._call("POST", f"{root}/pause", params={"mode": self.mode})
        try:
            if self.updates.get(root) == "disk":
                await self._call("POST", f"{root}/start_weight_update")
                await self._call("POST", f"{root}/update_weights", json={"update_info": {"path": str(path)}})
                await self._call("POST", f"{root}/finish_weight_update", json={"weight_version": str(version)})
            else:
                await self._call("POST", f"{root}/collective_rpc",
                                 json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
                await self._label(model, version)
        except PolicyError as exc:
            try:
                await self._resume(root)
            except PolicyError as stuck:
                raise PolicyError(f"{exc}; {stuck}") from exc
            raise PolicyError(f"{exc} ({root} resumed, its weights of unknown version)") from exc
        await self._resume(root)

    async def _resume(self, root: str) -> None:
        """``POST /resume`` on a connection of its own, tried again: vLLM closes the one an error came on."""
        cause = ""
        for attempt in range(RESUME_TRIES):
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session, \
                        session.post(f"{root}/resume") as resp:
                    if resp.status == 200:
                        return
                    cause = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                cause = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.5 * 2 ** attempt)
        raise PolicyError(f"weight push: {root} may be left paused (POST /resume failed {RESUME_TRIES} times; last: "
                          f"{cause})")

    async def served_version(self, model: OpenAIModel) -> str | None:
        info = await self._call("GET", f"{self.root(model)}/weight_info")
        return _version_label(info)


class SGLangDiskSync(ServerSync):
    """An SGLang server (``python -m sglang.launch_server``): ``update_weights_from_disk``."""

    async def _label(self, model: OpenAIModel, version: int) -> None:
        await self._call("POST", f"{self.root(model)}/update_weight_version",
                         json={"new_version": str(version), "abort_all_requests": False})

    async def _update(self, model: OpenAIModel, path: Path, version: int) -> None:
        reply = await self._call("POST", f"{self.root(model)}/update_weights_from_disk", json={
            "model_path": str(path), "weight_version": str(version), "flush_cache": True,
            "abort_all_requests": self.mode == "abort"})
        if not isinstance(reply, dict) or not reply.get("success"):
            raise PolicyError(f"weight push: {self.root(model)} refused {path}: {reply}")

    async def served_version(self, model: OpenAIModel) -> str | None:
        info = await self._call("GET", f"{self.root(model)}/model_info")
        return _version_label(info)


def _version_label(info: Any) -> str | None:
    """The ``weight_version`` of a server's info reply, as a string (None when it has none)."""
    value = info.get("weight_version") if isinstance(info, dict) else None
    return None if value is None else str(value)


def server_sync(kind: str, models: list[OpenAIModel], mode: PushMode = "abort") -> ServerSync:
    """The push for ``kind`` (``vllm`` or ``sglang``) servers."""
    if kind == "vllm":
        return VLLMSync(models, mode)
    if kind == "sglang":
        return SGLangDiskSync(models, mode)
    raise ValueError(f"server kind must be one of {SERVER_KINDS}, not {kind!r}")
