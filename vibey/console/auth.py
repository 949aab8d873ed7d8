"""Who may use the console, and CSRF.

Secrets are kept as scrypt hashes (``scrypt$N$r$p$salt$digest``, base64 without padding), made
by :func:`hash_secret` (`vibey console hash`) and checked by :func:`verify_secret` in constant
time. A person signs in with the username and password (or the token) in a form; the session
cookie (signed, ``SameSite=Strict``, HTTP-only) then carries who they are and a CSRF token. A
script may send ``Authorization: Bearer <token>`` instead.

Rules (:class:`Access`): with no hash configured the console is read-only and anonymous;
otherwise reads need a sign-in unless ``anonymous_read``, and a write needs a signed-in person,
a console that is not ``read_only``, and (for a form) the session's CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from vibey.settings import ConsoleSettings

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SALT_BYTES, DIGEST_BYTES = 16, 32
CSRF_FIELD = "csrf"
TOKEN_USER = "token"  # who a token signs in as


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_secret(secret: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """``secret``'s scrypt hash with a fresh salt, as the settings take it."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(secret, salt, n, r, p)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, encoded: str) -> bool:
    """Whether ``secret`` hashes to ``encoded``; False for a malformed hash."""
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = _unb64(digest)
        actual = _scrypt(secret, _unb64(salt), int(n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024, dklen=DIGEST_BYTES
    )


def csrf_token(session: MutableMapping[str, Any]) -> str:
    """The session's CSRF token, made on first use."""
    token = session.get(CSRF_FIELD)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session[CSRF_FIELD] = token
    return token


def csrf_ok(session: Mapping[str, Any], submitted: object) -> bool:
    expected = session.get(CSRF_FIELD)
    return (
        isinstance(expected, str)
        and isinstance(submitted, str)
        and hmac.compare_digest(expected.encode(), submitted.encode())
    )


@dataclass(frozen=True, slots=True)
class Access:
    """The console's access rules for its settings."""

    settings: ConsoleSettings

    def sign_in(self, username: str, secret: str) -> str | None:
        """Who ``username``/``secret`` signs in as (a token needs no username), else None."""
        s = self.settings
        if (
            s.password_hash is not None
            and hmac.compare_digest(username.encode(), s.username.encode())
            and verify_secret(secret, s.password_hash)
        ):
            return s.username
        if s.token_hash is not None and username in ("", TOKEN_USER):
            return TOKEN_USER if verify_secret(secret, s.token_hash) else None
        return None

    def bearer(self, header: str | None) -> str | None:
        """Who an ``Authorization: Bearer <token>`` header is, else None."""
        if header is None or self.settings.token_hash is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        return TOKEN_USER if verify_secret(token.strip(), self.settings.token_hash) else None

    def can_read(self, user: str | None) -> bool:
        s = self.settings
        return user is not None or s.anonymous_read or not s.signs_in

    def can_write(self, user: str | None) -> bool:
        return user is not None and self.settings.signs_in and not self.settings.read_only

    @property
    def mode(self) -> str:
        """What the pages say about writing: read-write, or why they are read-only."""
        if self.settings.read_only:
            return "read-only (read_only = true)"
        if not self.settings.signs_in:
            return "read-only (no password_hash or token_hash under [console])"
        return "read-write"
