"""Capacity signals in a CLI's words: the known strings, and reset times however written.

Classification reads structured output first (each adapter), then these strings, then exit
codes. A limit with a reset time is :class:`WindowExhausted`; a limit whose reset the CLI does
not say gets ``now + UNKNOWN_RESET`` (the circuit's probe may close it earlier); spent credits,
billing or quota with no reset is :class:`CreditsExhausted` (never a deadline); a failed login
is :class:`AuthenticationFailed`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from workflows.capacity import AuthenticationFailed, CreditsExhausted, Exhausted, WindowExhausted

UNKNOWN_RESET = timedelta(minutes=15)
CREDITS = re.compile(
    r"credit balance is too low|insufficient_quota|billing|quota exceeded|out of credits|"
    r"exceeded your current quota|payment required",
    re.IGNORECASE,
)
AUTH = re.compile(
    r"authentication_failed|authenticationerror|invalid api key|invalid x-api-key|"
    r"unauthorized|not logged in|please log ?in|\b401\b",
    re.IGNORECASE,
)
WINDOW = re.compile(
    r"usage limit|rate.?limit|session limit|too many requests|resource_exhausted|\b429\b",
    re.IGNORECASE,
)
_EPOCH = re.compile(r"\|(\d{10})\b")  # "Claude AI usage limit reached|1767225600"
_RETRY = re.compile(r"(?:retry(?:Delay)?|try again in|resets? in)\D{0,12}(\d+(?:\.\d+)?)\s*s", re.I)
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")


def now() -> datetime:
    return datetime.now(UTC)


def reset_time(value: Any, at: datetime | None = None) -> datetime | None:
    """A reset time from an epoch (seconds or milliseconds), an ISO timestamp, or text that
    holds one ("…|1767225600", "try again in 30s", "retryDelay: 42s", an ISO time)."""
    at = at or now()
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 10**11 else value
        return datetime.fromtimestamp(seconds, UTC)
    if not isinstance(value, str):
        return None
    if value.strip().isdigit():
        return reset_time(int(value.strip()), at)
    epoch = _EPOCH.search(value)
    if epoch:
        return datetime.fromtimestamp(int(epoch.group(1)), UTC)
    retry = _RETRY.search(value)
    if retry:
        return at + timedelta(seconds=float(retry.group(1)))
    iso = _ISO.search(value)
    return _iso(iso.group(0)) if iso else None


_CLOCK = re.compile(
    r"try again at (?:(?P<month>[A-Za-z]{3}) (?P<day>\d{1,2})(?:st|nd|rd|th)?,? (?P<year>\d{4}),? "
    r"(?:at )?)?(?P<hour>\d{1,2}):(?P<minute>\d{2}) ?(?P<half>[AaPp]\.?[Mm]\.?)",
    re.IGNORECASE,
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
CLOCK_GRACE = timedelta(minutes=1)  # a clock time is printed to the minute, seconds dropped


def clock_reset(
    text: str, at: datetime | None = None, zone: tzinfo | None = None
) -> datetime | None:
    """The reset a CLI prints as a local clock time, in UTC: "try again at 8:15 AM." (the next
    occurrence of that time of day in ``zone``; one up to :data:`CLOCK_GRACE` past is today's)
    or "try again at Dec 4th, 2026 8:15 AM." (that day). ``zone``: the zone the CLI printed
    in; ``None`` is this process's local zone (the system's, or ``TZ``). ``None`` when
    ``text`` holds no such time."""
    match = _CLOCK.search(text)
    if match is None:
        return None
    hour, minute = int(match["hour"]), int(match["minute"])
    if not (1 <= hour <= 12 and minute < 60):
        return None
    hour = hour % 12 + (12 if match["half"][0] in "Pp" else 0)
    at = at or now()
    if match["month"]:
        month = match["month"].lower()
        if month not in _MONTHS:
            return None
        try:
            day = datetime(int(match["year"]), _MONTHS.index(month) + 1, int(match["day"]))
        except ValueError:
            return None
        return _local(day.replace(hour=hour, minute=minute), zone)
    today = at.astimezone(zone) if zone is not None else at.astimezone()
    naive = today.replace(tzinfo=None, hour=hour, minute=minute, second=0, microsecond=0)
    candidate = _local(naive, zone)
    if candidate < at - CLOCK_GRACE:
        candidate = _local(naive + timedelta(days=1), zone)
    return candidate


def _local(naive: datetime, zone: tzinfo | None) -> datetime:
    """A wall-clock time in ``zone`` (None: the local zone), as UTC."""
    local = naive.replace(tzinfo=zone) if zone is not None else naive.astimezone()
    return local.astimezone(UTC)


def _iso(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def window(detail: str, resets_at: datetime | None) -> WindowExhausted:
    return WindowExhausted(resets_at=resets_at or now() + UNKNOWN_RESET, detail=detail[:300])


def from_text(text: str) -> Exhausted | None:
    """The capacity state that ``text`` (an error message, stderr) names, if any: credits
    first (a quota message may also say 429), then a failed login, then a window."""
    if CREDITS.search(text):
        return CreditsExhausted(detail=_line(text, CREDITS))
    if AUTH.search(text):
        return AuthenticationFailed(detail=_line(text, AUTH))
    if WINDOW.search(text):
        return window(_line(text, WINDOW), reset_time(text))
    return None


def _line(text: str, pattern: re.Pattern[str]) -> str:
    match = pattern.search(text)
    assert match is not None
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start : end if end >= 0 else len(text)].strip()[:300]
