"""A served policy whose weights the RL loop updates: a stand-in for vLLM or SGLang on machines without a GPU.

vLLM and SGLang need a GPU. :class:`ServedStandInServer` serves a small in-process model (the ``hf`` backend,
:class:`policy.hf_backend.HFModel`) over real HTTP with the OpenAI protocol
(:class:`policy.openai_stand_in.OpenAIStandInServer`) and the real servers' weight-update control endpoints, so
the loop's pushes (``policy.weight_sync``) go through the same HTTP calls they make against vLLM or SGLang. It is
for CPU runs, demos and tests, not a production inference server.

- ``flavor="vllm"`` (vLLM 0.32's control routes under ``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=abort|wait``,
  ``/resume``, ``GET /is_paused``, ``POST /collective_rpc`` with ``reload_weights`` (``{"method":
  "reload_weights", "kwargs": {"weights_path": DIR}}``), ``/update_weight_version`` ``{"new_version": V}``,
  ``GET /weight_info`` (the first label is ``"default"``), ``GET /server_info`` (its config's
  ``weight_transfer_config``). With ``weight_transfer="disk"`` (a vLLM build with the ``disk`` backend, started
  with ``--weight-transfer-config '{"backend": "disk"}'``) also ``POST /init_weight_transfer_engine``
  ``{"init_info": {}}``, ``/start_weight_update``, ``/update_weights`` ``{"update_info": {"path": DIR}}`` and
  ``/finish_weight_update`` ``{"weight_version": V}``. A failed weight call answers 500 and closes its connection,
  as vLLM does. Replies carry no version (vLLM's chat replies do not).
- ``flavor="sglang"``: ``POST /update_weights_from_disk`` (``model_path``, ``weight_version``,
  ``abort_all_requests``, ``flush_cache``), ``/update_weight_version``, ``GET /model_info``,
  ``POST /pause_generation`` ``{"mode": "abort"}``, ``/continue_generation``; every reply carries
  ``metadata.weight_version`` as SGLang's do.

While paused, new generations wait. Aborted requests answer at once with ``finish_reason: "abort"`` and no text
(the model's batch finishes in the background and is thrown away), as the real servers return an aborted request.
The server measures its own idle time (no generation in flight): :meth:`ServedStandInServer.idle_fraction`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from aiohttp import web

from engine.agent.model_api import ChatRequest, Generation
from policy.openai_stand_in import OpenAIStandInServer, error_response

if TYPE_CHECKING:  # torch stays out of the import: the engine and server parts install without it
    from policy.hf_backend import HFModel

FLAVORS = ("vllm", "sglang")


class ServedStandInServer(OpenAIStandInServer):
    """A stand-in for a vLLM or SGLang server of ``model`` (see the module docstring).

    ``async with`` starts the model and the server and stops both; :attr:`base_url` is the API root. After the
    updates, :attr:`weight_version` is the server's version label, :attr:`updates` the (checkpoint, label) of
    each weight update, :attr:`aborted` the generations aborted by a pause or an update.
    """

    def __init__(self, model: HFModel, flavor: str = "vllm", served_model_name: str = "policy", *,
                 host: str = "127.0.0.1", port: int = 0, reasoning_parser: bool = False,
                 allowed_media_dir: str | Path | None = None, weight_transfer: str | None = None) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}")
        if weight_transfer is not None and flavor != "vllm":
            raise ValueError("weight_transfer is a vLLM setting")
        super().__init__(model, served_model_name, host=host, port=port, reasoning_parser=reasoning_parser,
                         allowed_media_dir=allowed_media_dir)
        self.hf = model
        # vLLM's and SGLang's log-probs are over the whole vocabulary, the vision placeholders included.
        model.vision_in_logprobs = True
        self.flavor = flavor
        self.weight_transfer = weight_transfer  # vLLM's --weight-transfer-config backend (None: not given)
        self.weight_version: str | None = "default"  # both servers' label before any update
        self.updates: list[tuple[str, str | None]] = []  # (checkpoint path, version label) per weight update
        self.aborted = 0
        self._running = asyncio.Event()  # cleared while paused: new generations wait
        self._running.set()
        self._aborts: set[asyncio.Future[None]] = set()  # one per generation in flight; set_result aborts it
        self._generating = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._transfer_ready = False
        self._update_open = False
        self._idle_since: float | None = time.monotonic()
        self._idle_s = 0.0
        self._clock_start = time.monotonic()

    async def __aenter__(self) -> Self:
        await self.hf.start()
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        await self.hf.close()

    # -- measurements ------------------------------------------------------------------------------------

    def restart_clock(self) -> None:
        """Measure idle time from now."""
        now = time.monotonic()
        self._clock_start, self._idle_s = now, 0.0
        self._idle_since = now if self._generating == 0 else None

    def idle_fraction(self) -> float:
        """The fraction of the time since :meth:`restart_clock` (or the start) with no generation in flight."""
        now = time.monotonic()
        idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        return idle / max(now - self._clock_start, 1e-9)

    # -- generation --------------------------------------------------------------------------------------

    async def generate(self, chat: ChatRequest) -> Generation:
        """The model's reply, after any pause; an empty ``"abort"`` reply if a pause or update aborts it."""
        await self._running.wait()
        aborted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._aborts.add(aborted)
        self._begin()
        work = asyncio.ensure_future(self.run_model(chat))
        try:
            racing: set[asyncio.Future[Any]] = {work, aborted}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._aborts.discard(aborted)
            self._end()
        if aborted.done() and not work.done():
            work.add_done_callback(_discard)
            self.aborted += 1
            return Generation(text="", token_ids=[], logprobs=[], finish_reason="abort")
        aborted.cancel()
        return work.result()

    async def run_model(self, chat: ChatRequest) -> Generation:
        """The in-process model's reply: the part of a generation that an abort leaves behind."""
        return await self.hf.generate(chat)

    def reply_fields(self, gen: Generation) -> dict[str, Any]:
        """SGLang's ``metadata.weight_version`` on every reply; nothing for vLLM."""
        if self.flavor == "sglang":
            return {"metadata": {"weight_version": self.weight_version}}
        return {}

    def _begin(self) -> None:
        if self._generating == 0 and self._idle_since is not None:
            self._idle_s += time.monotonic() - self._idle_since
            self._idle_since = None
        self._generating += 1
        self._drained.clear()

    def _end(self) -> None:
        self._generating -= 1
        if self._generating == 0:
            self._idle_since = time.monotonic()
            self._drained.set()

    async def _pause(self, mode: str) -> None:
        """Hold new generations; abort the ones in flight (``"abort"``) or let them finish; wait until none run."""
        self._running.clear()
        if mode == "abort":
            for future in list(self._aborts):
                if not future.done():
                    future.set_result(None)
        await self._drained.wait()

    async def _load(self, path: str) -> None:
        checkpoint = Path(path)
        if not checkpoint.is_absolute() or not checkpoint.is_dir():
            raise ValueError(f"{path!r} is not an absolute checkpoint directory")
        # HFModel numbers versions as ints; the server's own label is self.weight_version.
        await self.hf.load_weights(checkpoint, len(self.updates) + 1)
        self.updates.append((str(checkpoint), None))

    def _label_last_update(self, version: object) -> None:
        self.weight_version = str(version)
        self.updates[-1] = (self.updates[-1][0], self.weight_version)

    # -- routes ------------------------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        """The chat endpoints and the flavor's pause and weight-update endpoints."""
        super().add_routes(app)
        if self.flavor == "vllm":
            app.router.add_post("/pause", self._vllm_pause)
            app.router.add_post("/resume", self._resume)
            app.router.add_get("/is_paused", self._is_paused)
            app.router.add_post("/collective_rpc", self._vllm_rpc)
            app.router.add_get("/server_info", self._vllm_server_info)
            app.router.add_post("/init_weight_transfer_engine", self._vllm_init)
            app.router.add_post("/start_weight_update", self._vllm_start)
            app.router.add_post("/update_weights", self._vllm_update)
            app.router.add_post("/finish_weight_update", self._vllm_finish)
            app.router.add_get("/weight_info", self._version)
        else:
            app.router.add_post("/update_weights_from_disk", self._sglang_update)
            app.router.add_get("/model_info", self._sglang_model_info)
            app.router.add_post("/pause_generation", self._sglang_pause)
            app.router.add_post("/continue_generation", self._resume)
        app.router.add_post("/update_weight_version", self._set_version)

    async def _vllm_pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in ("abort", "wait"):
            return error_response(400, f"this stand-in pauses with mode abort or wait, not {mode!r}")
        await self._pause(mode)
        return web.json_response({"status": "paused"})

    async def _resume(self, request: web.Request) -> web.Response:
        self._running.set()
        return web.json_response({"status": "resumed"})

    async def _is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": not self._running.is_set()})

    async def _vllm_rpc(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not isinstance(body, dict) or body.get("method") is None:
            return error_response(400, "Missing 'method' in request body")
        kwargs = body.get("kwargs") or {}
        if body["method"] != "reload_weights" or not isinstance(kwargs, dict):
            return await _server_error(request, f"this stand-in runs reload_weights only, not {body['method']!r}")
        try:
            await self._load(str(kwargs.get("weights_path")))
        except Exception as exc:  # vLLM's worker raises; its server answers 500
            return await _server_error(request, f"reload_weights failed: {type(exc).__name__}: {exc}")
        return web.json_response({"results": [None]})

    async def _vllm_server_info(self, request: web.Request) -> web.Response:
        transfer = None if self.weight_transfer is None else {"backend": self.weight_transfer}
        return web.json_response({"vllm_config": {"weight_transfer_config": transfer}})

    async def _vllm_init(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not isinstance(body, dict) or body.get("init_info") is None:
            return error_response(400, "Missing 'init_info' in request body")
        if self.weight_transfer != "disk":  # the default backend (nccl) wants a rendezvous address
            backend = self.weight_transfer or "nccl"
            return await _server_error(request, f"the {backend} weight-transfer backend needs a rendezvous")
        self._transfer_ready = True
        return web.json_response({"message": "Weight transfer initialized"})

    async def _vllm_start(self, request: web.Request) -> web.Response:
        if not self._transfer_ready:
            return error_response(400, "weight transfer engine not initialized")
        self._update_open = True
        return web.json_response({"message": "Weight update started"})

    async def _vllm_update(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        info = body.get("update_info") if isinstance(body, dict) else None
        if not self._update_open:
            return error_response(400, "update_weights outside start_weight_update / finish_weight_update")
        if not isinstance(info, dict) or not isinstance(info.get("path"), str):
            return error_response(400, "Missing 'update_info' with a 'path' in request body")
        try:
            await self._load(info["path"])
        except Exception as exc:
            return await _server_error(request, f"update_weights failed: {type(exc).__name__}: {exc}")
        return web.json_response({"message": "Weights updated"})

    async def _vllm_finish(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._update_open = False
        version = body.get("weight_version") if isinstance(body, dict) else None
        if version is not None:
            self._label_last_update(version)
        return web.json_response({"message": "Weight update finished"})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def _set_version(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.updates and self.updates[-1][1] is None:  # the label of a reload_weights that came before
            self._label_last_update(body["new_version"])
        self.weight_version = str(body["new_version"])
        return web.json_response({"success": True, "new_version": self.weight_version})

    async def _sglang_update(self, request: web.Request) -> web.Response:
        body = await request.json()
        # SGLang holds new requests and lets running ones finish (or aborts them) before loading.
        await self._pause("abort" if body.get("abort_all_requests") else "wait")
        try:
            await self._load(str(body.get("model_path")))
            if body.get("weight_version") is not None:
                self._label_last_update(body["weight_version"])
        except Exception as exc:  # SGLang answers a failed load with success false and HTTP 400
            return web.json_response({"success": False, "message": f"{type(exc).__name__}: {exc}",
                                      "num_paused_requests": 0}, status=400)
        finally:
            self._running.set()
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": 0})

    async def _sglang_model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.served_model_name, "weight_version": self.weight_version,
                                  "is_generation": True})

    async def _sglang_pause(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self._pause(body.get("mode", "abort"))
        return web.json_response({"status": "paused"})


async def _server_error(request: web.Request, message: str) -> web.StreamResponse:
    """A 500, then the connection closed without a word, as vLLM's server answers an exception in a control route
    (its reply keeps the connection alive; a client that sends the next call on it meets a closed socket)."""
    response = error_response(500, message)
    await response.prepare(request)
    await response.write_eof()
    if request.transport is not None:
        request.transport.close()
    return response


def _discard(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned generation's outcome (so asyncio does not warn about it)."""
    with contextlib.suppress(BaseException):
        task.result()
