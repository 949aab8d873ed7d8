-- What the web console watches: one cheap row whose value changes when anything it shows does.
-- Every part is an index scan or a tiny table: the newest workflow update (workflow_by_update),
-- the open gates (gate_inbox, partial), the leased jobs (job_lease_expiry, partial), the newest
-- engine health change (one row an engine) and the newest ledger head.

-- name: last_change
SELECT
    (SELECT max(updated_at) FROM workflow) AS workflow_at,
    (SELECT count(*) FROM gate WHERE answered_at IS NULL) AS open_gates,
    (SELECT max(opened_at) FROM gate WHERE answered_at IS NULL) AS gate_at,
    (SELECT count(*) FROM job WHERE state = 'leased') AS leased,
    (SELECT max(updated_at) FROM engine_health) AS engine_at,
    (SELECT coalesce(sum(last_seq), 0) FROM ledger_head) AS ledger_seqs
