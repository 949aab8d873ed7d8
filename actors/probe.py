"""Does RabbitMQ answer, and what does it honour? One short connection, for ``vibey doctor``.

:func:`probe` opens one pika connection (one attempt, bounded by ``timeout``), reads the
capabilities the broker announces (:func:`actors.capabilities.detect`) and closes it. It never
raises for a broker that is down, refuses the login or the vhost: it returns why, in one line
that holds no password. pika's own connect errors are logged by pika (at ERROR): quieten the
``pika`` logger where that is noise.
"""

from __future__ import annotations

import contextlib

from actors import amqp
from actors.amqp import parameters
from actors.capabilities import BrokerCapabilities, detect

DEFAULT_TIMEOUT_SECONDS = 5.0


def probe(
    url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> tuple[BrokerCapabilities | None, str | None]:
    """``(capabilities, None)`` when the broker at ``url`` answered, else ``(None, why not)``."""
    try:
        params = parameters(url, timeout=timeout)  # several: tried in order
    except Exception as exc:  # noqa: BLE001 - pika raises anything for a URL it cannot read
        return None, f"the AMQP URL cannot be read ({type(exc).__name__})"
    try:
        connection = amqp.BlockingConnection(params)
    except amqp.ProbableAuthenticationError:
        return None, "refused the login: check the user and password"
    except amqp.ProbableAccessDeniedError as exc:
        return None, f"refused the vhost ({_cause(exc)}): check the vhost and its permissions"
    except amqp.IncompatibleProtocolError as exc:
        return None, f"did not speak AMQP 0-9-1 ({_cause(exc)}): is that RabbitMQ's AMQP port?"
    except (amqp.AMQPError, OSError) as exc:
        return None, f"did not answer ({_cause(exc)})"
    try:
        return detect(connection), None
    finally:
        # The broker may have closed it first: the answer is still the one it gave.
        with contextlib.suppress(amqp.AMQPError):
            connection.close()


def _cause(exc: BaseException) -> str:
    """The innermost reason pika reports: it nests the socket error in ``args`` or in the
    connector error's ``exception``, or gives it as text."""
    inner: object = exc
    while True:
        nested = getattr(inner, "exception", None)
        args = getattr(inner, "args", ())
        if isinstance(nested, BaseException):
            inner = nested
        elif args and isinstance(args[0], BaseException | str) and args[0] is not inner:
            inner = args[0]
            if isinstance(inner, str):
                return inner
        else:
            break
    text = str(inner).strip()
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__
