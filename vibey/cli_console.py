"""``vibey console``: the web console (``vibey.console``), and ``vibey console hash`` for the
hashes its settings take. See docs/console.md."""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import sys
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from vibey.command_groups import help_of
from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from vibey.console.feed import EventSource
    from vibey.settings import ConsoleSettings, Settings

console_app = App(name="console", help=help_of("console"))

POOL_SIZE = 4
SHUTDOWN_SECONDS = 2  # open event streams are cut after this on Ctrl-C


@console_app.default
def serve(
    *,
    host: str | None = None,
    port: int | None = None,
    read_only: Annotated[bool, Parameter(name="--read-only", negative=())] = False,
) -> ExitCode:
    """Serve the web console until interrupted.

    It listens on [console] host and port (default 127.0.0.1:8377); a host beyond loopback
    needs allow_remote = true. Signing in takes the password of [console] password_hash (as
    username) or the token of token_hash; with neither the console is read-only.

    Pages update live: the domain events on the vibey.events exchange wake them (rabbitmq
    backend, [console] follow_events); PostgreSQL is polled every poll_seconds without them
    (postgres backend, broker away) and every safety_poll_seconds while they arrive.

    Parameters
    ----------
    host
        The address to listen on (VIBEY_CONSOLE_HOST).
    port
        The port to listen on (VIBEY_CONSOLE_PORT).
    read_only
        A shared screen: show everything, take no answer.
    """
    import uvicorn

    from store.pool import open_pool
    from vibey.client import Client
    from vibey.console.app import create_app
    from vibey.console.data import StoreData
    from vibey.settings import load_settings, replace
    from vibey.wiring import load_registry

    settings = load_settings()
    console = replace(
        settings.console,
        host=host if host is not None else settings.console.host,
        port=port if port is not None else settings.console.port,
        read_only=read_only or settings.console.read_only,
    )
    registry = load_registry(settings)
    pool = open_pool(
        settings.require_database_url(), min_size=1, max_size=POOL_SIZE, name="vibey-console"
    )
    try:
        with Client(settings, registry=registry, pool=pool, name="vibey-console") as client:
            app = create_app(
                settings=console,
                data=StoreData(settings=settings, client=client, pool=pool),
                events=event_source(settings),
            )
            listening = listen(console.host, console.port)
            server = uvicorn.Server(
                uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_SECONDS)
            )
            shown = f"[{console.host}]" if ":" in console.host else console.host
            print(
                f"vibey console: http://{shown}:{console.port}/ ({app_mode(console)})", flush=True
            )
            server.run(sockets=[listening])
    finally:
        pool.close()
    return ExitCode.OK


def event_source(settings: Settings) -> EventSource | None:
    """The domain events that wake the pages: a transient queue on the events exchange, when
    the workers publish there (the rabbitmq backend, an AMQP URL) and [console] follow_events
    holds; else None (the poll alone)."""
    from actors.event_watch import EventWatch
    from workflows.events import exchange_for

    url = settings.bus.amqp_url
    if not settings.console.follow_events or settings.queue.backend == "postgres" or not url:
        return None
    return EventWatch(
        url=url,
        exchange=exchange_for(settings.bus.prefix),
        name="vibey-console-events",
    )


def listen(host: str, port: int) -> socket.socket:
    """The console's listening socket, bound before its address is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise CommandError(
            f"the console cannot listen on {host}:{port} ({why}): stop what holds it, "
            "or pick another port with --port (VIBEY_CONSOLE_PORT)",
            ExitCode.UNAVAILABLE,
        ) from exc


def app_mode(console: ConsoleSettings) -> str:
    """What the start line says about writing and signing in."""
    from vibey.console.auth import Access

    access = Access(console)
    if access.mode != "read-write":
        return access.mode
    who = f"sign in as {console.username}" if console.password_hash else "sign in with the token"
    return f"read-write, {who}"


@console_app.command(name="hash")
def hash_(*, token: Annotated[bool, Parameter(name="--token", negative=())] = False) -> ExitCode:
    """Print a secret's scrypt hash, for [console] password_hash or token_hash.

    The password is read from standard input (or asked twice on a terminal). With --token a
    new random token is made: its line and its hash's are printed.

    Parameters
    ----------
    token
        Make a random token rather than read a password.
    """
    from vibey.console.auth import hash_secret

    if token:
        made = secrets.token_urlsafe(24)
        print(f"token:      {made}")
        print(f"token_hash: {hash_secret(made)}")
        return ExitCode.OK
    if sys.stdin.isatty():
        secret = getpass.getpass("password: ")
        if getpass.getpass("again: ") != secret:
            raise CommandError("the two passwords differ; nothing printed", ExitCode.USAGE)
    else:
        secret = sys.stdin.readline().rstrip("\n")
    if not secret:
        raise CommandError("an empty password cannot sign anyone in", ExitCode.USAGE)
    print(hash_secret(secret))
    return ExitCode.OK
