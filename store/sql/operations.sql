-- What operators read and what keeps the tables bounded: reconcile heartbeats, kept dead
-- letters, outbox pruning, and the counts behind the metrics, `vibey queue stats` and
-- `vibey doctor`.

-- name: record_heartbeat
INSERT INTO reconcile_heartbeat (owner, at, duration_ms, report)
VALUES (%(owner)s, now(), %(duration_ms)s, %(report)s)
ON CONFLICT (owner) DO UPDATE
SET at = now(), duration_ms = EXCLUDED.duration_ms, report = EXCLUDED.report

-- name: latest_heartbeat
SELECT owner, at, duration_ms, report, extract(epoch FROM now() - at)::float8 AS age_s
FROM reconcile_heartbeat ORDER BY at DESC LIMIT 1

-- name: keep_dead_letter
INSERT INTO dead_letter (queue, routing_key, reason, detail, body, headers, message_id)
VALUES (%(queue)s, %(routing_key)s, %(reason)s, %(detail)s, %(body)s, %(headers)s,
        %(message_id)s)
RETURNING id

-- name: dead_letters
SELECT id, queue, routing_key, reason, detail, body, headers, message_id, received_at
FROM dead_letter
WHERE %(after)s::bigint IS NULL OR id > %(after)s::bigint
ORDER BY id
LIMIT %(limit)s

-- name: dead_letter_count
SELECT count(*) AS n FROM dead_letter

-- name: prune_outbox
-- Sent rows older than the retention, a batch at a time, oldest first (job_outbox_sent).
DELETE FROM job_outbox
WHERE id IN (
    SELECT id FROM job_outbox
    WHERE sent_at IS NOT NULL AND sent_at < now() - make_interval(secs => %(retention_s)s)
    ORDER BY sent_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)

-- name: live_jobs
-- Jobs not yet terminal, by state and kind (terminal ones are counted as step results).
SELECT state::text AS state, kind, count(*) AS n
FROM job
WHERE state NOT IN ('succeeded', 'failed', 'cancelled')
GROUP BY 1, 2

-- name: outbox_lag
SELECT count(*) AS unsent,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_s
FROM job_outbox
WHERE sent_at IS NULL

-- name: open_gate_ages
SELECT kind, count(*) AS n, extract(epoch FROM now() - min(opened_at))::float8 AS oldest_s
FROM gate
WHERE answered_at IS NULL
GROUP BY kind

-- name: circuits
SELECT engine_id, circuit_state, capacity_state FROM engine_health ORDER BY engine_id

-- name: oldest_ready
-- The claimable job that has waited longest since it became due, and how long.
SELECT j.id, j.project_id, j.kind, extract(epoch FROM now() - j.run_after)::float8 AS waited_s
FROM job j
WHERE j.state IN ('ready', 'awaiting_capacity') AND j.run_after <= now()
  AND NOT EXISTS (
      SELECT 1 FROM job_dependency d JOIN job p ON p.id = d.depends_on
      WHERE d.job_id = j.id AND p.state <> 'succeeded'
  )
ORDER BY j.run_after
LIMIT 1
