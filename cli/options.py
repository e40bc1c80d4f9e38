"""Command-line options that more than one command shares (``run``, ``serve``), and their checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from browserpool.auth import KeyFileError, warn_insecure
from engine.core.builders import server_keys
from engine.core.config import RunConfig

F = TypeVar("F", bound=Callable[..., Any])


def default_of(cls: type, name: str) -> Any:
    """The default of a config dataclass's field: the one place it is written (an option shows it)."""
    for f in dataclasses.fields(cls):
        if f.name == name and f.default is not dataclasses.MISSING:
            return f.default
    raise LookupError(f"{cls.__name__}.{name} has no plain default")


def _apply(f: F, options: list[Callable[[F], F]]) -> F:
    for option in reversed(options):
        f = option(f)
    return f


def worker_socket_options(f: F) -> F:
    """``--listen``, ``--no-spawn``, ``--server-key``, ``--allow-keys``, ``--insecure``: browser workers on other
    hosts, and the keys that authenticate them (docs/security.md)."""
    return _apply(f, [
        click.option("--listen", default=None, help="Bind the worker socket here (e.g. tcp://0.0.0.0:5555) "
                     "so workers on other hosts can join with `webgym-engine worker --connect`."),
        click.option("--no-spawn", is_flag=True, help="Start no local workers; wait for --workers to connect."),
        click.option("--server-key", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="CURVE for sockets on tcp (--listen, --telemetry): the engine's secret key file "
                          "(`webgym-engine keys engine`)."),
        click.option("--allow-keys", type=click.Path(exists=True), default=None,
                     help="CURVE: the public keys of the workers (and monitors) allowed to connect: a directory of "
                          "*.key files or one file."),
        click.option("--insecure", is_flag=True, help="Allow sockets on tcp without CURVE authentication (any "
                                                      "peer that reaches the port is trusted)."),
    ])


def net_policy_options(f: F) -> F:
    """``--allow-private-network``, ``--net-allow``, ``--net-deny``, ``--net-policy/--no-net-policy``: where pages
    may load from (docs/security.md)."""
    return _apply(f, [
        click.option("--allow-private-network", is_flag=True,
                     help="Let pages load from loopback and private addresses (RFC 1918, CGNAT, fc00::/7). Cloud "
                          "metadata and link-local addresses stay refused."),
        click.option("--net-allow", multiple=True, metavar="ENTRY",
                     help="Let pages load from ENTRY despite the private-network block: HOST:PORT, an address, a "
                          "CIDR or a URL pattern (http://wiki.corp/*). Repeatable."),
        click.option("--net-deny", multiple=True, metavar="ENTRY",
                     help="Refuse page loads from ENTRY (wins over --net-allow): a host (*.example.com: its "
                          "subdomains), HOST:PORT, an address, a CIDR or a URL pattern. Repeatable."),
        click.option("--net-policy/--no-net-policy", default=True, show_default=True,
                     help="The network policy for pages; off, pages may load from any address the machine "
                          "reaches."),
    ])


def check_net_policy(allow_private_network: bool, allow: tuple[str, ...], deny: tuple[str, ...]) -> None:
    """A bad --net-allow / --net-deny entry fails here, before anything starts."""
    from browserpool.netpolicy import NetPolicy

    try:
        NetPolicy(allow_private_network=allow_private_network, allow=allow, deny=deny)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def check_sockets(cfg: RunConfig, console: Console) -> None:
    """The engine's tcp sockets (the worker socket, telemetry) need CURVE keys or an explicit --insecure (then a
    warning); unreadable or world-readable key files fail here, before anything starts."""
    try:
        server_keys(cfg)
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    for endpoint, what in ((cfg.listen, "the worker socket"), (cfg.telemetry, "telemetry")):
        if endpoint is not None and endpoint.startswith("tcp://"):
            if cfg.server_key is None and not cfg.insecure:
                raise click.ClickException(f"{what} on {endpoint} is tcp: give CURVE keys (--server-key, "
                                           "--allow-keys; see `webgym-engine keys`) or pass --insecure")
            if cfg.server_key is None:
                console.print(warn_insecure(endpoint, what))
