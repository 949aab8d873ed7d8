-- Workflows: instance rows, their history, their gates. See store/workflows.py.

-- name: live_for_project
SELECT * FROM workflow
WHERE project_id = %(project_id)s AND status IN ('running', 'blocked')

-- name: insert_workflow
-- A concurrent start of the same project loses on the partial unique index and inserts
-- nothing; the caller then reads the winner.
INSERT INTO workflow (id, project_id, definition, version, phase, cycle, input, state)
VALUES (
    %(id)s, %(project_id)s, %(definition)s, %(version)s, %(phase)s, %(cycle)s, %(input)s,
    %(state)s
)
ON CONFLICT (project_id) WHERE status IN ('running', 'blocked') DO NOTHING
RETURNING *

-- name: insert_new_workflow
-- A start in one round trip: sent with everything its first event writes and the COMMIT,
-- read after them. A live workflow of the project fails it on the partial unique index
-- (and with it the transaction); the caller then reads that one (lives_for_projects).
INSERT INTO workflow (id, project_id, definition, version, phase, cycle, input, state)
VALUES (
    %(id)s, %(project_id)s, %(definition)s, %(version)s, %(phase)s, %(cycle)s, %(input)s,
    %(state)s
)
RETURNING *

-- name: lives_for_projects
SELECT * FROM workflow
WHERE project_id = ANY(%(projects)s) AND status IN ('running', 'blocked')

-- name: lock_workflow
SELECT * FROM workflow WHERE id = %(id)s FOR UPDATE

-- name: lock_workflow_of_job
-- A short step's unit of work locks its workflow before it claims the job (the lock order).
SELECT w.* FROM workflow w
WHERE w.id = (SELECT j.workflow_id FROM job j WHERE j.id = %(job_id)s)
FOR UPDATE OF w

-- name: lock_workflow_of_gate
-- A gate answer locks the gate's workflow (a workflow gate's: it has a name; and a parked
-- job's budget_exhausted gate, whose 'stop' cancels the workflow) before the gate.
SELECT w.* FROM workflow w
WHERE w.id = (SELECT g.workflow_id FROM gate g WHERE g.id = %(gate_id)s
              AND (g.name IS NOT NULL OR g.kind = 'budget_exhausted'))
FOR UPDATE OF w

-- name: get_workflow
SELECT * FROM workflow WHERE id = %(id)s

-- name: latest_for_project
SELECT * FROM workflow WHERE project_id = %(project_id)s
ORDER BY (status IN ('running', 'blocked')) DESC, created_at DESC, id
LIMIT 1

-- name: list_workflows
SELECT * FROM workflow
WHERE (%(status)s::workflow_status IS NULL OR status = %(status)s::workflow_status)
  AND (%(project_id)s::text IS NULL OR project_id = %(project_id)s)
ORDER BY updated_at DESC, id
LIMIT %(limit)s

-- name: save_workflow
-- The workflow's new header and state, in one statement with what its change writes beside
-- them: the decided event's history row (when %(seq)s is not null), its domain events
-- (events.sql's insert_events, in draft order; NULL: none) and, when the workflow
-- finished (%(closing)s not null), close_open_gates. A step's settle is this one statement.
WITH history AS (
    INSERT INTO workflow_history (workflow_id, seq, event, commands, recorded_at)
    SELECT %(id)s, %(seq)s::integer, %(event)s::jsonb, %(commands)s::jsonb, %(at)s::timestamptz
    WHERE %(seq)s::integer IS NOT NULL
),
events AS (
    INSERT INTO domain_event (
        event_id, event_type, tenant_id, project_id, correlation_id, causation_id, payload
    )
    SELECT (e.doc ->> 'event_id')::uuid, e.doc ->> 'event_type',
           COALESCE((SELECT tenant_id FROM project_tenant WHERE project_id = %(project_id)s),
                    'default'),
           %(project_id)s, %(correlation_id)s, %(causation_id)s, e.doc -> 'payload'
    FROM jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e (doc, n)
    ORDER BY e.n
),
closed AS (
    UPDATE gate
    SET answer = %(closing)s, answered_by = 'vibey', answered_at = now(),
        answer_source = 'closed'
    WHERE %(closing)s::text IS NOT NULL AND workflow_id = %(id)s AND answered_at IS NULL
)
UPDATE workflow
SET phase = %(phase)s, cycle = %(cycle)s, status = %(status)s::workflow_status,
    completion_mode = %(completion_mode)s, reason = %(reason)s, state = %(state)s,
    last_seq = %(last_seq)s, applied_seq = %(applied_seq)s, updated_at = now(),
    finished_at = CASE WHEN %(status)s IN ('completed', 'failed', 'cancelled')
                       THEN coalesce(finished_at, now()) END
WHERE id = %(id)s
RETURNING updated_at, finished_at

-- name: decide_history
UPDATE workflow_history SET commands = %(commands)s
WHERE workflow_id = %(workflow_id)s AND seq = %(seq)s AND commands IS NULL

-- name: history
SELECT seq, event, commands, recorded_at FROM workflow_history_all
WHERE workflow_id = %(workflow_id)s AND seq > %(after)s
ORDER BY seq

-- name: step_ids
SELECT step, id FROM job WHERE workflow_id = %(workflow_id)s AND step = ANY(%(steps)s)

-- name: open_workflow_gate
INSERT INTO gate (
    id, project_id, workflow_id, name, kind, prompt, answers, schema, context, evidence,
    deadline_at, on_deadline, default_answer, reminders
)
VALUES (
    %(id)s, %(project_id)s, %(workflow_id)s, %(name)s, %(kind)s, %(prompt)s, %(answers)s,
    %(schema)s, %(context)s, %(evidence)s, %(deadline_at)s, %(on_deadline)s,
    %(default_answer)s, %(reminders)s
)
ON CONFLICT (workflow_id, name) WHERE name IS NOT NULL DO NOTHING

-- name: gate_by_name
SELECT id FROM gate WHERE workflow_id = %(workflow_id)s AND name = %(name)s

-- name: answer_workflow_gate
UPDATE gate
SET answer = %(answer)s, answered_by = %(answered_by)s, answered_at = now(),
    answer_source = %(source)s
WHERE id = %(gate_id)s AND answered_at IS NULL
RETURNING *

-- name: close_open_gates
-- A finished workflow's questions are moot: each open gate is closed with a note.
UPDATE gate
SET answer = %(answer)s, answered_by = %(answered_by)s, answered_at = now(),
    answer_source = 'closed'
WHERE workflow_id = %(workflow_id)s AND answered_at IS NULL

-- name: cancel_steps
-- A cancelled or failed workflow's unfinished steps stop: a running one loses its lease (its
-- settle will find the fence gone), pointers in flight find a cancelled row and are dropped.
UPDATE job
SET state = 'cancelled', updated_at = now(), settled_at = now(),
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    last_error = %(why)s
WHERE workflow_id = %(workflow_id)s
  AND state IN ('ready', 'leased', 'awaiting_human', 'awaiting_capacity')

-- name: workflow_steps
SELECT id, step, kind, subject, cycle, state::text AS state, attempts, max_attempts,
    last_error, created_at, settled_at, payload->>'subject' AS item
FROM job WHERE workflow_id = %(workflow_id)s
ORDER BY created_at, id

-- name: open_gates_inbox
SELECT g.*, now() AS now FROM gate g
WHERE g.answered_at IS NULL AND (%(project_id)s::text IS NULL OR g.project_id = %(project_id)s)
ORDER BY g.opened_at, g.id

-- name: cancel_dependents
-- A step that failed for good never releases the steps waiting on it; they are cancelled
-- (transitively) so nothing waits forever. The workflow decides what runs instead.
WITH RECURSIVE doomed (id) AS (
    SELECT d.job_id FROM job_dependency d WHERE d.depends_on = %(job_id)s
    UNION
    SELECT d.job_id FROM job_dependency d JOIN doomed ON d.depends_on = doomed.id
)
UPDATE job
SET state = 'cancelled', updated_at = now(), settled_at = now(), last_error = %(why)s
WHERE id IN (SELECT id FROM doomed) AND state = 'ready'

-- name: finding_events
-- The project's findings raised and resolved, in ledger order (what is still open).
SELECT kind, payload FROM ledger_event
WHERE project_id = %(project_id)s AND kind IN ('FindingRaised', 'FindingResolved')
ORDER BY seq
