"""The errors of an episode's tab: what the worker answers a request with when an operation cannot be carried out
(refused), when the page stops answering (hung), when the tab closed under it, when its renderer died, and when
Chromium would not capture its screenshot."""

from __future__ import annotations


class ActionRefused(Exception):
    """The action cannot be carried out (bad URL scheme, unknown key, missing target)."""


class TabClosed(Exception):
    """The episode's tab closed under an operation (its page called ``window.close()``)."""


class PageHung(Exception):
    """The page stopped answering (e.g. JavaScript in an endless loop)."""


class PageCrashed(Exception):
    """The tab's renderer died (the worker's memory watch ended it, or it crashed): no operation can run on it."""


class CaptureFailed(Exception):
    """Chromium refused the viewport's capture on every try within the screenshot's deadline."""
