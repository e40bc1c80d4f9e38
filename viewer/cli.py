"""``webgym-engine view RUN_DIR``: build the run's static HTML report and print its path.

Also runnable on its own: ``python -m viewer.cli RUN_DIR [--open] [--serve] [--port N]``.
"""

from __future__ import annotations

import functools
import http.server
import threading
import webbrowser
from pathlib import Path

import click

from viewer.report import build_report


def serve(run_dir: Path, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for the run directory (the report plus the frames it references)."""
    handler = functools.partial(_QuietHandler, directory=str(run_dir))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # one line per screenshot would bury the URL printed at start


@click.command("view")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--open", "open_browser", is_flag=True, help="Open the report in the default web browser.")
@click.option("--serve", "serve_http", is_flag=True,
              help="Also serve the run directory on 127.0.0.1 (for large runs, or browsers that limit file://).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port for --serve (0: any free one).")
def view(run_dir: Path, open_browser: bool, serve_http: bool, port: int) -> None:
    """Write a static HTML report of RUN_DIR into RUN_DIR/report/ and print its path.

    Works on a run that is still going: it shows the episodes finished so far (run it again to refresh).
    """
    index = build_report(run_dir)
    click.echo(str(index))
    if not serve_http:
        if open_browser:
            webbrowser.open(index.resolve().as_uri())
        return
    server = serve(run_dir, port)
    url = f"http://127.0.0.1:{server.server_address[1]}/report/index.html"
    click.echo(f"serving {run_dir} at {url} (Ctrl-C to stop)")
    if open_browser:
        threading.Timer(0.3, webbrowser.open, (url,)).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    view()
