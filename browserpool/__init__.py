"""Browser worker processes (Playwright + Chromium) behind ZeroMQ, and the engine-side pool."""
