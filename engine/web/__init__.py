"""The web as the engine meets it: domains and the episode queue, the blocklist, credentials in URLs, bounds on
page text, telling local programs from pages."""
