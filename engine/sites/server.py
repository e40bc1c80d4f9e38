"""Static HTTP server for the bundled websites, run in its own process.

Command line::

    python -m engine.sites.server --host 127.0.0.1 --port 0 [--mount /fixtures=/abs/dir ...]

binds (port 0 picks a free port), prints exactly one line ``READY http://HOST:PORT`` once it is
listening and serves until SIGTERM or SIGINT. The engine normally uses :class:`SiteServer`, which
starts that command as a child process so that serving pages never costs the engine's event loop
any CPU time.

It serves files only. A program that needs more endpoints (the tests' slow and hanging pages,
``tests/site_endpoints.py``) subclasses :class:`SiteRequestHandler`, calls :func:`main` with it, and is started
with ``SiteServer(module=...)``.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, cast
from urllib.parse import unquote, urlsplit

from browserpool.netpolicy import register_engine_site, unregister_engine_site

WWW_ROOT = Path(__file__).resolve().parent / "www"
"""Default document root: the bundled websites."""

READY_PREFIX = "READY "

MIME_TYPES: dict[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".htm": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json; charset=utf-8",
    ".jsonl": "application/jsonl; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".csv": "text/csv; charset=utf-8",
    ".xml": "application/xml; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".wasm": "application/wasm",
    ".pdf": "application/pdf",
}
DEFAULT_MIME = "application/octet-stream"
STATIC_CACHE_CONTROL = "max-age=3600"


class SiteHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that knows its document roots and when it is stopping."""

    daemon_threads = True
    request_queue_size = 512  # many browser contexts open connections at the same moment

    def __init__(self, address: tuple[str, int], roots: list[tuple[str, Path]],
                 handler: type[SiteRequestHandler] | None = None) -> None:
        # Longest prefix first, so that a mount under "/" never shadows a more specific one.
        self.roots = sorted(roots, key=lambda r: len(r[0]), reverse=True)
        self.stopping = threading.Event()  # set when the server stops: a handler that waits should return then
        self._file_cache: dict[Path, tuple[int, int, bytes]] = {}
        self._cache_lock = threading.Lock()
        super().__init__(address, handler or SiteRequestHandler)

    def read_file(self, path: Path) -> bytes:
        """Return a file's bytes, cached in memory for as long as its size and mtime are unchanged."""
        st = path.stat()
        key = (st.st_mtime_ns, st.st_size)
        with self._cache_lock:
            hit = self._file_cache.get(path)
        if hit is not None and hit[:2] == key:
            return hit[2]
        data = path.read_bytes()
        if len(data) <= 4 * 1024 * 1024:
            with self._cache_lock:
                self._file_cache[path] = (key[0], key[1], data)
        return data

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        # Browsers drop connections all the time (navigation, closed contexts); that is not an error.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class SiteRequestHandler(BaseHTTPRequestHandler):
    """Serves files from the server's roots (GET and HEAD)."""

    protocol_version = "HTTP/1.1"
    server_version = "WebGymSites/1.0"
    sys_version = ""
    timeout = 120  # idle keep-alive connections are closed after this many seconds
    server: SiteHTTPServer

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: object) -> None:
        """Silence per-request logging: thousands of requests per episode batch would flood stderr."""

    # -- dispatch ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(send_body=True)

    def do_HEAD(self) -> None:
        self._dispatch(send_body=False)

    def _method_not_allowed(self) -> None:
        self.send_bytes(HTTPStatus.METHOD_NOT_ALLOWED, b"", "text/plain", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _method_not_allowed

    def _dispatch(self, send_body: bool) -> None:
        parts = urlsplit(self.path)
        self.serve(parts.path, parts.query, send_body)

    def serve(self, url_path: str, query: str, send_body: bool) -> None:
        """Answer a GET (``send_body``) or HEAD of ``url_path``: a subclass that serves more paths overrides this."""
        self._serve_file(url_path, query, send_body)

    # -- files ------------------------------------------------------------------------------------

    def _resolve(self, url_path: str) -> tuple[Path, Path] | None:
        """Map a URL path to (root, file path) without ever leaving a root; None if no root matches."""
        decoded = unquote(url_path, errors="strict") if "%" in url_path else url_path
        if "\x00" in decoded or "\\" in decoded:
            return None
        for prefix, root in self.server.roots:
            if prefix == "/":
                rel = decoded
            elif decoded == prefix or decoded.startswith(prefix + "/"):
                rel = decoded[len(prefix) :]
            else:
                continue
            segments = [s for s in rel.split("/") if s not in ("", ".")]
            if any(s == ".." for s in segments):
                return None
            candidate = root.joinpath(*segments) if segments else root
            try:
                real = candidate.resolve()
            except (OSError, RuntimeError):
                return None
            if real != root and not real.is_relative_to(root):
                return None  # a symlink pointing outside the root
            return root, real
        return None

    def _serve_file(self, url_path: str, query: str, send_body: bool) -> None:
        try:
            resolved = self._resolve(url_path)
        except UnicodeDecodeError:
            resolved = None
        if resolved is None:
            self.not_found(send_body)
            return
        _, target = resolved
        if target.is_dir():
            if not url_path.endswith("/"):
                # Relative links inside index.html need the trailing slash, as with any web server.
                location = url_path + "/" + (f"?{query}" if query else "")
                self.send_bytes(HTTPStatus.MOVED_PERMANENTLY, b"", "text/plain", extra={"Location": location})
                return
            target = target / "index.html"
        if not target.is_file():
            self.not_found(send_body)
            return
        try:
            data = self.server.read_file(target)
        except OSError:
            self.not_found(send_body)
            return
        mime = MIME_TYPES.get(target.suffix.lower(), DEFAULT_MIME)
        self.send_bytes(HTTPStatus.OK, data, mime, send_body)

    def not_found(self, send_body: bool = True) -> None:
        """Answer 404 with a small HTML page."""
        body = html_page("404 Not Found", "<h1>Not Found</h1><p>The requested URL was not found.</p>")
        self.send_bytes(HTTPStatus.NOT_FOUND, body, MIME_TYPES[".html"], send_body, no_store=True)

    def send_bytes(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str,
        send_body: bool = True,
        *,
        no_store: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        """Answer with ``body`` (not sent for HEAD), its type and length, and the cache policy."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store" if no_store else STATIC_CACHE_CONTROL)
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)


def html_page(title: str, body_html: str) -> bytes:
    """A minimal HTML document with ``title`` (escaped) and ``body_html`` (as given)."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<link rel='icon' href='data:,'>"
        f"<title>{html.escape(title)}</title></head><body>{body_html}</body></html>"
    ).encode()


# -- command line -----------------------------------------------------------------------------------


def _parse_mount(spec: str) -> tuple[str, Path]:
    prefix, sep, directory = spec.partition("=")
    if not sep or not prefix.startswith("/") or not directory:
        raise argparse.ArgumentTypeError(f"mount must look like /prefix=/abs/dir, got {spec!r}")
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else "/"
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"mount directory does not exist: {directory}")
    return prefix, path


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    """Stop when the parent process disappears, so a killed engine never leaves a server behind."""
    while not stop.wait(1.0):
        if os.getppid() != parent_pid:
            stop.set()


def main(argv: list[str] | None = None, handler: type[SiteRequestHandler] = SiteRequestHandler) -> int:
    """Run the server until SIGTERM/SIGINT with ``handler`` as its request handler; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m engine.sites.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--root", type=Path, default=WWW_ROOT, help="directory served at /")
    parser.add_argument(
        "--mount",
        type=_parse_mount,
        action="append",
        default=[],
        metavar="PREFIX=DIR",
        help="serve DIR under the URL prefix PREFIX (repeatable)",
    )
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)

    root = args.root.expanduser().resolve()
    if not root.is_dir():
        parser.error(f"root directory does not exist: {root}")
    roots = [("/", root), *args.mount]
    httpd = SiteHTTPServer((args.host, args.port), roots, handler)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, stop), daemon=True).start()

    # serve_forever runs in a thread: shutdown() must be called from a different thread than it.
    serving = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serving.start()
    # An AF_INET server's address, as getsockname() gives it: the host is a str, never bytes.
    host, port = cast("tuple[str, int]", httpd.server_address[:2])
    print(f"{READY_PREFIX}http://{host}:{port}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        httpd.stopping.set()  # releases handlers that wait on it
        httpd.shutdown()
        httpd.server_close()
    return 0


# -- Python API -------------------------------------------------------------------------------------


class SiteServer:
    """Runs ``python -m engine.sites.server`` (or ``module``, a server built on :func:`main`) as a child process.

    Example::

        with SiteServer() as server:
            page.goto(server.base_url + "/shop/")
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        mounts: dict[str, Path] | None = None,
        *,
        root: Path | None = None,
        ready_timeout: float = 15.0,
        module: str = "engine.sites.server",
    ) -> None:
        self.host = host
        self.port = port
        self.mounts = {prefix: Path(directory) for prefix, directory in (mounts or {}).items()}
        self.root = root
        self.ready_timeout = ready_timeout
        self.module = module  # the server program: this module, or one that calls main() with its own handler
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._base_url: str | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the running server (no trailing slash)."""
        if self._base_url is None:
            raise RuntimeError("SiteServer is not started")
        return self._base_url

    @property
    def running(self) -> bool:
        """Whether the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The child's command line."""
        cmd = [sys.executable, "-m", self.module, "--host", self.host, "--port", str(self.port)]
        if self.root is not None:
            cmd += ["--root", str(Path(self.root).resolve())]
        for prefix, directory in self.mounts.items():
            cmd += ["--mount", f"{prefix}={Path(directory).resolve()}"]
        cmd += ["--parent-pid", str(os.getpid())]
        return cmd

    def start(self) -> str:
        """Start the child, wait for its READY line and return the base URL."""
        if self.running:
            return self.base_url
        project_root = Path(__file__).resolve().parents[2]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(project_root), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        # stderr goes to a file, never a pipe nobody reads (a full pipe would block the child).
        # It lives as long as the child, so no context manager: stop() closes it.
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="sites-server-", suffix=".log")  # noqa: SIM115
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=str(project_root),
            env=env,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        proc = self._proc

        def read_stdout() -> None:
            # Reads until EOF (the child exits), then closes the pipe; stop() never closes it under us.
            stream = proc.stdout
            assert stream is not None
            try:
                for line in stream:
                    lines.put(line)
            except (OSError, ValueError):
                pass
            finally:
                lines.put(None)
                stream.close()

        threading.Thread(target=read_stdout, name="sites-server-stdout", daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise RuntimeError(f"site server gave no READY line within {self.ready_timeout:.0f}s")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:  # stdout closed: the child died before it was ready
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
                err = self._read_stderr()
                self.stop()
                raise RuntimeError(f"site server exited with code {proc.returncode} before READY:\n{err}")
            if line.startswith(READY_PREFIX):
                self._base_url = line[len(READY_PREFIX) :].strip().rstrip("/")
                register_engine_site(self._base_url)  # the network policy lets pages load the engine's own sites
                return self._base_url

    def _read_stderr(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            return self._stderr.read()
        except (OSError, ValueError):
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the child (SIGTERM), wait, and kill it if it does not exit within ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._base_url is not None:
            unregister_engine_site(self._base_url)
        self._base_url = None

    def __enter__(self) -> SiteServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self._base_url if self.running else "stopped"
        return f"SiteServer({state})"


if __name__ == "__main__":
    sys.exit(main())
