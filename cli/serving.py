"""What the server commands (``serve``, ``openenv``) share: their browser, their key, and running until a signal."""

from __future__ import annotations

import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from cli.open_files import raise_open_file_limit
from engine.core.gc_tuning import tune_for_engine_process
from engine.core.shutdown import Terminated, until_signal


def require_chromium(path: str) -> None:
    """A usage error when the workers' Chromium is not at ``path``."""
    if not Path(path).exists():
        raise click.ClickException(f"Chromium not found at {path} (apt-get install chromium)")


def api_key_from(ctx: click.Context, key_env: str) -> str | None:
    """The key in ``key_env`` (None when unset); a usage error when the variable was named but is not set."""
    api_key = os.environ.get(key_env) or None
    if api_key is None and ctx.get_parameter_source("api_key_env") is not ParameterSource.DEFAULT:
        raise click.ClickException(f"--api-key-env {key_env}: the variable is not set")
    return api_key


def serve_until_signal(main: Coroutine[Any, Any, None], console: Console, stopped: str) -> None:
    """Run a server's ``main`` on uvloop in the engine process's settings until Ctrl-C or a signal; then say
    ``stopped`` and exit with the signal's status."""
    import uvloop

    tune_for_engine_process()
    raise_open_file_limit()
    try:
        uvloop.run(until_signal(main))
    except (KeyboardInterrupt, Terminated) as exc:
        console.print(stopped)
        sys.exit(exc.exit_code if isinstance(exc, Terminated) else 0)
