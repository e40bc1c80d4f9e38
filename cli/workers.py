"""``webgym-engine workers --ray``: browser workers placed on a cluster by its own manager (docs/cluster.md).

The command stays in the foreground: it places the workers, reports the ones that start and the actors that
die and come back, and on Ctrl-C, SIGTERM or SIGHUP removes what it placed. The placement itself is in
``cli/ray_workers.py`` (imported only here, when the command runs)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from urllib.parse import urlsplit

import click

from browserpool.auth import ClientKeys, KeyFileError, warn_insecure
from browserpool.config import DEFAULT_CHROMIUM, WorkerConfig
from cli.console_streams import keep_going_without_a_console
from cli.options import net_settings

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@click.command("workers")
@click.option("--ray", "use_ray", is_flag=True,
              help="Place the workers on a Ray cluster as actors (for Slurm or Kubernetes, run `webgym-engine "
                   "worker` per node: docs/cluster.md).")
@click.option("--address", default=None,
              help="The Ray cluster (HOST:PORT of its head, or ray://HOST:10001); default: $RAY_ADDRESS, else the "
                   "cluster `ray start` runs on this machine.")
@click.option("--connect", required=True, help="The engine's worker endpoint, tcp://HOST:PORT (its --listen), as "
                                               "the nodes reach it.")
@click.option("--per-node", type=click.IntRange(1), default=1, show_default=True,
              help="Browser workers (one Chromium each) on each node.")
@click.option("--nodes", type=click.IntRange(1), default=None,
              help="Nodes to place workers on (default: every live node big enough for --per-node workers).")
@click.option("--cpus-per-worker", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="CPUs each worker declares to Ray.")
@click.option("--memory-per-worker", "memory_mib", type=click.IntRange(0), default=2048, show_default=True,
              help="Memory (MiB) each worker declares to Ray. 0: none.")
@click.option("--strategy", type=click.Choice(["STRICT_SPREAD", "SPREAD"]), default="STRICT_SPREAD",
              show_default=True, help="STRICT_SPREAD: each node's workers on a node of their own; SPREAD: as "
                                      "spread as the cluster allows.")
@click.option("--max-restarts", type=click.IntRange(-1), default=10, show_default=True,
              help="Restarts of each actor whose worker died. -1: no limit.")
@click.option("--server-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CURVE: the engine's public key file (its NAME.key).")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CURVE: the workers' secret key file (NAME.key_secret; its NAME.key in the engine's --allow-keys). "
                   "Read here and handed to the workers through Ray.")
@click.option("--insecure", is_flag=True, help="Connect over tcp without CURVE authentication.")
@click.option("--chromium", default=DEFAULT_CHROMIUM, show_default=True, help="Chromium on the nodes.")
@click.option("--net-deny", multiple=True, metavar="ENTRY",
              help="Refuse page loads from ENTRY on these workers, on top of the engine's network policy. "
                   "Repeatable.")
def workers_cmd(use_ray: bool, address: str | None, connect: str, per_node: int, nodes: int | None,
                cpus_per_worker: float, memory_mib: int, strategy: str, max_restarts: int, server_key: str | None,
                key: str | None, insecure: bool, chromium: str, net_deny: tuple[str, ...]) -> None:
    """Place browser workers on a cluster and keep them joined to an engine until stopped (Ctrl-C, SIGTERM).

    Each worker connects to the engine over ZeroMQ itself; the cluster manager only places and restarts them."""
    keep_going_without_a_console()
    if not use_ray:
        raise click.UsageError("say where the workers go: --ray (for Slurm or Kubernetes, run `webgym-engine "
                               "worker --connect ...` per node: docs/cluster.md)")
    curve = _curve_keys(connect, server_key, key, insecure)
    net = net_settings(net_deny=net_deny)
    from cli import ray_workers as rw

    try:
        placement = rw.Placement(per_node=per_node, nodes=nodes, cpus_per_worker=cpus_per_worker,
                                 memory_mib=memory_mib, strategy=strategy, max_restarts=max_restarts)
        rw.connect(address)
    except (ValueError, rw.RayUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    stop = _stop_on_signals()  # after ray.init, which installs a SIGTERM handler of its own
    cfg = WorkerConfig(endpoint=connect, chromium_path=chromium, net=net, insecure=insecure)
    workers = rw.RayWorkers(placement, cfg, curve, echo=lambda line: click.echo(_stamp(line), err=True))
    code = 0
    try:
        if workers.start(stop):
            code = workers.supervise(stop)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        code = 1
    finally:
        if stop.is_set():
            click.echo(_stamp("stopping: removing the actors and the placement group"), err=True)
        workers.close()
        rw.disconnect()
    sys.exit(code)


def _curve_keys(connect: str, server_key: str | None, key: str | None, insecure: bool) -> str | None:
    """The workers' CURVE keys (as they travel to the workers), checked here; None with --insecure."""
    if urlsplit(connect).scheme != "tcp":
        raise click.ClickException(f"--connect must be tcp://HOST:PORT (workers on other hosts), not {connect!r}")
    if urlsplit(connect).hostname in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"note: {connect} reaches the engine only from its own host", err=True)
    if server_key and key:
        try:
            return ClientKeys.load(server_key, key).to_env()
        except KeyFileError as exc:
            raise click.ClickException(str(exc)) from None
    if server_key or key:
        raise click.ClickException("CURVE needs both --server-key (the engine's public key) and --key (the "
                                   "workers' secret key)")
    if not insecure:
        raise click.ClickException("tcp needs CURVE keys: --server-key ENGINE.key --key WORKER.key_secret "
                                   "(see `webgym-engine keys`), or --insecure")
    click.echo(warn_insecure(connect, "these workers"), err=True)
    return None


def _stop_on_signals() -> threading.Event:
    """An event set by the first of Ctrl-C, SIGTERM or SIGHUP (the supervision loop looks at it every second)."""
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda _signum, _frame: stop.set())
    return stop


def _stamp(line: str) -> str:
    return f"{time.strftime('%H:%M:%S')} {line}"
