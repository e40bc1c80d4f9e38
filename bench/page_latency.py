"""The bundled sites served with the page-load time of the live web: a benchmark stand-in for the internet, which
this machine cannot reach.

Every document the browser navigates to (``Sec-Fetch-Dest: document``: a start page, a followed link, a submitted
form) is answered after a delay drawn from a log-normal distribution (median :data:`LOAD_MEDIAN_S`, shape
:data:`LOAD_SIGMA`, at most :data:`LOAD_CAP_S`). Styles, scripts, images and the pages' own data requests are
answered at once, as from a CDN. The delay is a function of the URL alone (path and query, a keyed hash), so
two runs that follow the same links wait the same time: the asynchronous engine and its lock-step baseline do
the same work. Documents are sent ``no-store`` so that a browser cache never skips a delay in one run and not in
the other. The server waits without using CPU, as a remote site does.

Why these figures (an assumption, not a measurement): HTTP Archive's desktop median onLoad is about 6 s, and an
agent's settled screenshot comes before onLoad, so 3 s at the median with a long tail. The cap keeps every load
inside the worker's settle limit (``settle_timeout_s``, 10 s), so that no step's screenshot is taken before its
page arrived; the live web has longer loads, which this leaves out.

Command line: that of ``python -m engine.sites.server``; started as ``SiteServer(module="bench.page_latency")``.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import sys
from http import HTTPStatus

from engine.sites.server import SiteRequestHandler, main

LOAD_MEDIAN_S = 3.0
LOAD_SIGMA = 0.8
LOAD_CAP_S = 8.0


def describe() -> str:
    """These pages' delays in words, for the results and pages that show figures measured on them."""
    return (f"documents after a URL-keyed log-normal delay, {LOAD_MEDIAN_S:g} s at the median, shape {LOAD_SIGMA:g}, "
            f"at most {LOAD_CAP_S:g} s; an assumption standing in for the internet, not a measurement")


def page_load_s(path: str, query: str = "") -> float:
    """The seconds a document at ``path?query`` takes to arrive: log-normal, keyed by the URL, capped."""
    digest = hashlib.blake2b(f"{path}?{query}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / 2**64  # uniform in (0, 1)
    z = statistics.NormalDist().inv_cdf(u)
    return min(LOAD_CAP_S, math.exp(math.log(LOAD_MEDIAN_S) + LOAD_SIGMA * z))


class LiveLatencyHandler(SiteRequestHandler):
    """Files as the bundled-site server serves them; documents after their page-load time, never cached."""

    def _is_document(self) -> bool:
        """Whether the request being answered is a navigation's document (the browser says so)."""
        return self.headers.get("Sec-Fetch-Dest") == "document"

    def serve(self, url_path: str, query: str, send_body: bool) -> None:
        if self._is_document() and self.server.stopping.wait(page_load_s(url_path, query)):
            self.close_connection = True  # the server is stopping
            return
        super().serve(url_path, query, send_body)

    def send_bytes(self, status: HTTPStatus, body: bytes, content_type: str, send_body: bool = True, *,
                   no_store: bool = False, extra: dict[str, str] | None = None) -> None:
        super().send_bytes(status, body, content_type, send_body, no_store=no_store or self._is_document(),
                           extra=extra)


if __name__ == "__main__":
    sys.exit(main(handler=LiveLatencyHandler))
