-- What an ambiguous commit (a connection lost while COMMIT was in flight) is resolved with.

-- name: claimed_unsent
-- The outbox rows a relay holds and has not sent: among them, any a cut-off commit wrote.
SELECT id
FROM job_outbox
WHERE claimed_by = %(relay)s AND sent_at IS NULL
ORDER BY id
LIMIT %(limit)s
