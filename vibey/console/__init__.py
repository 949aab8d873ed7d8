"""The web console (`vibey console`): an ASGI app on Starlette, served by uvicorn.

* :mod:`vibey.console.app`: the routes, pages and the event stream;
* :mod:`vibey.console.auth`: hashed secrets, sign-in, CSRF, read-only;
* :mod:`vibey.console.data`: the seam to the store (reads, and the answer), and its values;
* :mod:`vibey.console.feed`: the change marker, polled once a process and fanned out;
* :mod:`vibey.console.diagram`: the SVG phase diagram (pure).

The in-memory data the unit tests use is ``tests/console_fake.py``.
"""
