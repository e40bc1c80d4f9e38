"""An HTTP browser server that speaks the Omniboxes API (WebGym's and AsyncWebRL's browser server), as a client
of the engine core: ``webgym-engine serve``. A lease is a browser context of the core's pool; a command is one of
the pool's browser operations; a screenshot is a frame from the workers' shared memory. See docs/server.md."""
