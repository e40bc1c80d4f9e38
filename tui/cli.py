"""``webgym-engine monitor`` and the in-process monitor of ``webgym-engine run --tui``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import click

from browserpool.auth import ClientKeys, KeyFileError

# The app and the feeds (Textual, ZeroMQ) load only when a monitor runs: the engine's CLI imports this module.

T = TypeVar("T")


@click.command("monitor")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--connect", "endpoint", default=None,
              help="The engine's telemetry endpoint (tcp://HOST:PORT or ipc://PATH) instead of a run directory.")
@click.option("--output", "output_dir", default="runs", show_default=True,
              help="Without RUN_DIR: follow the latest run under this directory (waits for one to start).")
@click.option("--record", type=click.Path(dir_okay=False), default=None,
              help="Also append the raw feed to this file (play it back with --replay).")
@click.option("--replay", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Play a recorded feed instead of attaching to an engine.")
@click.option("--speed", type=float, default=1.0, show_default=True, help="--replay: playback speed.")
@click.option("--server-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="tcp with CURVE: the engine's public key file.")
@click.option("--key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="tcp with CURVE: this monitor's secret key file (its public key in the engine's --allow-keys).")
def monitor(run_dir: Path | None, endpoint: str | None, output_dir: str, record: str | None, replay: str | None,
            speed: float, server_key: str | None, key: str | None) -> None:
    """Watch a running engine: one live cell per rollout, statistics, and any rollout's details.

    Attaches to RUN_DIR's engine, or with neither RUN_DIR nor --connect to the latest run under --output;
    waits for an engine that has not started yet. Quitting the monitor leaves the engine running.
    """
    from tui.app import MonitorApp
    from tui.feed import ReplayFeed, SocketFeed, Source

    source: Source
    if replay:
        try:
            source = ReplayFeed(replay, speed=speed)
        except ValueError as exc:  # a recording with a message that is not telemetry of this format
            raise click.ClickException(str(exc)) from None
    else:
        if run_dir is not None and not run_dir.exists():
            raise click.ClickException(f"{run_dir} does not exist")
        keys = None
        if server_key or key:
            if not (server_key and key):
                raise click.ClickException("CURVE needs both --server-key and --key")
            try:
                keys = ClientKeys.load(server_key, key)
            except KeyFileError as exc:
                raise click.ClickException(str(exc)) from None
        source = SocketFeed(run_dir=run_dir, endpoint=endpoint, output_dir=output_dir, record=record, keys=keys)
    MonitorApp(source).run()


def prepare_in_process() -> None:
    """Start what must start before a Textual app captures ``sys.stderr`` (its ``fileno()`` is -1 then).

    The shared-memory frame ring registers with multiprocessing's resource tracker, whose start-up passes
    ``sys.stderr.fileno()`` to the new process: started under the app, it fails and the pool loses its workers.
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


#: How long a stopped run waits for its monitor to restore the terminal and exit.
MONITOR_EXIT_S = 5.0


async def run_with_tui(engine: Awaitable[T], run_dir: str | Path, stay: bool = True, **app_kw: Any) -> T:
    """Run ``engine`` (the run's coroutine) with the monitor on this terminal, in this process.

    The monitor attaches to the run directory's telemetry like an external one would. Quitting it lets the
    run go on to its end; the run's result (or exception) is returned (raised) once it is done. ``stay``:
    a finished run stays on screen until the user quits (else the monitor closes with the run).
    ``app_kw`` go to ``App.run_async`` (``headless=True`` for tests).
    """
    from tui.app import MonitorApp
    from tui.feed import SocketFeed

    prepare_in_process()
    task = asyncio.ensure_future(engine)
    app = MonitorApp(SocketFeed(run_dir=run_dir))
    app_task = asyncio.ensure_future(app.run_async(**app_kw))
    try:
        await asyncio.wait({task, app_task}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() and (task.exception() is not None or not stay):
            await asyncio.sleep(0.3)  # the last messages reach the screen
            app.exit()  # a failed run shows its error, not a frozen screen
        await app_task
        if not task.done():
            with contextlib.suppress(OSError):  # the monitor may have closed because its terminal went away
                click.echo(f"monitor closed; the run goes on (Ctrl+C interrupts; watch it again with "
                           f"`webgym-engine monitor {run_dir}`)", err=True)
        return await task
    except BaseException:
        # Stopped (Ctrl-C, SIGTERM, or SIGHUP from a terminal that went away): the monitor lets go of the
        # terminal first, then the run stops. A monitor that cannot finish its shutdown is left behind.
        app.exit()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if not app_task.done():
            await asyncio.wait({app_task}, timeout=MONITOR_EXIT_S)
        if not app_task.done():
            app_task.cancel()
        raise
