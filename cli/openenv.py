"""``webgym-engine openenv``: the engine as an OpenEnv environment server (docs/openenv.md)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import click
from rich.console import Console

from browserpool.config import WorkerConfig
from cli.console_streams import keep_going_without_a_console
from cli.options import field_default, net_policy_options, net_settings
from cli.serving import api_key_from, require_chromium, serve_until_signal
from engine.clients.runner import load_task_source
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.tasks.miniwob import is_miniwob_spec, miniwob_mount
from engine.tasks.schema import BUNDLED_TASKS
from engine.web.local_only import is_loopback
from server.openenv.app import OpenEnvServer
from server.openenv.config import OpenEnvConfig
from server.openenv.vocabularies import SCREENSHOT_FORMS, VOCABULARIES

openenv_default = functools.partial(field_default, "openenv")
DEFAULT_KEY_ENV = "OPENENV_API_KEY"


@click.command("openenv")
@click.option("--tasks", "tasks_spec", default=str(BUNDLED_TASKS), show_default="the bundled tasks",
              help="A WebGym task file, or miniwob / miniwob:NAME,... for MiniWoB++'s tasks.")
@click.option("--host", default=openenv_default("host"), show_default=True,
              help="Address to bind (loopback by default; give the server a key before binding elsewhere).")
@click.option("--port", type=click.IntRange(0, 65535), default=openenv_default("port"), show_default=True,
              help="0: any free port.")
@click.option("--api-key-env", default=DEFAULT_KEY_ENV, show_default=True,
              help="Environment variable that holds the key every request must carry (unset: no key).")
@click.option("--capacity", type=click.IntRange(1), default=openenv_default("capacity"), show_default=True,
              help="Sessions at once; one more gets CAPACITY_REACHED.")
@click.option("--workers", type=click.IntRange(1), default=openenv_default("workers"), show_default=True,
              help="Browser worker processes (one Chromium each).")
@click.option("--vocabulary", type=click.Choice(VOCABULARIES), default=openenv_default("vocabulary"),
              show_default=True, help="The sessions' actions and observations unless a reset asks for the other.")
@click.option("--screenshot", type=click.Choice(SCREENSHOT_FORMS), default=openenv_default("screenshot"),
              show_default=True, help="browsergym: the screenshot as BrowserGym's integer rows, as base64 JPEG in "
                                      "the metadata, or none.")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=openenv_default("idle_timeout"),
              show_default=True, help="Seconds a session may send nothing before its episode ends (client_idle).")
@click.option("--heartbeat", type=click.FloatRange(min=1), default=openenv_default("heartbeat"), show_default=True,
              help="Seconds between the server's pings.")
@click.option("--output", "output_dir", default=openenv_default("output_dir"), show_default=True,
              help="Where the run directory goes.")
@click.option("--chromium", default=openenv_default("chromium"), show_default=True, help="Chromium executable.")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=openenv_default("jpeg_quality"),
              show_default=True)
@click.option("--settle-timeout", type=float, default=openenv_default("settle_timeout"), show_default=True,
              help="Hard cap (s) on one action plus waiting for the page to settle.")
@click.option("--telemetry", default=openenv_default("telemetry"), show_default=True,
              help="Live telemetry for `webgym-engine monitor` (one cell per session): ipc, tcp://HOST:PORT or off.")
@net_policy_options
@click.pass_context
def openenv(ctx: click.Context, **opts: Any) -> None:
    """Serve the engine's browsers as an OpenEnv environment, for trainers that take OpenEnv environments."""
    keep_going_without_a_console()
    console = Console(stderr=True)
    require_chromium(opts["chromium"])
    key_env = opts["api_key_env"]
    api_key = api_key_from(ctx, key_env)
    if api_key is None and not is_loopback(opts["host"]):
        raise click.ClickException(f"--host {opts['host']} is not loopback: set {key_env} (the key every client "
                                   "must send) before serving browsers beyond this machine")
    net = net_settings(net_policy=opts["net_policy"], allow_private_network=opts["allow_private_network"],
                       net_allow=opts["net_allow"], net_deny=opts["net_deny"])
    try:
        # The client's think time between steps is bounded by the idle timeout, not by the engine's step and
        # episode caps (a trainer's generation may take minutes).
        cfg = RunConfig(concurrency=opts["capacity"], workers=opts["workers"], output_dir=opts["output_dir"],
                        telemetry=opts["telemetry"], secret_env=(key_env,), episode_timeout_s=None,
                        policy_step_timeout_s=None,
                        worker=WorkerConfig(endpoint="", chromium_path=opts["chromium"],
                                            jpeg_quality=opts["jpeg_quality"],
                                            settle_timeout_s=opts["settle_timeout"], net=net))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    server_cfg = OpenEnvConfig(host=opts["host"], port=opts["port"], api_key=api_key, capacity=opts["capacity"],
                               vocabulary=opts["vocabulary"], screenshot=opts["screenshot"],
                               idle_timeout_s=opts["idle_timeout"], heartbeat_s=opts["heartbeat"])
    serve_until_signal(_serve(cfg, server_cfg, opts["tasks_spec"], console), console,
                       "server stopped; every session's episode was recorded")


async def _serve(cfg: RunConfig, server_cfg: OpenEnvConfig, spec: str, console: Console) -> None:
    mounts = miniwob_mount() if is_miniwob_spec(spec) else None
    async with EngineCore(cfg, serve_sites=True, site_mounts=mounts) as core:
        try:
            tasks = load_task_source(spec, core.base_url)
        except (OSError, ValueError, RuntimeError) as exc:
            raise click.ClickException(f"--tasks {spec}: {exc}") from None
        server = OpenEnvServer(core, tasks, server_cfg)
        try:
            url = await server.start()
            console.print(f"serving OpenEnv on {url} (ws {url.replace('http', 'ws', 1)}/ws): {len(tasks)} tasks, "
                          f"{server_cfg.capacity} sessions on {cfg.workers} browser workers, the "
                          f"{server_cfg.vocabulary} vocabulary; run directory {core.run_dir}")
            await asyncio.Event().wait()  # until Ctrl-C or a signal
        finally:
            await server.close()
