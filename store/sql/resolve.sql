-- What an ambiguous commit (a connection lost while COMMIT was in flight) is resolved with.

-- name: unsent_of
-- Which of a unit's outbox rows exist (its commit landed) and are unsent.
SELECT id FROM job_outbox WHERE id = ANY (%(ids)s) AND sent_at IS NULL

-- name: unsent_by_key
-- The outbox rows a unit wrote but had not read back when its commit was cut off (a start's
-- first jobs: ``UnitOfWork.read_after_commit``), by their keys: those that exist (it landed)
-- and are unsent, with what the relay publishes.
SELECT id, key, job_id, project_id, dispatch_seq, kind, not_before, solo, priority, workflow_id,
       traceparent
FROM job_outbox
WHERE key = ANY (%(keys)s::text[]) AND sent_at IS NULL
ORDER BY id
