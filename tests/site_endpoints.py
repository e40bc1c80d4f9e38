"""The tests' site server: the bundled-site server plus endpoints that only tests need.

* ``/_test/slow?ms=N``: a small HTML page (``<title>slow</title>``) answered after N milliseconds;
* ``/_test/hang``: never answered; the connection is held until the server stops;
* ``/_test/echo?...``: a small HTML page (``<title>echo</title>``) showing the query string;
* ``/_test/denied``: HTTP 403 with an "Access denied" page (a site that blocks agents).

Started as ``SiteServer(module="tests.site_endpoints")`` (the ``site_server`` fixture); the same command line as
``python -m engine.sites.server``.
"""

from __future__ import annotations

import html
import sys
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote

from engine.sites.server import MIME_TYPES, SiteRequestHandler, html_page, main

MAX_SLOW_MS = 600_000


class EndpointHandler(SiteRequestHandler):
    """Files as the bundled-site server serves them, and the ``/_test/`` endpoints."""

    def serve(self, url_path: str, query: str, send_body: bool) -> None:
        if not url_path.startswith("/_test/"):
            super().serve(url_path, query, send_body)
            return
        params = parse_qsl(query, keep_blank_values=True)
        if url_path == "/_test/slow":
            self._slow(dict(params).get("ms", "1000"), send_body)
        elif url_path == "/_test/hang":
            # Never answer; hold the connection (this thread only) until the server stops.
            self.server.stopping.wait()
            self.close_connection = True
        elif url_path == "/_test/echo":
            rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in params)
            body = html_page("echo", f"<h1>Echo</h1><pre id='query'>{html.escape(unquote(query))}</pre>"
                                     f"<table id='params'>{rows}</table>")
            self.send_bytes(HTTPStatus.OK, body, MIME_TYPES[".html"], send_body, no_store=True)
        elif url_path == "/_test/denied":
            body = html_page("Access denied", "<h1>Access denied</h1><p>Automated access is not allowed.</p>")
            self.send_bytes(HTTPStatus.FORBIDDEN, body, MIME_TYPES[".html"], send_body, no_store=True)
        else:
            self.not_found(send_body)

    def _slow(self, ms_text: str, send_body: bool) -> None:
        try:
            ms = max(0, min(int(float(ms_text)), MAX_SLOW_MS))
        except (ValueError, OverflowError):
            ms = 1000
        # Waiting on the stop event (not time.sleep) lets the server stop promptly.
        if self.server.stopping.wait(ms / 1000):
            self.close_connection = True
            return
        body = html_page("slow", f"<h1>Slow page</h1><p id='delay'>Answered after {ms} ms.</p>")
        self.send_bytes(HTTPStatus.OK, body, MIME_TYPES[".html"], send_body, no_store=True)


if __name__ == "__main__":
    sys.exit(main(handler=EndpointHandler))
