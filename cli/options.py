"""Command-line options that more than one command shares (``run``, ``serve``), and their checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args

import click
import msgspec
from rich.console import Console

from browserpool.auth import KeyFileError, warn_insecure
from browserpool.config import WorkerConfig
from browserpool.protocol import MissPolicy, NetSettings
from engine.agent.model_api import SamplingParams
from engine.agent.prompts import OBSERVE_KINDS, AgentConfig
from engine.core.builders import server_keys
from engine.core.config import RunConfig
from engine.rewards.judge import JudgeConfig
from policy.registry import BackendConfig
from server.app import ServerConfig
from server.openenv.config import OpenEnvConfig

F = TypeVar("F", bound=Callable[..., Any])


def default_of(cls: type, name: str) -> Any:
    """The default of a config dataclass's (or msgspec struct's) field: the one place it is written (an option
    shows it)."""
    if issubclass(cls, msgspec.Struct):
        for info in msgspec.structs.fields(cls):
            if info.name == name and info.default is not msgspec.NODEFAULT:
                return info.default
        raise LookupError(f"{cls.__name__}.{name} has no plain default")
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a config (a dataclass or a msgspec struct)")
    for f in dataclasses.fields(cls):
        if f.name == name and f.default is not dataclasses.MISSING:
            return f.default
    raise LookupError(f"{cls.__name__}.{name} has no plain default")


Command = Literal["run", "serve", "openenv", "worker"]

# The config field each command-line option sets, by command: the option takes its default from the field, where
# it is written once. tests/test_cli_defaults.py holds every option of these commands to this table (an option with
# a default of its own is listed there with the reason).
_BROWSER: dict[str, tuple[type, str]] = {
    "chromium": (WorkerConfig, "chromium_path"), "jpeg_quality": (WorkerConfig, "jpeg_quality"),
    "settle_timeout": (WorkerConfig, "settle_timeout_s"),
}
_ENGINE: dict[str, tuple[type, str]] = {
    **_BROWSER, "workers": (RunConfig, "workers"), "output_dir": (RunConfig, "output_dir"),
    "telemetry": (RunConfig, "telemetry"), "listen": (RunConfig, "listen"), "server_key": (RunConfig, "server_key"),
    "allow_keys": (RunConfig, "allow_keys"), "insecure": (RunConfig, "insecure"),
    "net_policy": (NetSettings, "enabled"), "allow_private_network": (NetSettings, "allow_private_network"),
    "record_traffic": (RunConfig, "record_traffic"), "replay_traffic": (RunConfig, "replay_traffic"),
    "traffic_miss": (RunConfig, "traffic_miss"),
}
OPTION_FIELDS: dict[Command, dict[str, tuple[type, str]]] = {
    "run": {
        **_ENGINE,
        "tasks_path": (RunConfig, "tasks"), "concurrency": (RunConfig, "concurrency"), "mode": (RunConfig, "mode"),
        "episodes": (RunConfig, "episodes"),
        "resume_dir": (RunConfig, "run_dir"), "retry_lost": (RunConfig, "retry_lost"), "split": (RunConfig, "split"),
        "seed": (RunConfig, "seed"), "policy_concurrency": (RunConfig, "policy_concurrency"),
        "reward": (RunConfig, "reward"), "straggler_grace": (RunConfig, "straggler_grace_s"),
        "episode_timeout": (RunConfig, "episode_timeout_s"),
        "policy_step_timeout": (RunConfig, "policy_step_timeout_s"),
        "domain_limit": (RunConfig, "domain_limit"), "domain_rate": (RunConfig, "domain_rate"),
        "blocklist_path": (RunConfig, "blocklist"),
        "traffic_group": (RunConfig, "traffic_group"),
        "context_memory_mib": (WorkerConfig, "context_memory_mib"),
        "page_memory_mib": (WorkerConfig, "page_memory_mib"),
        "browser_memory_mib": (WorkerConfig, "browser_memory_mib"), "user_agent": (WorkerConfig, "user_agent"),
        "consent": (WorkerConfig, "consent"),
        "interaction": (AgentConfig, "interaction"), "coords": (AgentConfig, "coords"),
        "response_format": (AgentConfig, "response_format"), "action_format": (AgentConfig, "action_format"),
        "observe": (AgentConfig, "observe"), "context_window": (AgentConfig, "window"),
        "prompt_template": (AgentConfig, "template_file"),
        "temperature": (SamplingParams, "temperature"), "top_p": (SamplingParams, "top_p"),
        "top_k": (SamplingParams, "top_k"), "max_tokens": (SamplingParams, "max_tokens"),
        "model": (BackendConfig, "model"), "base_url": (BackendConfig, "base_url"),
        "api_key_env": (BackendConfig, "api_key_env"), "image_transport": (BackendConfig, "image_transport"),
        "logprobs_of": (BackendConfig, "logprobs_of"), "request_timeout": (BackendConfig, "timeout_s"),
        "device": (BackendConfig, "device"), "max_batch": (BackendConfig, "max_batch"),
        "sim_speed": (BackendConfig, "sim_speed"), "token_ids": (BackendConfig, "token_ids"),
        "judge_base_url": (JudgeConfig, "base_url"), "judge_model": (JudgeConfig, "model"),
        "judge_concurrency": (JudgeConfig, "concurrency"),
    },
    "serve": {
        **_ENGINE,
        "host": (ServerConfig, "host"), "port": (ServerConfig, "port"), "capacity": (ServerConfig, "capacity"),
        "lifetime_max": (ServerConfig, "lifetime_max_mins"), "max_connections": (ServerConfig, "max_connections"),
        "screenshot_format": (ServerConfig, "screenshot_format"),
    },
    "openenv": {
        **_BROWSER, "workers": (RunConfig, "workers"), "output_dir": (RunConfig, "output_dir"),
        "telemetry": (RunConfig, "telemetry"), "net_policy": (NetSettings, "enabled"),
        "allow_private_network": (NetSettings, "allow_private_network"),
        "host": (OpenEnvConfig, "host"), "port": (OpenEnvConfig, "port"), "capacity": (OpenEnvConfig, "capacity"),
        "vocabulary": (OpenEnvConfig, "vocabulary"), "screenshot": (OpenEnvConfig, "screenshot"),
        "idle_timeout": (OpenEnvConfig, "idle_timeout_s"), "heartbeat": (OpenEnvConfig, "heartbeat_s"),
    },
    "worker": {"chromium": (WorkerConfig, "chromium_path"), "insecure": (WorkerConfig, "insecure")},
}


def field_default(command: Command, option: str) -> Any:
    """The default of ``command``'s ``--option``: its config field's (:data:`OPTION_FIELDS`)."""
    cls, name = OPTION_FIELDS[command][option]
    return default_of(cls, name)


class ObserveKinds(click.ParamType):
    """``--observe screenshot,axtree``: the tuple AgentConfig takes, each name one of OBSERVE_KINDS."""

    name = "KINDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        kinds = tuple(value) if isinstance(value, tuple) else tuple(
            k.strip() for k in str(value).split(",") if k.strip())
        unknown = [k for k in kinds if k not in OBSERVE_KINDS]
        if unknown or not kinds:
            self.fail(f"{', '.join(unknown) or 'nothing'}: choose from {', '.join(OBSERVE_KINDS)}", param, ctx)
        return kinds


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
        click.option("--net-policy/--no-net-policy", default=default_of(NetSettings, "enabled"), show_default=True,
                     help="The network policy for pages; off, pages may load from any address the machine "
                          "reaches."),
    ])


def traffic_options(f: F) -> F:
    """``--record-traffic``, ``--replay-traffic``, ``--traffic-miss``: pages' traffic recorded into the run
    directory or served from one (docs/repeatable.md)."""
    return _apply(f, [
        click.option("--record-traffic", is_flag=True, default=default_of(RunConfig, "record_traffic"),
                     help="Keep every response each episode's pages received (HTTPS included) in RUN_DIR/traffic, "
                          "one archive per episode (serve: per lease), for --replay-traffic."),
        click.option("--replay-traffic", type=click.Path(exists=True, file_okay=False),
                     default=default_of(RunConfig, "replay_traffic"),
                     help="Serve every episode's pages from this run directory's recorded traffic: same task "
                          "(serve: same lease number), same bytes; the pages' clock and random numbers fixed."),
        click.option("--traffic-miss", type=click.Choice(get_args(MissPolicy)),
                     default=default_of(RunConfig, "traffic_miss"), show_default=True,
                     help="What a replayed request the recording lacks gets: a 404, or the live site."),
    ])


def net_settings(*, net_policy: bool = default_of(NetSettings, "enabled"),
                 allow_private_network: bool = default_of(NetSettings, "allow_private_network"),
                 net_allow: tuple[str, ...] = (), net_deny: tuple[str, ...] = ()) -> NetSettings:
    """The network policy :func:`net_policy_options` give; a bad --net-allow / --net-deny entry fails here, before
    anything starts (even with --no-net-policy: the entries are the user's, whether used or not)."""
    from browserpool.netpolicy import NetPolicy

    net = NetSettings(enabled=net_policy, allow_private_network=allow_private_network, allow=list(net_allow),
                      deny=list(net_deny))
    try:
        NetPolicy.of(msgspec.structs.replace(net, enabled=True))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    return net


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
