"""An episode's page on one worker, as the engine drives it (:class:`BrowserSession`: every call one request and
its reply), and the screenshots that come back (:class:`Frame`: a zero-copy view of the worker's ring)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, get_args

from browserpool import protocol as P
from browserpool.pool_errors import BrowserOpError, PoolError, WorkerLost
from browserpool.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from browserpool.pool import BrowserPool


class Frame:
    """A screenshot received from a worker: a zero-copy view until :meth:`release`."""

    __slots__ = ("_handle", "_ref", "view")

    def __init__(self, handle: WorkerHandle | None, ref: P.FrameRef | None, view: memoryview) -> None:
        self._handle = handle
        self._ref = ref
        self.view = view

    def release(self) -> None:
        """Hand the slot back to its worker (idempotent)."""
        if self._ref is not None and self._handle is not None:
            self.view.release()
            self._handle.pending_release.append((self._ref.slot, self._ref.generation))
            self._ref = None

    def __enter__(self) -> Frame:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BrowserSession:
    """One episode's page on one worker; every call is one request/reply."""

    def __init__(self, pool: BrowserPool, handle: WorkerHandle, episode_id: str) -> None:
        self.pool = pool
        self.handle = handle
        self.episode_id = episode_id
        self.closed = False

    @property
    def worker_id(self) -> str:
        return self.handle.worker_id

    async def open(self, url: str, som: bool = False, setup_js: str | None = None,
                   probe_js: str | None = None, shot: bool = True, som_elements: int = 0, axtree: bool = False,
                   dom: bool = False, traffic: P.TrafficSpec | None = None) -> tuple[P.Observation, Frame]:
        """Open a page for the episode at ``url``; returns the first observation.

        ``som``: Set-of-Marks mode for the whole episode: every observation lists the visible interactive
        elements (``Observation.elements``) and its frame shows them as numbered boxes. ``som_elements``: list
        (and draw) at most this many (0: the worker's own cap, ``WorkerConfig.som_max_elements``), so that the
        frame shows no box whose id the caller drops from the list.
        ``setup_js``: a script the worker runs once after the first load (a returned promise is awaited);
        the page then settles again before the first screenshot. A script that throws fails the open
        (BrowserOpError, kind ``refused``). Used to start a page's own episode (MiniWoB's task generator).
        ``probe_js``: an expression evaluated after the settle of every observation of the episode (the
        open and every act); its JSON value comes back in ``Observation.probe`` (``{"error": ...}`` when it
        threw), e.g. a page's own reward and done flag. ``shot`` False: no screenshot (the frame is empty).
        ``axtree``: every observation carries the page's accessibility tree (``Observation.axtree``), whose ids
        actions accept (``BrowserAction.node``); ``dom``: every observation carries the page's elements with their
        boxes and visibility (``Observation.dom``, the same ids). ``traffic``: record the episode's traffic into an
        archive, or replay it from one (``browserpool/traffic.py``; ``Observation.traffic`` counts what it did)."""
        if type(som_elements) is not int or som_elements < 0:
            raise BrowserOpError(P.ERR_REFUSED, f"som_elements must be a non-negative integer, not {som_elements!r}")
        operation = P.Open(url=url, som=som, som_elements=som_elements if som else 0, axtree=axtree, dom=dom,
                           traffic=traffic, setup_js=setup_js, probe_js=probe_js, shot=shot)
        async with self.handle.opens:
            body = await self.pool.request(self.handle, self.episode_id, operation)
        return self._observation(body)

    async def act(self, action: P.BrowserAction, shot: bool = True) -> tuple[P.Observation, Frame]:
        """Carry out one action and observe the settled page. ``shot`` False: no screenshot (the frame is
        empty), for a client that asks for one only when it wants it (:meth:`observe`)."""
        return self._observation(await self.pool.request(self.handle, self.episode_id, P.Act(action=action, shot=shot)))

    async def observe(self, som: bool | None = None, fmt: P.ImageFormat = "jpeg", axtree: bool | None = None,
                      dom: bool | None = None) -> tuple[P.Observation, Frame]:
        """Observe the page as it is now, without an action: whatever is still loading is waited for (no quiet
        period). ``som``: Set-of-Marks for this observation (None: the episode's mode); ``fmt``: jpeg or png;
        ``axtree``, ``dom``: with the accessibility tree, the DOM snapshot (None: the episode's mode)."""
        if fmt not in get_args(P.ImageFormat):
            raise BrowserOpError(P.ERR_REFUSED, f"screenshot format must be jpeg or png, not {str(fmt)[:20]!r}")
        operation = P.Observe(som=som, format=fmt, axtree=axtree, dom=dom)
        return self._observation(await self.pool.request(self.handle, self.episode_id, operation))

    async def locate(self, selector: str) -> dict[str, Any]:
        """Where a CSS selector's first visible match is in the viewport (oracle access for scripts)."""
        return P.decode_body(await self.pool.request(self.handle, self.episode_id, P.Locate(selector=selector)))

    async def evaluate(self, exprs: list[str]) -> list[Any]:
        """Evaluate JS expressions in the page (for programmatic reward checks)."""
        return P.decode_body(await self.pool.request(self.handle, self.episode_id, P.Evaluate(exprs=exprs)))

    async def close(self) -> None:
        """Give the page's context back to the worker (state cleared); never raises."""
        if self.closed:
            return
        self.closed = True
        self.handle.episodes.discard(self.episode_id)
        self.pool._capacity_changed()
        if self.handle.alive:
            with contextlib.suppress(PoolError):
                await self.pool.request(self.handle, self.episode_id, P.Close())

    def _observation(self, body: Any) -> tuple[P.Observation, Frame]:
        try:
            obs = P.decode_observation(body)
        except P.ProtocolError as exc:
            self.pool.offence(self.handle, f"a malformed observation: {exc}")
            raise WorkerLost(f"browser worker {self.worker_id} sent a malformed observation") from exc
        ref = obs.frame
        if ref is not None:
            h = self.handle
            if h.reader is None or ref.slot >= h.slot_count or ref.nbytes > h.reader.slot_size:
                # A slot this worker never announced: nothing in shared memory is read for it.
                self.pool.offence(h, f"a frame reference outside its ring ({ref})")
                raise WorkerLost(f"browser worker {self.worker_id} sent a frame reference outside its ring")
            return obs, Frame(h, ref, h.reader.view(ref))
        if obs.frame_bytes and self.handle.reader is not None:
            self.pool.inline_frames += 1
        return obs, Frame(None, None, memoryview(obs.frame_bytes or b""))
