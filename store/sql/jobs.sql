-- The job queue's SQL (PostgreSQL backend). Every settling write is fenced on the lease:
--   state = 'leased' AND lease_owner = %(owner)s AND lease_token = %(token)s
--   AND lease_expires_at > now()
-- so a holder whose lease expired or was taken over changes nothing (zero rows), and all
-- lease arithmetic uses the database clock.

-- name: insert_job
-- One round trip in the common cases: a new row, or a duplicate already committed. A
-- duplicate committed while the insert waited is not in this statement's snapshot; the
-- caller then reads it with job_by_key.
WITH inserted AS (
    INSERT INTO job (
        id, project_id, cycle, kind, subject, idempotency_key, priority, payload, run_after,
        max_attempts, lease_ms
    )
    VALUES (
        %(id)s, %(project_id)s, %(cycle)s, %(kind)s, %(subject)s, %(idempotency_key)s,
        %(priority)s, %(payload)s, now() + make_interval(secs => %(delay_s)s),
        %(max_attempts)s, %(lease_ms)s
    )
    ON CONFLICT (project_id, idempotency_key) DO NOTHING
    RETURNING *
)
SELECT true AS created, * FROM inserted
UNION ALL
SELECT false AS created, * FROM job
WHERE project_id = %(project_id)s AND idempotency_key = %(idempotency_key)s
  AND NOT EXISTS (SELECT 1 FROM inserted)

-- name: job_by_key
SELECT * FROM job WHERE project_id = %(project_id)s AND idempotency_key = %(idempotency_key)s

-- name: missing_dependencies
SELECT d.id
FROM unnest(%(ids)s::uuid[]) AS d (id)
WHERE NOT EXISTS (SELECT 1 FROM job WHERE job.id = d.id AND job.project_id = %(project_id)s)

-- name: insert_dependencies
INSERT INTO job_dependency (job_id, depends_on)
SELECT %(job_id)s, d.id FROM unnest(%(ids)s::uuid[]) AS d (id)
ON CONFLICT DO NOTHING

-- name: notify_ready
SELECT pg_notify('vibey_job_ready', %(project_id)s)

-- name: claim
WITH candidate AS (
    SELECT j.id
    FROM job j
    WHERE j.project_id = %(project_id)s
      AND j.state IN ('ready', 'awaiting_capacity')
      AND j.run_after <= now()
      AND (%(kinds)s::text[] IS NULL OR j.kind = ANY (%(kinds)s::text[]))
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = j.id AND p.state <> 'succeeded'
      )
    ORDER BY j.priority DESC, j.run_after, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE job
SET state = 'leased',
    attempts = job.attempts + 1,
    lease_owner = %(owner)s,
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + job.lease_ms * interval '1 millisecond',
    updated_at = now()
FROM candidate
WHERE job.id = candidate.id
RETURNING job.*

-- name: heartbeat
UPDATE job
SET lease_expires_at = now() + lease_ms * interval '1 millisecond', updated_at = now()
WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
  AND lease_token = %(token)s AND lease_expires_at > now()
RETURNING state, lease_expires_at

-- name: ack
WITH settled AS (
    UPDATE job
    SET state = 'succeeded', result = %(result)s, settled_at = now(), updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = NULL, failure_class = NULL
    WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, project_id, state
),
woken AS (
    -- Dependents may have become claimable: wake the project's idle workers (on commit).
    SELECT pg_notify('vibey_job_ready', s.project_id)
    FROM settled s
    WHERE EXISTS (SELECT 1 FROM job_dependency d WHERE d.depends_on = s.id)
)
SELECT s.state, (SELECT count(*) FROM woken) AS woken FROM settled s

-- name: nack
UPDATE job
SET state = CASE WHEN attempts >= max_attempts THEN 'failed'::job_state
                 ELSE 'ready'::job_state END,
    run_after = CASE WHEN attempts >= max_attempts THEN run_after
                     ELSE now() + make_interval(secs => %(retry_s)s) END,
    settled_at = CASE WHEN attempts >= max_attempts THEN now() END,
    last_error = %(error)s,
    failure_class = %(failure_class)s,
    updated_at = now(),
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
  AND lease_token = %(token)s AND lease_expires_at > now()
RETURNING state

-- name: defer
-- A defer gives back the attempt its claim counted.
UPDATE job
SET state = CASE WHEN %(capacity)s THEN 'awaiting_capacity'::job_state
                 ELSE 'ready'::job_state END,
    attempts = attempts - 1,
    run_after = now() + make_interval(secs => %(delay_s)s),
    last_error = %(reason)s,
    failure_class = CASE WHEN %(capacity)s THEN 'capacity'::failure_class END,
    updated_at = now(),
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
  AND lease_token = %(token)s AND lease_expires_at > now()
RETURNING state

-- name: park
WITH parked AS (
    UPDATE job
    SET state = 'awaiting_human', updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, project_id
)
INSERT INTO gate (id, project_id, job_id, kind, prompt, answers, context)
SELECT %(gate_id)s, p.project_id, p.id, %(kind)s, %(prompt)s, %(answers)s, %(context)s
FROM parked p
RETURNING id

-- name: grant
UPDATE job
SET max_attempts = %(max_attempts)s, updated_at = now()
WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
  AND lease_token = %(token)s AND lease_expires_at > now()
  AND max_attempts < %(max_attempts)s
RETURNING state

-- name: assign
UPDATE job
SET engine_id = %(engine_id)s, updated_at = now()
WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
  AND lease_token = %(token)s AND lease_expires_at > now()
RETURNING state

-- name: reap
-- Expired leases go back to ready; a job whose attempts are spent parks behind a
-- delivery_exhausted gate instead (its worker died or stalled on every attempt).
WITH expired AS (
    SELECT id, attempts >= max_attempts AS exhausted
    FROM job
    WHERE state = 'leased' AND lease_expires_at <= now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
released AS (
    UPDATE job
    SET state = CASE WHEN e.exhausted THEN 'awaiting_human'::job_state
                     ELSE 'ready'::job_state END,
        last_error = 'lease expired on attempt ' || job.attempts || ' of ' || job.max_attempts,
        updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM expired e
    WHERE job.id = e.id
    RETURNING job.id, job.project_id, job.attempts, e.exhausted
),
gates AS (
    INSERT INTO gate (id, project_id, job_id, kind, prompt, context)
    SELECT gen_random_uuid(), r.project_id, r.id, 'delivery_exhausted', %(prompt)s,
           jsonb_build_object('attempts', r.attempts)
    FROM released r
    WHERE r.exhausted
    RETURNING job_id
),
woken AS (
    SELECT pg_notify('vibey_job_ready', p.project_id)
    FROM (SELECT DISTINCT project_id FROM released WHERE NOT exhausted) p
)
SELECT count(*) FILTER (WHERE NOT r.exhausted) AS requeued,
       count(*) FILTER (WHERE r.exhausted) AS parked,
       (SELECT count(*) FROM gates) AS gates,
       (SELECT count(*) FROM woken) AS woken
FROM released r

-- name: lock_gate
SELECT * FROM gate WHERE id = %(gate_id)s FOR UPDATE

-- name: answer_gate
UPDATE gate
SET answer = %(answer)s, answered_by = %(answered_by)s, answered_at = now()
WHERE id = %(gate_id)s AND answered_at IS NULL
RETURNING *

-- name: release_parked
-- The answer re-readies the parked job. max_attempts never narrows; it widens to leave
-- %(more)s attempts beyond those already made.
UPDATE job
SET state = 'ready', run_after = now(), updated_at = now(),
    max_attempts = GREATEST(max_attempts, attempts + %(more)s)
WHERE id = %(job_id)s AND state = 'awaiting_human'
RETURNING project_id

-- name: get_job
SELECT * FROM job WHERE id = %(job_id)s

-- name: get_gate
SELECT * FROM gate WHERE id = %(gate_id)s

-- name: open_gates
SELECT * FROM gate
WHERE answered_at IS NULL AND (%(project_id)s::text IS NULL OR project_id = %(project_id)s)
ORDER BY opened_at, id

-- name: count_unsettled
SELECT count(*)
FROM job
WHERE project_id = %(project_id)s
  AND state NOT IN ('succeeded', 'failed', 'cancelled')
  AND (%(cycle)s::integer IS NULL OR cycle = %(cycle)s)
  AND (%(kinds)s::text[] IS NULL OR kind = ANY (%(kinds)s::text[]))
  AND (%(exclude)s::uuid IS NULL OR id <> %(exclude)s)

-- name: queue_depth
SELECT state, count(*) FROM job WHERE project_id = %(project_id)s GROUP BY state

-- name: list_for_cycle
SELECT * FROM job WHERE project_id = %(project_id)s AND cycle = %(cycle)s
ORDER BY created_at, id
