"""``webgym-engine serve``: the engine as a browser server that speaks the Omniboxes API (docs/server.md)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import click
from rich.console import Console

from browserpool.config import WorkerConfig
from cli.console_streams import keep_going_without_a_console
from cli.options import (
    check_sockets,
    field_default,
    net_policy_options,
    net_settings,
    traffic_options,
    worker_socket_options,
)
from cli.serving import api_key_from, require_chromium, serve_until_signal
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.web.local_only import is_loopback
from server.app import BrowserServer, ServerConfig

serve_default = functools.partial(field_default, "serve")
DEFAULT_KEY_ENV = "CPU_CLUSTER_TOKEN"  # where WebGym's and AsyncWebRL's clients read the key from


@click.command("serve")
@click.option("--host", default=serve_default("host"), show_default=True,
              help="Address to bind (loopback by default; give the server a key before binding elsewhere).")
@click.option("--port", type=click.IntRange(0, 65535), default=serve_default("port"), show_default=True,
              help="0: any free port.")
@click.option("--api-key-env", default=DEFAULT_KEY_ENV, show_default=True,
              help="Environment variable that holds the x-api-key every request must carry (unset: no key).")
@click.option("--workers", type=click.IntRange(1), default=serve_default("workers"), show_default=True,
              help="Browser worker processes (one Chromium each).")
@click.option("--capacity", type=click.IntRange(1), default=serve_default("capacity"), show_default=True,
              help="Leases (browser contexts) at once; /get answers 503 beyond it.")
@click.option("--lifetime-max", type=click.IntRange(0), default=serve_default("lifetime_max"), show_default=True,
              help="The largest lifetime_mins /get accepts; a lease unused for its lifetime expires.")
@click.option("--record", is_flag=True,
              help="Write every lease into the run directory (its commands as steps, its screenshots), for "
                   "`webgym-engine view`.")
@click.option("--output", "output_dir", default=serve_default("output_dir"), show_default=True,
              help="Where the run directory goes.")
@click.option("--sites", is_flag=True, help="Also serve the bundled sites (their URL is printed).")
@click.option("--max-connections", type=click.IntRange(1), default=serve_default("max_connections"), show_default=True,
              help="Client connections open at once; one more gets a 503 and is closed.")
@click.option("--screenshot-format", type=click.Choice(["jpeg", "png"]), default=serve_default("screenshot_format"),
              show_default=True,
              help="/screenshot's format when a request does not ask (format=png).")
@click.option("--chromium", default=serve_default("chromium"), show_default=True, help="Chromium executable.")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=serve_default("jpeg_quality"), show_default=True)
@click.option("--settle-timeout", type=float, default=serve_default("settle_timeout"), show_default=True,
              help="Hard cap (s) on one command plus waiting for the page to settle.")
@click.option("--telemetry", default=serve_default("telemetry"), show_default=True,
              help="Live telemetry for `webgym-engine monitor` (one cell per lease): ipc, tcp://HOST:PORT or off.")
@worker_socket_options
@net_policy_options
@traffic_options
@click.pass_context
def serve(ctx: click.Context, **opts: Any) -> None:
    """Serve browsers over the Omniboxes HTTP API, for WebGym's and AsyncWebRL's rollout clients."""
    keep_going_without_a_console()
    console = Console(stderr=True)
    require_chromium(opts["chromium"])
    key_env = opts["api_key_env"]
    api_key = api_key_from(ctx, key_env)
    if api_key is None and not is_loopback(opts["host"]):
        console.print(f"WARNING: serving on {opts['host']} without an API key: anyone who reaches the port can "
                      f"drive its browsers (set {key_env})")
    net = net_settings(net_policy=opts["net_policy"], allow_private_network=opts["allow_private_network"],
                       net_allow=opts["net_allow"], net_deny=opts["net_deny"])
    try:
        cfg = RunConfig(
            concurrency=opts["capacity"], workers=opts["workers"], output_dir=opts["output_dir"],
            telemetry=opts["telemetry"], secret_env=(key_env,), episode_timeout_s=None, listen=opts["listen"],
            spawn_workers=not opts["no_spawn"], server_key=opts["server_key"], allow_keys=opts["allow_keys"],
            insecure=opts["insecure"], record_traffic=opts["record_traffic"],
            replay_traffic=opts["replay_traffic"], traffic_miss=opts["traffic_miss"],
            worker=WorkerConfig(endpoint="", chromium_path=opts["chromium"], jpeg_quality=opts["jpeg_quality"],
                                settle_timeout_s=opts["settle_timeout"], net=net))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    check_sockets(cfg, console)
    server_cfg = ServerConfig(host=opts["host"], port=opts["port"], api_key=api_key, capacity=opts["capacity"],
                              lifetime_max_mins=opts["lifetime_max"], record=opts["record"],
                              screenshot_format=opts["screenshot_format"], max_connections=opts["max_connections"])
    serve_until_signal(_serve(cfg, server_cfg, opts["sites"], console), console,
                       "server stopped; every lease was released")


async def _serve(cfg: RunConfig, server_cfg: ServerConfig, sites: bool, console: Console) -> None:
    async with EngineCore(cfg, serve_sites=sites) as core:
        server = BrowserServer(core, server_cfg)
        try:
            url = await server.start()
            console.print(f"serving the Omniboxes API on {url}: {server_cfg.capacity} leases on {cfg.workers} "
                          f"browser workers; run directory {core.run_dir}"
                          + (f"; bundled sites at {core.base_url}" if sites else ""))
            await asyncio.Event().wait()  # until Ctrl-C or a signal
        finally:
            await server.close()
