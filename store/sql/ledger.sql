-- The ledger: append-only events with a gapless per-project seq. See store/ledger.py and
-- migrations/0005_ledger.sql.

-- name: append_events
-- One statement: move the project's head forward by n (its row stays locked until the
-- transaction ends, so appenders of one project serialise), then insert the n events at
-- seq head-n+1..head in the order given. A rollback undoes both: the seqs are not lost.
WITH head AS (
    INSERT INTO ledger_head (project_id, last_seq)
    VALUES (%(project_id)s, %(n)s)
    ON CONFLICT (project_id) DO UPDATE SET last_seq = ledger_head.last_seq + EXCLUDED.last_seq
    RETURNING last_seq
)
INSERT INTO ledger_event (
    project_id, seq, kind, payload, digest, causation_id, correlation_id, job_id, workflow_id
)
SELECT %(project_id)s, head.last_seq - %(n)s + e.ord, e.kind, e.payload, e.digest,
    %(causation_id)s, %(correlation_id)s, %(job_id)s, %(workflow_id)s
FROM head,
    unnest(%(kinds)s::text[], %(payloads)s::jsonb[], %(digests)s::text[])
        WITH ORDINALITY AS e (kind, payload, digest, ord)
RETURNING seq, recorded_at

-- name: read_events
SELECT * FROM ledger_event
WHERE project_id = %(project_id)s AND seq > %(after)s
ORDER BY seq
LIMIT %(limit)s

-- name: head
SELECT last_seq FROM ledger_head WHERE project_id = %(project_id)s

-- name: verify_snapshot
-- verify reads the head and every event in one REPEATABLE READ snapshot.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: all_events
SELECT * FROM ledger_event WHERE project_id = %(project_id)s ORDER BY seq
