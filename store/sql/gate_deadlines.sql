-- Gates with deadlines and reminders (store/gate_deadlines.py).

-- name: due_gates
-- Open gates whose deadline passed (an escalated one waits on, reported once).
SELECT id FROM gate
WHERE answered_at IS NULL AND deadline_at IS NOT NULL AND escalated_at IS NULL
  AND deadline_at <= %(now)s
ORDER BY deadline_at
LIMIT %(limit)s

-- name: lock_workflow_of_gate
SELECT w.id FROM workflow w
WHERE w.id = (SELECT g.workflow_id FROM gate g WHERE g.id = %(gate_id)s)
FOR UPDATE OF w

-- name: lock_due_gate
SELECT * FROM gate
WHERE id = %(gate_id)s AND answered_at IS NULL AND escalated_at IS NULL
  AND deadline_at <= %(now)s
FOR UPDATE

-- name: escalate_gate
UPDATE gate SET escalated_at = %(now)s WHERE id = %(gate_id)s

-- name: remind_gates
-- Each open gate past its next reminder age counts one more reminder (one per pass).
WITH due AS (
    SELECT id FROM gate
    WHERE answered_at IS NULL AND jsonb_array_length(reminders) > reminded
      AND opened_at + make_interval(secs => (reminders ->> reminded)::float8) <= %(now)s
    ORDER BY opened_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE gate g SET reminded = g.reminded + 1
FROM due WHERE g.id = due.id
RETURNING g.id, g.project_id, g.workflow_id, g.name, g.kind, g.opened_at, g.deadline_at,
          g.reminded, (g.reminders ->> (g.reminded - 1))::float8 AS age_s
