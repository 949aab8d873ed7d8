-- The job queue's SQL (PostgreSQL backend). Every settling write is fenced on the lease:
--   state = 'leased' AND lease_owner = %(owner)s AND lease_token = %(token)s
--   AND lease_expires_at > now()
-- so a holder whose lease expired or was taken over changes nothing (zero rows), and all
-- lease arithmetic uses the database clock.
--
-- %(dispatch)s is true on the RabbitMQ backend: a transition that starts a new dispatch
-- episode then increments job.dispatch_seq and writes its job_outbox row in the same
-- statement (claimed for %(relay)s, the committing process's relay, when one is named).

-- name: insert_job
-- One round trip in the common cases: a new row, or a duplicate already committed. A
-- duplicate committed while the insert waited is not in this statement's snapshot; the
-- caller then reads it with job_by_key. %(dispatch_now)s (dispatching, and the job has no
-- dependencies: it is claimable at once) dispatches it in the same statement, generation 1
-- with its outbox row, as dispatch_released would.
WITH inserted AS (
    INSERT INTO job (
        id, project_id, cycle, kind, subject, idempotency_key, priority, payload, run_after,
        max_attempts, lease_ms, workflow_id, step, dispatch_seq
    )
    VALUES (
        %(id)s, %(project_id)s, %(cycle)s, %(kind)s, %(subject)s, %(idempotency_key)s,
        %(priority)s, %(payload)s, now() + make_interval(secs => %(delay_s)s),
        %(max_attempts)s, %(lease_ms)s, %(workflow_id)s, %(step)s,
        CASE WHEN %(dispatch_now)s THEN 1 ELSE 0 END
    )
    ON CONFLICT (project_id, idempotency_key) DO NOTHING
    RETURNING *
),
outbox AS (
    INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before,
                            claimed_by, claimed_at, priority, workflow_id)
    SELECT 'dispatch:' || i.id || ':' || i.dispatch_seq, i.id, i.project_id, i.dispatch_seq,
           i.kind, i.run_after, %(relay)s::text,
           CASE WHEN %(relay)s::text IS NOT NULL THEN now() END, i.priority, i.workflow_id
    FROM inserted i
    WHERE %(dispatch_now)s
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
              priority, workflow_id
)
SELECT true AS created, (SELECT jsonb_agg(o) FROM outbox o) AS outbox_rows, * FROM inserted
UNION ALL
SELECT false AS created, NULL::jsonb AS outbox_rows, * FROM job
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

-- name: lock_dependents
-- Before releasing an acked job's dependents, lock them (in id order): two parents acked at
-- once then release their common child in whichever commits second, whose next statement
-- sees the first one's commit.
SELECT j.id FROM job j
WHERE j.id IN (SELECT d.job_id FROM job_dependency d WHERE d.depends_on = %(job_id)s)
  AND j.dispatch_seq = 0
ORDER BY j.id
FOR UPDATE

-- name: dispatch_released
-- Jobs among %(ids)s never dispatched whose dependencies have all succeeded: generation
-- 0 → 1, with their outbox rows.
WITH released AS (
    UPDATE job j
    SET dispatch_seq = 1, updated_at = now()
    WHERE j.id = ANY (%(ids)s::uuid[])
      AND j.dispatch_seq = 0
      AND j.state IN ('ready', 'awaiting_capacity')
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = j.id AND p.state <> 'succeeded'
      )
    RETURNING j.id, j.project_id, j.dispatch_seq, j.kind, j.run_after, j.priority, j.workflow_id
)
INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before,
                        claimed_by, claimed_at, priority, workflow_id)
SELECT 'dispatch:' || r.id || ':' || r.dispatch_seq, r.id, r.project_id, r.dispatch_seq,
       r.kind, r.run_after, %(relay)s::text, CASE WHEN %(relay)s::text IS NOT NULL THEN now() END,
       r.priority, r.workflow_id
FROM released r
ON CONFLICT (key) DO NOTHING
RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
          priority, workflow_id

-- name: dispatch_dependents
-- (A separate statement from dispatch_released, not an OR of the two: each one is driven by
-- an index; the OR scanned the whole job table on every ack.)
-- The dependents of %(parent)s never dispatched whose dependencies have all succeeded: generation
-- 0 → 1, with their outbox rows.
WITH released AS (
    UPDATE job j
    SET dispatch_seq = 1, updated_at = now()
    WHERE j.id IN (SELECT d.job_id FROM job_dependency d WHERE d.depends_on = %(parent)s)
      AND j.dispatch_seq = 0
      AND j.state IN ('ready', 'awaiting_capacity')
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = j.id AND p.state <> 'succeeded'
      )
    RETURNING j.id, j.project_id, j.dispatch_seq, j.kind, j.run_after, j.priority, j.workflow_id
)
INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before,
                        claimed_by, claimed_at, priority, workflow_id)
SELECT 'dispatch:' || r.id || ':' || r.dispatch_seq, r.id, r.project_id, r.dispatch_seq,
       r.kind, r.run_after, %(relay)s::text, CASE WHEN %(relay)s::text IS NOT NULL THEN now() END,
       r.priority, r.workflow_id
FROM released r
ON CONFLICT (key) DO NOTHING
RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
          priority, workflow_id

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
-- Fenced on the lease; or, with %(locked)s, on the row lock of a claim its unit took with
-- dispatch.sql's lock_pointer and has not written: the claim's columns (as lock_pointer
-- computed them: %(attempts)s, %(dispatched_at)s) are written with the ack's, one write of
-- the row instead of two (the row is as it was locked).
WITH settled AS (
    UPDATE job
    SET state = 'succeeded', result = %(result)s, settled_at = now(), updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = NULL, failure_class = NULL, lease_expired = false,
        attempts = CASE WHEN %(locked)s THEN %(attempts)s::integer ELSE attempts END,
        sweeps = CASE WHEN %(locked)s THEN 0 ELSE sweeps END,
        dispatched_at = CASE WHEN %(locked)s THEN %(dispatched_at)s::timestamptz
                             ELSE dispatched_at END
    WHERE id = %(job_id)s
      AND CASE WHEN %(locked)s
               THEN dispatch_seq = %(seq)s AND state IN ('ready', 'awaiting_capacity')
               ELSE state = 'leased' AND lease_owner = %(owner)s AND lease_token = %(token)s
                    AND lease_expires_at > now() END
    RETURNING id, project_id, state
),
woken AS (
    -- Dependents may have become claimable: wake the project's idle workers (on commit).
    -- %(wake)s is false where nobody listens (a relay publishes the released pointers).
    SELECT pg_notify('vibey_job_ready', s.project_id)
    FROM settled s
    WHERE %(wake)s AND EXISTS (SELECT 1 FROM job_dependency d WHERE d.depends_on = s.id)
)
SELECT s.state, (SELECT count(*) FROM woken) AS woken,
       EXISTS (SELECT 1 FROM job_dependency d WHERE d.depends_on = s.id) AS dependents
FROM settled s

-- name: write_claim
-- The claim a unit locked with dispatch.sql's lock_pointer, written as claim_pointer would
-- have (its columns as lock_pointer computed them), before a settle other than a success,
-- or at once when the claim takes over an expired lease. The unit holds the row's lock.
UPDATE job
SET state = 'leased', attempts = %(attempts)s, last_error = %(last_error)s,
    lease_expired = %(lease_expired)s, sweeps = 0, lease_owner = %(owner)s,
    lease_token = %(token)s, lease_expires_at = %(expires_at)s, updated_at = now(),
    dispatched_at = %(dispatched_at)s
WHERE id = %(job_id)s AND dispatch_seq = %(seq)s

-- name: nack
WITH settled AS (
    UPDATE job
    SET state = CASE WHEN attempts >= max_attempts THEN 'failed'::job_state
                     ELSE 'ready'::job_state END,
        run_after = CASE WHEN attempts >= max_attempts THEN run_after
                         ELSE now() + make_interval(secs => %(retry_s)s) END,
        settled_at = CASE WHEN attempts >= max_attempts THEN now() END,
        dispatch_seq = dispatch_seq
            + CASE WHEN %(dispatch)s AND attempts < max_attempts THEN 1 ELSE 0 END,
        last_error = %(error)s,
        lease_expired = false,
        failure_class = %(failure_class)s,
        updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, project_id, dispatch_seq, kind, run_after, state
),
outbox AS (
    INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before,
                            claimed_by, claimed_at)
    SELECT 'dispatch:' || s.id || ':' || s.dispatch_seq, s.id, s.project_id, s.dispatch_seq,
           s.kind, s.run_after, %(relay)s::text, CASE WHEN %(relay)s::text IS NOT NULL THEN now() END
    FROM settled s
    WHERE %(dispatch)s AND s.state = 'ready'
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
              priority, workflow_id
)
SELECT s.state, (SELECT jsonb_agg(o) FROM outbox o) AS outbox_rows FROM settled s

-- name: defer
-- A defer gives back the attempt its claim counted.
WITH settled AS (
    UPDATE job
    SET state = CASE WHEN %(capacity)s THEN 'awaiting_capacity'::job_state
                     ELSE 'ready'::job_state END,
        attempts = attempts - 1,
        run_after = now() + make_interval(secs => %(delay_s)s),
        dispatch_seq = dispatch_seq + CASE WHEN %(dispatch)s THEN 1 ELSE 0 END,
        last_error = %(reason)s,
        lease_expired = false,
        failure_class = CASE WHEN %(capacity)s THEN 'capacity'::failure_class END,
        updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, project_id, dispatch_seq, kind, run_after, state
),
outbox AS (
    INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before,
                            claimed_by, claimed_at, solo)
    SELECT 'dispatch:' || s.id || ':' || s.dispatch_seq, s.id, s.project_id, s.dispatch_seq,
           s.kind, s.run_after, %(relay)s::text, CASE WHEN %(relay)s::text IS NOT NULL THEN now() END,
           %(solo)s
    FROM settled s
    WHERE %(dispatch)s
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
              priority, workflow_id
)
SELECT s.state, (SELECT jsonb_agg(o) FROM outbox o) AS outbox_rows FROM settled s

-- name: park
WITH parked AS (
    UPDATE job
    SET state = 'awaiting_human', updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    WHERE id = %(job_id)s AND state = 'leased' AND lease_owner = %(owner)s
      AND lease_token = %(token)s AND lease_expires_at > now()
    RETURNING id, project_id, workflow_id
)
INSERT INTO gate (id, project_id, job_id, workflow_id, kind, prompt, answers, context, schema)
SELECT %(gate_id)s, p.project_id, p.id, p.workflow_id, %(kind)s, %(prompt)s, %(answers)s,
    %(context)s, %(schema)s
FROM parked p
RETURNING id, project_id, workflow_id

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
        dispatch_seq = job.dispatch_seq
            + CASE WHEN %(dispatch)s AND NOT e.exhausted THEN 1 ELSE 0 END,
        last_error = 'lease expired on attempt ' || job.attempts || ' of ' || job.max_attempts,
        lease_expired = true,
        updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
    FROM expired e
    WHERE job.id = e.id
    RETURNING job.id, job.project_id, job.workflow_id, job.attempts, e.exhausted,
              job.dispatch_seq, job.kind, job.run_after
),
outbox AS (
    -- solo: the attempt died with its process; the next one runs alone
    INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before, solo)
    SELECT 'dispatch:' || r.id || ':' || r.dispatch_seq, r.id, r.project_id, r.dispatch_seq,
           r.kind, r.run_after, true
    FROM released r
    WHERE %(dispatch)s AND NOT r.exhausted
    ON CONFLICT (key) DO NOTHING
    RETURNING id
),
gates AS (
    INSERT INTO gate (id, project_id, job_id, workflow_id, kind, prompt, context)
    SELECT gen_random_uuid(), r.project_id, r.id, r.workflow_id, 'delivery_exhausted',
           %(prompt)s, jsonb_build_object('attempts', r.attempts)
    FROM released r
    WHERE r.exhausted
    RETURNING id, job_id, project_id, workflow_id
),
woken AS (
    SELECT pg_notify('vibey_job_ready', p.project_id)
    FROM (SELECT DISTINCT project_id FROM released WHERE NOT exhausted) p
)
SELECT count(*) FILTER (WHERE NOT r.exhausted) AS requeued,
       count(*) FILTER (WHERE r.exhausted) AS parked,
       (SELECT count(*) FROM woken) AS woken,
       -- the gates opened, for their gate.opened events and ledger questions (same transaction)
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
            'id', g.id, 'job_id', g.job_id, 'project_id', g.project_id,
            'workflow_id', g.workflow_id)), '[]'::jsonb) FROM gates g) AS opened
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
WITH released AS (
    UPDATE job
    SET state = 'ready', run_after = now(), updated_at = now(),
        max_attempts = GREATEST(max_attempts, attempts + %(more)s),
        dispatch_seq = dispatch_seq + CASE WHEN %(dispatch)s THEN 1 ELSE 0 END
    WHERE id = %(job_id)s AND state = 'awaiting_human'
    RETURNING id, project_id, dispatch_seq, kind, run_after
),
outbox AS (
    INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before,
                            claimed_by, claimed_at)
    SELECT 'dispatch:' || r.id || ':' || r.dispatch_seq, r.id, r.project_id, r.dispatch_seq,
           r.kind, r.run_after, %(relay)s::text, CASE WHEN %(relay)s::text IS NOT NULL THEN now() END
    FROM released r
    WHERE %(dispatch)s
    ON CONFLICT (key) DO NOTHING
    RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
              priority, workflow_id
)
SELECT r.project_id, (SELECT jsonb_agg(o) FROM outbox o) AS outbox_rows FROM released r

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
