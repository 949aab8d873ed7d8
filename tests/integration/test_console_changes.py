"""The console's change marker (store.changes) on a real PostgreSQL: it stays put while
nothing changes and moves when a gate opens or is answered or a workflow is updated. It is a
function of what the console shows, so a page that saw one value shows what that value
means."""

from __future__ import annotations

import psycopg
from psycopg_pool import ConnectionPool

from store.changes import last_change


def test_the_marker_moves_with_what_the_console_shows(pool: ConnectionPool, pg_url: str) -> None:
    first = last_change(pool)
    assert last_change(pool) == first  # nothing changed
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO gate (id, project_id, kind, prompt) "
            "VALUES ('00000000-0000-0000-0000-000000000001', 'p', 'approval', 'ok?')"
        )
        opened = last_change(pool)
        assert opened != first
        conn.execute(
            "UPDATE gate SET answer = 'yes', answered_by = 'me', answered_at = now() "
            "WHERE id = '00000000-0000-0000-0000-000000000001'"
        )
        answered = last_change(pool)
        assert answered != opened  # (as before it opened: the open gates are the same again)
        conn.execute(
            "INSERT INTO workflow (id, project_id, definition, version, phase, state) "
            "VALUES (gen_random_uuid(), 'p', 'tiny', 1, 'design', '{}'::jsonb)"
        )
        started = last_change(pool)
        assert started != answered
        conn.execute("UPDATE workflow SET phase = 'build', updated_at = now() + interval '1s'")
        assert last_change(pool) != started
