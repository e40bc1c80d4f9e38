"""The bundled-site server over real HTTP: what it serves, and what it refuses (paths that leave its roots, methods
it does not serve). It serves files only; the tests' slow, hanging and echo pages live in tests/site_endpoints.py."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from engine.sites.server import SiteServer


def request(base: str, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request whose path is sent exactly as given (no client-side normalising)."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mount whose only entries point outside it (a symlink), and a file beside it that must stay unserved."""
    base = tmp_path_factory.mktemp("mount")
    (base / "secret.txt").write_text("not for the browser")
    mount = base / "m"
    mount.mkdir()
    (mount / "page.html").write_text("<title>inside</title>")
    (mount / "escape.txt").symlink_to(base / "secret.txt")
    return mount


@pytest.fixture(scope="module")
def product(outside: Path) -> Iterator[str]:
    with SiteServer(mounts={"/m": outside}) as server:
        yield server.base_url


def test_pages_are_served_with_their_type_and_a_directory_gets_its_slash(product: str) -> None:
    status, headers, body = request(product, "GET", "/shop/")
    assert status == 200 and headers["content-type"].startswith("text/html") and b"<html" in body.lower()
    status, headers, body = request(product, "HEAD", "/shop/")
    assert status == 200 and int(headers["content-length"]) > 0 and body == b""
    status, headers, _ = request(product, "GET", "/shop?x=1")
    assert status == 301 and headers["location"] == "/shop/?x=1"
    assert request(product, "GET", "/m/page.html")[2] == b"<title>inside</title>"


@pytest.mark.parametrize("path", ["/../../../etc/passwd", "/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/m/../secret.txt",
                                  "/m/%2e%2e/secret.txt", "/m/escape.txt", "/shop/%00.html", "/shop\\..\\..\\x",
                                  "/%ff%fe"])
def test_a_path_that_leaves_the_roots_is_not_found(product: str, path: str) -> None:
    status, _, body = request(product, "GET", path)
    assert status == 404 and b"not for the browser" not in body


def test_only_get_and_head_are_served(product: str) -> None:
    status, headers, _ = request(product, "POST", "/shop/")
    assert status == 405 and headers["allow"] == "GET, HEAD"


@pytest.mark.wallclock
def test_the_product_server_has_no_test_endpoints(product: str) -> None:
    t0 = time.monotonic()
    assert request(product, "GET", "/_test/hang")[0] == 404
    assert request(product, "GET", "/_test/echo?q=1")[0] == 404
    assert time.monotonic() - t0 < 5


def test_the_tests_server_adds_its_endpoints_to_the_files(site_server: str) -> None:
    status, _, body = request(site_server, "GET", "/_test/echo?q=a&q=b%3Cc")
    assert status == 200 and b"<title>echo</title>" in body
    assert body.count(b"<th>q</th>") == 2 and b"b&lt;c" in body  # every value, escaped
    t0 = time.monotonic()
    status, _, body = request(site_server, "GET", "/_test/slow?ms=300")
    assert status == 200 and b"Answered after 300 ms." in body and time.monotonic() - t0 >= 0.29
    assert request(site_server, "GET", "/_test/slow?ms=inf")[0] == 200  # an unreadable delay is the default
    assert request(site_server, "GET", "/_test/nothing")[0] == 404
    assert request(site_server, "GET", "/shop/")[0] == 200
    assert request(site_server, "GET", "/fixtures/click.html")[0] == 200
