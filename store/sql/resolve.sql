-- What an ambiguous commit (a connection lost while COMMIT was in flight) is resolved with.

-- name: unsent_rows
-- A cut-off unit's outbox rows that exist (its commit landed) and are unsent, with what the
-- relay publishes: those it read back (by id) and those it had not read yet (a start's first
-- jobs, ``UnitOfWork.read_after_commit``: by key).
SELECT id, key, job_id, project_id, dispatch_seq, kind, not_before, solo, priority, workflow_id,
       traceparent
FROM job_outbox
WHERE (id = ANY (%(ids)s::bigint[]) OR key = ANY (%(keys)s::text[])) AND sent_at IS NULL
ORDER BY id
