"""Credentials inside URLs, masked before they reach a record, a manifest or an error message.

Two kinds of secret ride in URLs: userinfo (``https://user:pass@host/``, ``https://TOKEN@host/``) and
query or fragment parameters whose name says what they are (``?token=...``, ``&api_key=...``,
``#access_token=...``, ``X-Amz-Signature=...``). Both become ``***``; everything else of the URL is kept
byte for byte (no re-encoding), so a masked URL still says where the page was.

The engine keeps using the real URL to navigate; only what is written down is masked. The functions are
pure and cheap: a string with no ``@`` and no ``=`` (most page URLs) comes back as it is after two
substring tests, and parameter names are classified once (cached).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

# A parameter is secret when one of its words (split at punctuation and camelCase) is one of these...
_SECRET_WORDS = frozenset({
    "key", "apikey", "token", "secret", "password", "passwd", "pwd", "pass", "passphrase", "sig", "signature",
    "auth", "authorization", "credential", "credentials", "jwt", "sid", "sessionid", "phpsessid", "jsessionid",
})
# ... or when its name, lower-cased with the punctuation taken out, ends with one of these
# ("access_token", "X-Amz-Credential", "client_secret", "authToken", "privateKey").
_SECRET_SUFFIXES = ("apikey", "accesskey", "secretkey", "privatekey", "signingkey", "token", "secret", "password",
                    "passwd", "signature", "credential", "credentials", "authorization")
# Config keys (manifest) whose string value is a secret in itself; ``api_key_env`` (the *name* of an
# environment variable) is not one, nor are ``token_ids`` or ``max_tokens``.
_SECRET_KEY = re.compile(
    r"(?:^|[_-])(?:api[_-]?key|token|access[_-]?token|secret|secret[_-]?key|private[_-]?key|password|passwd|"
    r"credentials?|authorization)$", re.IGNORECASE)

_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# ``scheme://userinfo@``: userinfo holds no "/", "?", "#", "@" or white space.
_USERINFO = re.compile(r"(?<=://)[^/?#@\s\"'<>]+@")
# A parameter after "?", "&", ";" (path parameters such as ;jsessionid=) or "#" (OAuth implicit-flow
# fragments): its name, then its value up to the next separator ("?" included: a raw "?" inside a value
# starts a new match, so ``?next=/login?token=abc`` still has its token masked).
_PARAM = re.compile(r"([?&;#])([^=&;#?\s\"'<>]+)=([^&;#?\s\"'<>]*)")


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a query/fragment parameter named ``name`` carries a credential (case-insensitive)."""
    flat = re.sub(r"[^a-z0-9]", "", name.lower())
    if flat in _SECRET_WORDS or flat.endswith(_SECRET_SUFFIXES):
        return True
    return any(w.lower() in _SECRET_WORDS for w in _WORD.findall(name))


def _mask_param(m: re.Match[str]) -> str:
    sep, name, value = m.group(1), m.group(2), m.group(3)
    if not value or value == MASK or not is_secret_name(name):
        return m.group(0)
    return f"{sep}{name}={MASK}"


def mask_text(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: userinfo (``user:pass@``) and secret-named
    query/fragment parameters (``token``, ``key``, ``api_key``, ``sig``, ``password``...) become ``***``.
    Also masks such parameters in a bare query string (``/path?token=abc``). Anything else is unchanged."""
    if "=" in text:
        text = _PARAM.sub(_mask_param, text)
    if "@" in text and "://" in text:
        text = _USERINFO.sub(MASK + "@", text)
    return text


def mask_url(url: str) -> str:
    """One URL with its credentials masked (see :func:`mask_text`); the fast path for per-step URLs."""
    if "@" not in url and "=" not in url:
        return url
    return mask_text(url)


def mask_optional(text: str | None) -> str | None:
    """:func:`mask_text` of a value that may be None."""
    return mask_text(text) if text else text


def redact_tree(value: Any) -> Any:
    """A copy of a JSON-like tree (dicts, lists, strings...) with every string passed through
    :func:`mask_text`, and the string values of secret-named keys (``api_key``, ``token``, ``password``,
    ``secret``...) replaced by ``***`` whole. For manifests and other configuration records."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and isinstance(v, str) and v and _SECRET_KEY.search(k):
                out[k] = MASK
            else:
                out[k] = redact_tree(v)
        return out
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return value
