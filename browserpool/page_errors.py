"""The errors of an episode's tab: what the worker answers a request with when an operation cannot be carried out
(refused), when the page stops answering (hung), and when the tab closed under it."""

from __future__ import annotations


class ActionRefused(Exception):
    """The action cannot be carried out (bad URL scheme, unknown key, missing target)."""


class TabClosed(Exception):
    """The episode's tab closed under an operation (its page called ``window.close()``)."""


class PageHung(Exception):
    """The page stopped answering (e.g. JavaScript in an endless loop)."""
