"""The web console's ASGI app (Starlette): server-rendered pages, live by server-sent events.

Pages: ``/`` the projects' workflows on their phase diagrams; ``/workflows/<id>`` one
workflow's diagram, open gates, steps and attempts, history and ledger (with its verify
status); ``/gates`` the inbox with the answer forms; ``/health`` engine health, circuits and
queue stats. ``/events`` streams ``change`` events, fed by the domain events with a poll of
PostgreSQL as the fallback (:mod:`vibey.console.feed`); each one's data is JSON, ``{"marker",
"event_type", "workflow_id"}`` (the last two null when the poll saw the change). The page's
script then fetches the page again and swaps its live regions (a region holding the focused
field keeps it, unless what it shows changed). ``/healthz`` answers ``ok`` to anyone (its
``X-Vibey-Feed`` header says ``events`` or ``poll``).

Writes: only ``POST /gates/<id>/answer`` (and signing in and out). Every form carries the
session's CSRF token; see :mod:`vibey.console.auth` for who may read and write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import (
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from vibey.console import diagram
from vibey.console.auth import CSRF_FIELD, Access, csrf_ok, csrf_token
from vibey.console.data import ConsoleData, age, clock
from vibey.console.feed import Change, ChangeFeed, EventSource
from vibey.settings import ConsoleSettings

HERE = Path(__file__).parent
SESSION_COOKIE = "vibey_console"
SESSION_SECONDS = 12 * 3600
FAILED_SIGN_IN_S = 0.5  # a failed sign-in waits this long: guessing is slow
Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(
    *,
    settings: ConsoleSettings,
    data: ConsoleData,
    secret_key: str | None = None,
    events: EventSource | None = None,
) -> Starlette:
    """The console for ``settings`` on ``data``. ``secret_key`` signs the session cookie (a
    fresh random one by default: signing in again after a restart). ``events``: the domain
    events that wake the pages (None: the poll alone, every ``poll_seconds``)."""
    access = Access(settings)
    feed = ChangeFeed(
        data.last_change,
        interval=settings.poll_seconds,
        safety_interval=settings.safety_poll_seconds,
    )
    templates = _templates(access)
    pages = _Pages(access=access, data=data, feed=feed, templates=templates)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(feed.run())
        if events is not None:
            feed.listen(events)
        try:
            yield
        finally:
            if events is not None:
                await run_in_threadpool(events.stop)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    routes = [
        Route("/", pages.workflows),
        Route("/workflows/{workflow_id:uuid}", pages.workflow),
        Route("/gates", pages.gates),
        Route("/gates/{gate_id:uuid}/answer", pages.answer, methods=["POST"]),
        Route("/health", pages.health),
        Route("/login", pages.login, methods=["GET", "POST"]),
        Route("/logout", pages.logout, methods=["POST"]),
        Route("/events", pages.events),
        Route("/healthz", pages.healthz),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(
            SessionMiddleware,
            secret_key=secret_key or secrets.token_urlsafe(32),
            session_cookie=SESSION_COOKIE,
            max_age=SESSION_SECONDS,
            same_site="strict",
        )
    ]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


def _templates(access: Access) -> Jinja2Templates:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(), cache_size=50
    )
    env.filters["age"] = age
    env.filters["clock"] = clock
    env.filters["kind"] = lambda kind: getattr(kind, "value", None) or getattr(kind, "name", kind)
    env.globals["diagram"] = lambda path, compact=False: Markup(
        diagram.render(path, compact=compact)
    )
    env.globals["mode"] = access.mode
    return Jinja2Templates(env=env)


class _Pages:
    def __init__(
        self, *, access: Access, data: ConsoleData, feed: ChangeFeed, templates: Jinja2Templates
    ) -> None:
        self.access = access
        self.data = data
        self.feed = feed
        self.templates = templates

    # -- who ---------------------------------------------------------------------------------

    def user(self, request: Request) -> str | None:
        user = request.session.get("user")
        if isinstance(user, str):
            return user
        return self.access.bearer(request.headers.get("authorization"))

    def _render(
        self,
        request: Request,
        name: str,
        status: int = 200,
        *,
        marker: str | None = None,
        **context: Any,
    ) -> Response:
        """``marker``: the feed's before the page's data was read (a change during the read
        then reaches the page as the next event); the current one for a page without data."""
        user = self.user(request)
        context |= {
            "user": user,
            "can_write": self.access.can_write(user),
            "signs_in": self.access.settings.signs_in,
            "csrf": csrf_token(request.session),
            "csrf_field": CSRF_FIELD,
            "marker": (marker if marker is not None else self.feed.marker) or "",
            "flash": request.session.pop("flash", None),
        }
        return self.templates.TemplateResponse(request, name, context, status_code=status)

    def _refused(self, request: Request) -> Response | None:
        """The response to a reader who may not read, else None."""
        if self.access.can_read(self.user(request)):
            return None
        if request.headers.get("accept", "").startswith("text/event-stream"):
            return PlainTextResponse("sign in first", status_code=401)
        return RedirectResponse(f"/login?next={request.url.path}", status_code=303)

    # -- pages -------------------------------------------------------------------------------

    async def workflows(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        marker = self.feed.marker or ""  # before the read: see _render
        rows = await run_in_threadpool(self.data.workflows)
        return self._render(
            request, "workflows.html", marker=marker, workflows=rows, page="workflows"
        )

    async def workflow(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        wanted: UUID = request.path_params["workflow_id"]
        marker = self.feed.marker or ""  # before the read: see _render
        detail = await run_in_threadpool(self.data.workflow, wanted)
        if detail is None:
            return self._render(request, "missing.html", 404, what=f"workflow {wanted}")
        return self._render(
            request, "workflow.html", marker=marker, detail=detail, page="workflows"
        )

    async def gates(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        marker = self.feed.marker or ""  # before the read: see _render
        gates = await run_in_threadpool(self.data.gates)
        return self._render(request, "gates.html", marker=marker, gates=gates, page="gates")

    async def health(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        marker = self.feed.marker or ""  # before the read: see _render
        health = await run_in_threadpool(self.data.health)
        return self._render(request, "health.html", marker=marker, health=health, page="health")

    # -- writes ------------------------------------------------------------------------------

    async def answer(self, request: Request) -> Response:
        form = await request.form()
        user = self.user(request)
        bearer = request.session.get("user") is None and user is not None
        if not bearer and not csrf_ok(request.session, form.get(CSRF_FIELD)):
            return PlainTextResponse("the form's CSRF token is missing or stale", 403)
        if not self.access.can_write(user):
            return PlainTextResponse(f"this console does not take answers: {self._why(user)}", 403)
        assert user is not None  # can_write holds only for a signed-in person
        gate_id: UUID = request.path_params["gate_id"]
        value = str(form.get("answer", "")).strip()
        done = await run_in_threadpool(self.data.answer, gate_id, value, by=f"{user}@console")
        if done.problem is None:
            request.session["flash"] = ["ok", f"answered gate {gate_id} with {value!r}"]
        else:
            request.session["flash"] = ["error", done.problem]
        self.feed.polled(await run_in_threadpool(self.data.last_change))  # this page, at once
        return RedirectResponse(_local(str(form.get("next", "/gates"))), status_code=303)

    def _why(self, user: str | None) -> str:
        if user is None:
            return "sign in first"
        return self.access.mode

    async def login(self, request: Request) -> Response:
        nxt = _local(request.query_params.get("next", "/"))
        if request.method == "GET":
            return self._render(request, "login.html", next=nxt, problem=None, page="login")
        form = await request.form()
        if not csrf_ok(request.session, form.get(CSRF_FIELD)):
            return PlainTextResponse("the form's CSRF token is missing or stale", 403)
        username, secret = str(form.get("username", "")), str(form.get("password", ""))
        user = await run_in_threadpool(self.access.sign_in, username, secret)
        if user is None:
            await asyncio.sleep(FAILED_SIGN_IN_S)
            problem = "wrong username or password (or token)"
            return self._render(request, "login.html", 401, next=nxt, problem=problem, page="login")
        request.session.clear()  # a new session: a new CSRF token
        request.session["user"] = user
        return RedirectResponse(_local(str(form.get("next", nxt))), status_code=303)

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if not csrf_ok(request.session, form.get(CSRF_FIELD)):
            return PlainTextResponse("the form's CSRF token is missing or stale", 403)
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    # -- live --------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        """``ok``, to anyone, with the serving process's pid (`just up` checks it is its own)
        and what feeds the pages: ``X-Vibey-Feed: events`` while the domain events arrive,
        ``poll`` otherwise."""
        feed = "events" if self.feed.live else "poll"
        return PlainTextResponse(
            "ok", headers={"X-Vibey-Pid": str(os.getpid()), "X-Vibey-Feed": feed}
        )

    async def events(self, request: Request) -> Response:
        if self._refused(request) is not None:
            return PlainTextResponse("sign in first", status_code=401)
        seen = request.query_params.get("seen") or None

        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            async for change in self.feed.changes(seen):
                if await request.is_disconnected():
                    return
                yield ": keepalive\n\n" if change is None else _sse_change(change)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


def _sse_change(change: Change) -> str:
    data = {
        "marker": change.marker,
        "event_type": change.event_type,
        "workflow_id": change.workflow_id,
    }
    return f"event: change\ndata: {json.dumps(data)}\n\n"


def _local(target: str) -> str:
    """``target`` when it is a path on this console, else ``/`` (no open redirect)."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"
