-- The RabbitMQ backend's record-store side: the fenced claim of a dispatch pointer, the
-- lost-dispatch sweep, dead letters as parks, and the outbox relay's claims and marks.

-- name: claim_pointer
-- The fenced claim of pointer (job, generation): the row must be at that generation, due,
-- with every dependency succeeded, and either claimable or holding an expired lease (whose
-- attempts are not spent: a spent one is the reaper's to park).
-- %(sent)s: the outbox row of a pointer a chain held (UnitOfWork.hold), marked sent in the
-- same statement, claim or miss (the pointer went no further than this process); NULL for a
-- delivered pointer (nothing to mark). The job's dispatched_at is stamped by the claim, or,
-- when it misses, by the last sub-statement: one row is never updated twice in a statement.
WITH sent AS (
    UPDATE job_outbox
    SET sent_at = now()
    WHERE id = %(sent)s AND sent_at IS NULL
    RETURNING job_id, dispatch_seq
),
claimed AS (
    UPDATE job
    SET state = 'leased',
        attempts = attempts + 1,
        -- Taking over an expired lease: that attempt died with its process (see solo pointers).
        last_error = CASE WHEN state = 'leased'
                          THEN 'lease expired on attempt ' || attempts || ' of ' || max_attempts
                          ELSE last_error END,
        lease_expired = lease_expired OR state = 'leased',
        sweeps = 0,
        lease_owner = %(owner)s,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + lease_ms * interval '1 millisecond',
        updated_at = now(),
        dispatched_at = CASE WHEN EXISTS (SELECT 1 FROM sent s
                                          WHERE s.job_id = job.id
                                            AND s.dispatch_seq = job.dispatch_seq)
                             THEN now() ELSE dispatched_at END
    WHERE id = %(job_id)s
      AND project_id = %(project_id)s
      AND dispatch_seq = %(seq)s
      AND (state IN ('ready', 'awaiting_capacity')
           OR (state = 'leased' AND lease_expires_at <= now() AND attempts < max_attempts))
      AND run_after <= now()
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = job.id AND p.state <> 'succeeded'
      )
    RETURNING *
),
missed AS (
    UPDATE job
    SET dispatched_at = now()
    FROM sent
    WHERE job.id = sent.job_id AND job.dispatch_seq = sent.dispatch_seq
      AND NOT EXISTS (SELECT 1 FROM claimed)
)
SELECT * FROM claimed

-- name: lock_pointer
-- A short step's claim (its claim, handler and settle are one transaction): the fences of
-- claim_pointer, but the row is locked, not written. Inside the unit nobody else can see a
-- claim anyway, so its success writes the row once (jobs.sql's ack, locked: the claim's
-- columns with the ack's) instead of twice; any other settle writes the claim first
-- (write_claim). The claim's columns come back beside the row as claim_*: the same
-- expressions as claim_pointer's SET. %(sent)s as in claim_pointer; the job's dispatched_at
-- is claim_dispatched_at, written with the claim, or stamped here when the claim misses.
-- claim_dependents: jobs wait on this one (its ack then releases them in the unit).
-- %(workflow)s: the job's workflow is locked first (the store's lock order: a workflow, then
-- its jobs), by the same statement, and comes back beside the row as w_* (NULL: a plain
-- job's). The job's lock waits on the workflow's: the workflow is read in the job's filter,
-- and the job's row is locked only once it passed that filter.
WITH wf AS (
    SELECT w.* FROM workflow w
    WHERE %(workflow)s AND w.id = (SELECT j.workflow_id FROM job j WHERE j.id = %(job_id)s)
    FOR UPDATE OF w
),
sent AS (
    UPDATE job_outbox
    SET sent_at = now()
    WHERE id = %(sent)s AND sent_at IS NULL
    RETURNING job_id, dispatch_seq
),
locked AS (
    SELECT j.*
    FROM job j
    WHERE j.id = %(job_id)s
      AND j.project_id = %(project_id)s
      AND j.dispatch_seq = %(seq)s
      AND (j.state IN ('ready', 'awaiting_capacity')
           OR (j.state = 'leased' AND j.lease_expires_at <= now()
               AND j.attempts < j.max_attempts))
      AND j.run_after <= now()
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = j.id AND p.state <> 'succeeded'
      )
      AND (SELECT count(*) FROM wf) >= 0  -- the workflow locked before this row
    FOR NO KEY UPDATE OF j
),
missed AS (
    UPDATE job
    SET dispatched_at = now()
    FROM sent
    WHERE job.id = sent.job_id AND job.dispatch_seq = sent.dispatch_seq
      AND NOT EXISTS (SELECT 1 FROM locked)
)
SELECT l.*,
       l.attempts + 1 AS claim_attempts,
       CASE WHEN l.state = 'leased'
            THEN 'lease expired on attempt ' || l.attempts || ' of ' || l.max_attempts
            ELSE l.last_error END AS claim_last_error,
       l.lease_expired OR l.state = 'leased' AS claim_lease_expired,
       gen_random_uuid() AS claim_token,
       now() + l.lease_ms * interval '1 millisecond' AS claim_expires_at,
       now() AS claim_at,
       CASE WHEN EXISTS (SELECT 1 FROM sent s
                         WHERE s.job_id = l.id AND s.dispatch_seq = l.dispatch_seq)
            THEN now() ELSE l.dispatched_at END AS claim_dispatched_at,
       EXISTS (SELECT 1 FROM job_dependency d WHERE d.depends_on = l.id) AS claim_dependents,
       w.id AS w_id, w.project_id AS w_project_id, w.definition AS w_definition,
       w.version AS w_version, w.phase AS w_phase, w.cycle AS w_cycle, w.status AS w_status,
       w.completion_mode AS w_completion_mode, w.reason AS w_reason, w.input AS w_input,
       w.state AS w_state, w.last_seq AS w_last_seq, w.applied_seq AS w_applied_seq,
       w.created_at AS w_created_at, w.updated_at AS w_updated_at,
       w.finished_at AS w_finished_at
FROM locked l LEFT JOIN wf w ON true

-- name: snapshot
-- What the miss policy needs to know about a pointer's row, read on the database clock.
SELECT j.state, j.dispatch_seq, j.run_after, j.lease_expires_at, now() AS now,
       NOT EXISTS (
           SELECT 1
           FROM job_dependency d
           JOIN job p ON p.id = d.depends_on
           WHERE d.job_id = j.id AND p.state <> 'succeeded'
       ) AS deps_met
FROM job j
WHERE j.id = %(job_id)s AND j.project_id = %(project_id)s

-- name: sweep_lost
-- Claimable rows whose dispatch was lost: never dispatched (generation 0: the
-- enqueue-versus-ack race), or due and unclaimed for longer than redispatch_after since
-- both their dispatch and their due time. Resent at the same generation (a duplicate is
-- harmless); rows with an unsent outbox row are the relay's, not lost. Each resend of one
-- wait doubles the next one's patience (up to 2^max_doublings): a pointer behind a backlog is
-- late, not lost, and resending it every interval would grow the backlog it waits behind.
WITH lost AS (
    SELECT j.id
    FROM job j
    WHERE j.state IN ('ready', 'awaiting_capacity')
      AND j.run_after <= now()
      AND (j.dispatch_seq = 0
           OR GREATEST(COALESCE(j.dispatched_at, j.updated_at), j.run_after)
              < now() - make_interval(
                  secs => %(after_s)s * power(2, LEAST(j.sweeps, %(max_doublings)s))))
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = j.id AND p.state <> 'succeeded'
      )
      AND NOT EXISTS (SELECT 1 FROM job_outbox o WHERE o.job_id = j.id AND o.sent_at IS NULL)
    ORDER BY j.run_after, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
bumped AS (
    UPDATE job
    SET dispatch_seq = GREATEST(job.dispatch_seq, 1),
        dispatched_at = NULL,
        sweeps = job.sweeps + 1,
        updated_at = now()
    FROM lost
    WHERE job.id = lost.id
    RETURNING job.id, job.project_id, job.dispatch_seq, job.kind, job.run_after
)
INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before, traceparent)
SELECT 'dispatch:' || b.id || ':' || b.dispatch_seq || ':sweep:'
           || floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       b.id, b.project_id, b.dispatch_seq, b.kind, b.run_after,
       -- the trace the lost pointer continued (its row's traceparent), if it was traced
       (SELECT o.traceparent FROM job_outbox o
        WHERE o.job_id = b.id AND o.traceparent IS NOT NULL
        ORDER BY o.id DESC LIMIT 1)
FROM bumped b
ON CONFLICT (key) DO NOTHING
RETURNING id

-- name: park_dead_letter
-- A pointer that exceeded the broker's delivery limit, for a row still at that generation and
-- ready or holding an expired lease. PostgreSQL's attempt counter is the authority: a job whose
-- attempts are spent parks behind a delivery_exhausted gate; one with attempts left was only
-- co-delivered with a consumer-killer (a prefetched message dies with its channel) and is
-- dispatched again at a new generation, with a fresh delivery budget.
WITH target AS (
    SELECT id, project_id, attempts, attempts >= max_attempts AS spent
    FROM job
    WHERE id = %(job_id)s AND project_id = %(project_id)s AND dispatch_seq = %(seq)s
      AND (state IN ('ready', 'awaiting_capacity')
           OR (state = 'leased' AND lease_expires_at <= now()))
    FOR UPDATE
),
moved AS (
    UPDATE job
    SET state = CASE WHEN t.spent THEN 'awaiting_human'::job_state ELSE 'ready'::job_state END,
        dispatch_seq = job.dispatch_seq + CASE WHEN t.spent THEN 0 ELSE 1 END,
        updated_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_error = %(reason)s, lease_expired = false
    FROM target t
    WHERE job.id = t.id
    RETURNING job.id, job.project_id, job.attempts, job.dispatch_seq, job.kind, job.run_after,
              t.spent
),
gate AS (
    INSERT INTO gate (id, project_id, job_id, kind, prompt, context)
    SELECT gen_random_uuid(), m.project_id, m.id, 'delivery_exhausted', %(prompt)s,
           jsonb_build_object('attempts', m.attempts, 'reason', %(reason)s::text)
    FROM moved m
    WHERE m.spent
    RETURNING id
),
outbox AS (
    INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before, solo)
    SELECT 'dispatch:' || m.id || ':' || m.dispatch_seq, m.id, m.project_id, m.dispatch_seq,
           m.kind, greatest(m.run_after, now()), true
    FROM moved m
    WHERE NOT m.spent
    ON CONFLICT (key) DO NOTHING
    RETURNING id
)
SELECT m.spent FROM moved m

-- name: claim_outbox
-- The relay's batch: unsent rows nobody holds, or held longer than reclaim_after by a relay
-- that died. Oldest first, never by an id high-water mark.
UPDATE job_outbox
SET claimed_by = %(relay)s, claimed_at = now()
WHERE id IN (
    SELECT id
    FROM job_outbox
    WHERE sent_at IS NULL
      AND (claimed_at IS NULL OR claimed_at < now() - make_interval(secs => %(reclaim_s)s))
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, key, job_id, project_id, dispatch_seq, kind, not_before, solo,
          priority, workflow_id, traceparent

-- name: outbox_rows
SELECT id, key, job_id, project_id, dispatch_seq, kind, not_before, solo, priority, workflow_id,
       traceparent
FROM job_outbox
WHERE id = ANY (%(ids)s::bigint[]) AND sent_at IS NULL
ORDER BY id

-- name: trace_outbox
-- A traced unit of work's rows, before its commit: the trace context their pointers continue.
UPDATE job_outbox SET traceparent = %(traceparent)s WHERE id = ANY (%(ids)s::bigint[])

-- name: trace_outbox_keys
-- The same for rows the unit has not read back yet (a start's: ``read_after_commit``).
UPDATE job_outbox SET traceparent = %(traceparent)s WHERE key = ANY (%(keys)s::text[])

-- name: mark_sent
-- After the broker confirmed (and did not return) each row's message.
WITH sent AS (
    UPDATE job_outbox
    SET sent_at = now()
    WHERE id = ANY (%(ids)s::bigint[]) AND sent_at IS NULL
    RETURNING job_id, dispatch_seq
)
UPDATE job
SET dispatched_at = now()
FROM sent
WHERE job.id = sent.job_id AND job.dispatch_seq = sent.dispatch_seq

-- name: release_held
-- release_outbox for the one row a step holds (UnitOfWork.hold), by a scalar id.
UPDATE job_outbox
SET claimed_by = NULL, claimed_at = NULL
WHERE id = %(id)s AND sent_at IS NULL

-- name: release_outbox
-- A publish failed: give the rows back for the next drain.
UPDATE job_outbox
SET claimed_by = NULL, claimed_at = NULL
WHERE id = ANY (%(ids)s::bigint[]) AND sent_at IS NULL

-- name: outbox_backlog
SELECT count(*) FILTER (WHERE sent_at IS NULL) AS unsent,
       count(*) FILTER (WHERE sent_at IS NULL AND claimed_at IS NOT NULL) AS claimed
FROM job_outbox
