"""``webgym-engine view RUN_DIR``: build the run's static HTML report and print its path.

Also runnable on its own: ``python -m viewer.cli RUN_DIR [--open] [--serve] [--port N]``.
"""

from __future__ import annotations

import functools
import http.server
import threading
import webbrowser
from pathlib import Path
from typing import Any

import click

from engine.store.records import RecordFormatError
from engine.web.local_only import web_page_refusal
from viewer.report import build_report


def serve(run_dir: Path, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for the run directory (the report plus the frames it references)."""
    handler = functools.partial(_RunDirHandler, directory=str(Path(run_dir).resolve()))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


class _RunDirHandler(http.server.SimpleHTTPRequestHandler):
    """The run directory for a browser on this machine, and nothing for a web page of another site
    (engine.web.local_only: a site that points its name at 127.0.0.1 could read the run's screenshots and prompts), nor
    a file that a link leads to out of the run directory (a run directory may come from elsewhere)."""

    def send_head(self) -> Any:
        refusal = web_page_refusal(self.headers, "127.0.0.1")
        if refusal is not None:
            self.send_error(403, refusal)
            return None
        if not Path(self.translate_path(self.path)).resolve().is_relative_to(self.directory):
            self.send_error(404, "outside the run directory")
            return None
        return super().send_head()

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
    try:
        index = build_report(run_dir)
    except RecordFormatError as exc:  # a manifest or a record line this code cannot read: say which, no traceback
        raise click.ClickException(str(exc)) from None
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
