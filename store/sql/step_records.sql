-- What the step handlers read while a step runs (actors/handlers.py, actors/handoff.py):
-- whether the claim still holds its job, the workflow's spec and answers, a bounded job's
-- recorded spend and what answers to its gates granted, and the serialising lock of a merge.

-- name: lease_held
-- The fence a workdir lease asks: is the job still leased to the claim that started it?
SELECT 1 AS held FROM job
WHERE id = %(job_id)s::uuid AND state = 'leased' AND lease_token::text = %(owner)s

-- name: plan_context
-- The accepted spec and the design answers of the job's workflow (its state).
SELECT w.state->>'spec' AS spec, w.state->'answers' AS answers
FROM job j JOIN workflow w ON w.id = j.workflow_id
WHERE j.id = %(job_id)s::uuid

-- name: spent
-- The job's recorded spend: the ledger's BudgetSpent events for it.
SELECT coalesce(sum((payload->>'dollars')::numeric), 0) AS dollars,
       coalesce(sum((payload->>'turns')::numeric), 0) AS turns
FROM ledger_event
WHERE job_id = %(job_id)s AND kind = 'BudgetSpent'

-- name: spend_granted
-- What the numeric answers to the job's gates of %(kind)s granted, by the bound each names.
SELECT context->>'grant' AS bound, sum(answer::numeric) AS amount
FROM gate
WHERE job_id = %(job_id)s AND kind = %(kind)s
  AND answered_at IS NOT NULL AND answer ~ '^[0-9]+$'
GROUP BY 1

-- name: attempts_granted
-- The attempts the numeric answers to the job's gates of %(kind)s granted.
SELECT coalesce(sum(answer::int), 0) AS granted
FROM gate
WHERE job_id = %(job_id)s AND kind = %(kind)s
  AND answered_at IS NOT NULL AND answer ~ '^[0-9]+$'

-- name: last_answer
-- The latest answered gate of %(kind)s for the job.
SELECT answer, answered_by, context
FROM gate
WHERE job_id = %(job_id)s AND kind = %(kind)s AND answered_at IS NOT NULL
ORDER BY answered_at DESC
LIMIT 1

-- name: integration_lock
-- Serialises the merges of one project's cycle until the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('vibey.integrate:' || %(project)s::text), %(cycle)s::int)

-- name: capacity_waits
-- The job's capacity rejections in the ledger since the last answer to its %(kind)s gate
-- (every one, when none was answered): how long it has waited for capacity.
SELECT count(*) AS waits
FROM ledger_event
WHERE job_id = %(job_id)s AND kind = 'CapacityRejected'
  AND recorded_at > coalesce(
      (SELECT max(answered_at) FROM gate
       WHERE job_id = %(job_id)s AND kind = %(kind)s AND answered_at IS NOT NULL),
      '-infinity'::timestamptz)
