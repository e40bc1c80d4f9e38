"""Browser workers placed on a Ray cluster as actors (``webgym-engine workers --ray``).

Ray only places and restarts them; the data path stays ZeroMQ. One placement group holds one bundle per node
(strategy STRICT_SPREAD, or SPREAD), each bundle the CPU and memory of ``per_node`` workers; each worker is an
actor (:class:`RayWorkerHost`, a :class:`browserpool.worker_host.WorkerHost`) in its node's bundle that starts an
ordinary browser worker process, which connects to the engine over tcp itself and dies with its actor. Ray
restarts a dead actor (``max_restarts``); its new worker joins the engine under a new id.

The actors are owned by this process (not detached), so Ray removes them and the placement group if it dies
without cleaning up; on a signal it removes them itself (:meth:`RayWorkers.close`). Ray is imported only here,
and only when the command runs: the rest of the project works without it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from browserpool.config import WorkerConfig
from browserpool.worker_host import WorkerHost

NAMESPACE = "webgym"  # the Ray namespace of the actors (named webgym-workers-<group>-<node>.<slot>)
STRATEGIES = ("STRICT_SPREAD", "SPREAD")
MIB = 1 << 20
WATCH_S = 30.0  # an actor's long poll for a new worker
TICK_S = 1.0  # how often the supervision loop looks for a stop request
STOP_TIMEOUT_S = 30.0  # how long close() waits for Ray to confirm the actors are gone


class RayUnavailable(RuntimeError):
    """Ray is not installed, or no cluster answers at the address."""


@dataclass(frozen=True)
class Placement:
    """Where and how many workers: ``per_node`` on each of ``nodes`` nodes (None: every node with room)."""

    per_node: int = 1
    nodes: int | None = None
    cpus_per_worker: float = 1.0
    memory_mib: int = 2048
    strategy: str = "STRICT_SPREAD"
    max_restarts: int = 10  # per actor; -1: no limit

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, not {self.strategy!r}")
        if self.per_node < 1 or (self.nodes is not None and self.nodes < 1) or self.cpus_per_worker <= 0:
            raise ValueError("per_node, nodes and cpus_per_worker must be positive")

    def bundle(self) -> dict[str, float]:
        """The resources of one node's bundle: its workers' CPU and memory together."""
        bundle = {"CPU": self.per_node * self.cpus_per_worker}
        if self.memory_mib > 0:
            bundle["memory"] = float(self.per_node * self.memory_mib * MIB)
        return bundle

    def actor_options(self) -> dict[str, Any]:
        """What each actor declares (its share of the bundle) and how Ray restarts it."""
        opts: dict[str, Any] = {"num_cpus": self.cpus_per_worker, "max_restarts": self.max_restarts,
                                "max_task_retries": 0, "max_concurrency": 4,  # info and watch run side by side
                                "runtime_env": {"env_vars": {"RAY_kill_child_processes_on_worker_exit": "false"}}}
        # Ray would SIGKILL an exiting actor's children itself; the worker's own lifeline does more as it goes (its
        # browser's process group killed, its frame ring unlinked, the host's temporary directory removed).
        if self.memory_mib > 0:
            opts["memory"] = self.memory_mib * MIB
        return opts


def nodes_with_room(nodes: list[dict[str, Any]], bundle: dict[str, float]) -> int:
    """How many live nodes (``ray.nodes()``) are big enough for one bundle."""
    return sum(1 for n in nodes if n.get("Alive")
               and all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in bundle.items()))


class RayWorkerHost(WorkerHost):
    """A worker host as a Ray actor: its workers are named ``ray-<node>-<slot>-<actor pid>-<n>``."""

    def __init__(self, cfg_json: str, slot: str, curve: str | None) -> None:
        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
        super().__init__(WorkerConfig.from_json(cfg_json), f"ray-{node}-{slot}", curve)


@dataclass
class _Actor:
    """The supervision loop's view of one actor."""

    slot: str  # <bundle>.<index in the bundle>
    name: str
    handle: Any
    call: Any = None  # its outstanding watch() call
    last: dict[str, Any] | None = None  # the worker it last reported (None while the actor is down)
    lost: str | None = None  # the worker of its last death, until its replacement starts
    deaths: int = 0
    gone: bool = False


class RayWorkers:
    """Places the workers, reports what happens to them, and removes them (module docstring).

    ``cfg``: the workers' configuration (endpoint, Chromium, network policy); ``curve``: their CURVE keys as
    ``ClientKeys.to_env`` writes them, or None; ``echo``: where progress lines go."""

    def __init__(self, placement: Placement, cfg: WorkerConfig, curve: str | None,
                 echo: Callable[[str], None]) -> None:
        self.placement = placement
        self.cfg = cfg
        self.curve = curve
        self.echo = echo
        self.group = secrets.token_hex(3)  # keeps the actor names of two groups on one cluster apart
        self.pg: Any = None
        self.actors: list[_Actor] = []

    def start(self, stop: threading.Event) -> bool:
        """Reserve the placement group (waiting until the cluster has room) and start the actors. False: a stop
        was asked for while waiting."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        p, bundle = self.placement, self.placement.bundle()
        nodes = p.nodes or nodes_with_room(ray.nodes(), bundle)
        if nodes == 0:
            raise ValueError(f"no node of the Ray cluster has room for {p.per_node} workers ({_show(bundle)})")
        self.pg = placement_group([dict(bundle) for _ in range(nodes)], strategy=p.strategy,
                                  name=f"webgym-workers-{self.group}")
        self.echo(f"placement group webgym-workers-{self.group}: {nodes} nodes x {p.per_node} workers, "
                  f"{_show(bundle)} per node, {p.strategy}")
        ready, told, t0 = self.pg.ready(), False, time.monotonic()
        while not ray.wait([ready], timeout=TICK_S)[0]:
            if stop.is_set():
                return False
            if not told and time.monotonic() - t0 > 10:
                told = True
                self.echo(f"waiting for {nodes} nodes with {_show(bundle)} free each ({p.strategy}); Ray keeps "
                          "the group pending until the cluster has room")
        cls = ray.remote(RayWorkerHost)
        cfg_json = self.cfg.to_json()
        for b in range(nodes):
            for k in range(p.per_node):
                slot, name = f"{b}.{k}", f"webgym-workers-{self.group}-{b}.{k}"
                strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=b)
                handle = cls.options(name=name, namespace=NAMESPACE, scheduling_strategy=strategy,
                                     **p.actor_options()).remote(cfg_json, slot, self.curve)
                self.actors.append(_Actor(slot, name, handle, call=handle.watch.remote(-1, WATCH_S)))
        return True

    def supervise(self, stop: threading.Event) -> int:
        """Report every worker that starts, every actor that dies and its replacement, until ``stop`` is set
        (then 0) or every actor is gone for good (then 1)."""
        import ray

        while not stop.is_set():
            calls = {a.call: a for a in self.actors if not a.gone}
            if not calls:
                self.echo("every actor is gone; stopping")
                return 1
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=TICK_S)
            for ref in ready:
                self._answered(calls[ref])
        return 0

    def _answered(self, a: _Actor) -> None:
        import ray
        from ray.exceptions import RayActorError

        try:
            info = ray.get(a.call)
        except RayActorError as exc:
            self._died(a, exc)
            return
        last, a.last = a.last, info
        a.call = a.handle.watch.remote(info["generation"], WATCH_S)
        where = f"on {info['hostname']} (actor {a.slot}, pid {info['host_pid']})"
        if a.lost is not None:
            self.echo(f"actor {a.slot} restarted: worker {info['worker_id']} replaces {a.lost} {where}")
            a.lost = None
        elif last is None:
            self.echo(f"worker {info['worker_id']} started {where}, connecting to {self.cfg.endpoint}")
        elif last["generation"] != info["generation"]:
            self.echo(f"worker {last['worker_id']} was shut down by its engine; worker {info['worker_id']} started "
                      f"{where} for the next one")

    def _died(self, a: _Actor, exc: Exception) -> None:
        import ray

        reason = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
        try:
            ray.get_actor(a.name, namespace=NAMESPACE)  # a named actor keeps its name while Ray restarts it
        except ValueError:
            a.gone = True
            worker = a.last["worker_id"] if a.last else "(none started)"
            self.echo(f"actor {a.slot} is gone for good (worker {worker}): {reason}")
            return
        if a.last is not None:  # else it has not come back since its last death
            a.deaths += 1
            limit = "no limit" if self.placement.max_restarts < 0 else f"max {self.placement.max_restarts}"
            self.echo(f"actor {a.slot} died (worker {a.last['worker_id']}): {reason}; Ray restarts it "
                      f"(restart {a.deaths}, {limit})")
            a.lost, a.last = a.last["worker_id"], None
        # Answered once the actor runs again (Ray holds calls to a restarting actor).
        a.call = a.handle.watch.remote(-1, WATCH_S)

    def close(self) -> None:
        """Kill the actors (their workers die with them) and remove the placement group; wait (bounded) until
        Ray confirms the actors are gone."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            ray.kill(a.handle, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)
        # A call to a killed actor fails once Ray has it dead; then its name is free.
        calls = [a.handle.info.remote() for a in self.actors]
        if calls:
            ray.wait(calls, num_returns=len(calls), timeout=STOP_TIMEOUT_S)
        left = [a for a in self.actors if _named(a.name)]
        if left:
            self.echo(f"{len(left)} actors were still shown after {STOP_TIMEOUT_S:g} s; Ray removes them")
        self.echo(f"removed {len(self.actors) - len(left)} actors and placement group webgym-workers-{self.group}")


def _named(name: str) -> bool:
    import ray

    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _show(bundle: dict[str, float]) -> str:
    cpu = f"{bundle['CPU']:g} CPU"
    return f"{cpu}, {bundle['memory'] / MIB:g} MiB" if "memory" in bundle else cpu


def connect(address: str | None) -> None:
    """Connect this process to the Ray cluster at ``address`` (None: $RAY_ADDRESS, else a cluster started on this
    machine with ``ray start``); never starts a cluster of its own."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("Ray is not installed: pip install 'webgym-engine[ray]'") from None
    try:
        ray.init(address=address or "auto", namespace=NAMESPACE, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise RayUnavailable(f"no Ray cluster {'at ' + address if address else 'found'}: {exc}") from None


def disconnect() -> None:
    import ray

    ray.shutdown()
