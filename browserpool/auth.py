"""ZeroMQ CURVE authentication for sockets that leave the host: key files, the allow-list, and the ZAP
handler that checks every connecting peer's public key against it.

Key files are ZeroMQ certificates (``NAME.key`` holds the public key, ``NAME.key_secret`` both keys), as
pyzmq's ``zmq.auth`` writes and reads them, created with 0600 permissions in a 0700 directory.
The engine binds with its secret key and an allow-list of client public keys (a directory of ``*.key``
files, or one such file); a client connects with the engine's public key and its own key pair.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger("webgym.auth")

# Environment variable that hands a spawned worker its CURVE keys (the environment of a process is readable
# by its own user only, unlike its command line); the worker removes it before it starts Chromium.
CURVE_ENV = "WEBGYM_WORKER_CURVE"


class KeyFileError(ValueError):
    """A key file that is missing, unreadable, of the wrong kind or too widely readable."""


def create_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (secret) into ``directory`` (0700), both 0600.
    Refuses to overwrite an existing key. Returns (public file, secret file)."""
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"invalid key name {name!r}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (public, secret):
        if p.exists():
            raise KeyFileError(f"{p} exists; remove it first to make a new key")
    old = os.umask(0o077)  # the secret is never readable by others, not even for a moment
    try:
        pub, sec = zmq.auth.create_certificates(d, name)
    finally:
        os.umask(old)
    for f in (pub, sec):
        os.chmod(f, 0o600)
    return Path(pub), Path(sec)


def load_secret_key(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a ``.key_secret`` file; refuses files others can read."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        public, secret = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read the key file {p}: {exc}") from None
    if secret is None:
        raise KeyFileError(f"{p} holds no secret key (a .key_secret file is needed here)")
    if mode & 0o077:
        raise KeyFileError(f"{p} is readable by others (mode {mode & 0o777:o}); chmod 600 it")
    return public, secret


def load_public_key(path: str | Path) -> bytes:
    """The z85 public key of a ``.key`` (or ``.key_secret``) file."""
    try:
        public, _ = zmq.auth.load_certificate(Path(path))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc}") from None
    return public


def load_allowed_keys(path: str | Path) -> set[bytes]:
    """The public keys allowed to connect: every ``*.key`` file of a directory, or one key file."""
    p = Path(path)
    if p.is_dir():
        keys = {load_public_key(f) for f in sorted(p.glob("*.key"))}
        if not keys:
            raise KeyFileError(f"no *.key files in {p}")
        return keys
    return {load_public_key(p)}


@dataclass
class ServerKeys:
    """What a CURVE server socket needs: its key pair and the client keys it lets in."""

    public: bytes
    secret: bytes
    allowed: set[bytes] = field(default_factory=set)

    @classmethod
    def load(cls, secret_file: str | Path, allowed: str | Path | None) -> ServerKeys:
        public, secret = load_secret_key(secret_file)
        return cls(public, secret, load_allowed_keys(allowed) if allowed else set())

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE server (before bind)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True


@dataclass(frozen=True)
class ClientKeys:
    """What a CURVE client socket needs: the server's public key and its own key pair."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, server_key_file: str | Path, secret_file: str | Path) -> ClientKeys:
        public, secret = load_secret_key(secret_file)
        return cls(load_public_key(server_key_file), public, secret)

    @classmethod
    def ephemeral(cls, server_public: bytes) -> ClientKeys:
        """A fresh key pair in memory (the pool's own local workers)."""
        public, secret = zmq.curve_keypair()
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client (before connect)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def to_env(self) -> str:
        # "," is not in the Z85 alphabet.
        return b",".join((self.server_public, self.public, self.secret)).decode()

    @classmethod
    def from_env(cls, value: str) -> ClientKeys:
        parts = value.encode().split(b",")
        if len(parts) != 3 or any(len(p) != 40 for p in parts):
            raise KeyFileError(f"{CURVE_ENV} does not hold three Z85 keys")
        return cls(*parts)


class _AllowList:
    """The ZAP credentials provider: a set of allowed z85 public keys, with bans, reporting refusals."""

    def __init__(self, keys: set[bytes], on_refused: Callable[[str], object] | None) -> None:
        self.keys = keys
        self.banned: set[bytes] = set()
        self.on_refused = on_refused

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key in self.keys and key not in self.banned
        if not ok:
            why = "banned after repeated bad messages" if key in self.banned else "not in the allow-list"
            message = f"refused a peer with public key {key.decode(errors='replace')}: {why}"
            log.warning(message)
            if self.on_refused is not None:
                self.on_refused(message)
        return ok


class CurveGuard:
    """Runs the ZAP handler of one ZeroMQ context: every CURVE peer's key is checked against ``keys``.

    The handler runs in a thread on a plain-socket view of the context (asyncio contexts included): pyzmq's
    asyncio authenticator leaves its socket's file descriptor registered with the event loop when stopped, so a
    second one started later in the same process never hears a request. Handshakes are rare; a thread is fine.
    A peer's messages carry its z85 public key as the frame property ``User-Id``."""

    def __init__(self, ctx: zmq.Context[Any], keys: ServerKeys,
                 on_refused: Callable[[str], object] | None = None) -> None:
        self._auth = ThreadAuthenticator(zmq.Context.shadow(ctx.underlying))
        self.allow = _AllowList(set(keys.allowed), on_refused)  # a copy: bans and additions stay here

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self.allow)

    def add(self, public: bytes) -> None:
        self.allow.keys.add(public)

    def ban(self, public: bytes) -> None:
        """Refuse this key from now on (its open connection stays until it drops; its messages are ignored)."""
        self.allow.banned.add(public)

    def stop(self) -> None:
        self._auth.stop()


def warn_insecure(endpoint: str, what: str) -> str:
    """The warning printed when a tcp socket runs without CURVE."""
    return (f"WARNING: {what} on {endpoint} without CURVE authentication (--insecure): any peer that can reach "
            "this port is trusted")
