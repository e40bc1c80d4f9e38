"""The environment a browser worker (and so its Playwright driver and Chromium) is started with: the
engine's own, minus the secrets it holds.

The engine process holds API keys (the policy's, the judge's, a hub token); a page that gets code
execution in a renderer, or a bug that logs the environment, must find none of them. Variables are
dropped by name (anything that looks like a key, token, secret, password or cloud credential) and by
value (a URL with a password in it, e.g. a proxy or database URL); everything else (PATH, HOME, LANG,
DISPLAY, XDG_*, PYTHON*, LD_LIBRARY_PATH, proxies without credentials, ...) is kept, so the worker runs
as the engine does.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping

# Name patterns (matched on the upper-cased name) of variables that hold credentials.
SECRET_NAME_PATTERNS: tuple[str, ...] = (
    "*API_KEY*", "*APIKEY*", "*_KEY", "*_KEYS", "*ACCESS_KEY*", "*PRIVATE_KEY*",
    "*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*_PASS", "*PASSPHRASE*", "*CREDENTIAL*",
    "*_AUTH", "*AUTH_TOKEN*", "*_DSN", "*SESSION_KEY*", "*COOKIE*",
    "AWS_*", "AZURE_*", "GOOGLE_APPLICATION_CREDENTIALS", "GCLOUD_*", "CLOUDSDK_*",
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_*", "OPENAI_*", "ANTHROPIC_*",
    "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "KUBECONFIG", "NETRC", "PGPASS*",
)
# Never dropped, whatever the patterns say: what a worker needs to run like its engine.
KEEP_NAMES: frozenset[str] = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "DISPLAY",
    "WAYLAND_DISPLAY", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME",
})
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@")


def is_secret(name: str, value: str) -> bool:
    """Whether an environment variable looks like it holds a credential."""
    if name in KEEP_NAMES:
        return False
    upper = name.upper()
    if any(fnmatch.fnmatchcase(upper, p) for p in SECRET_NAME_PATTERNS):
        return True
    return _URL_WITH_PASSWORD.search(value) is not None


def worker_env(base: Mapping[str, str] | None = None, drop: Iterable[str] = ()) -> dict[str, str]:
    """``base`` (default: this process's environment) without its secrets and without the names in ``drop``
    (e.g. a custom ``--api-key-env`` variable)."""
    env = os.environ if base is None else base
    extra = set(drop)
    return {k: v for k, v in env.items() if k not in extra and not is_secret(k, v)}
