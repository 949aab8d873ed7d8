-- What an ambiguous commit (a connection lost while COMMIT was in flight) is resolved with.

-- name: unsent_of
-- Which of a unit's outbox rows exist (its commit landed) and are unsent.
SELECT id FROM job_outbox WHERE id = ANY (%(ids)s) AND sent_at IS NULL
