"""Bundled websites and tasks for offline rollouts.

``www/`` holds four small static websites (shop, wiki, travel, forum) whose state lives entirely
in the browser (URL query parameters and local storage), so many episodes can share one server.
``tasks.jsonl`` holds the bundled tasks that run against them, and :mod:`engine.sites.server`
serves the sites from a separate process (see :class:`engine.sites.server.SiteServer`).
"""
