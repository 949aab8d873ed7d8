-- Retention for finished workflows (store/retention.py, migrations/0016_workflow_retention.sql).
-- One batch: pick finished workflows past the retention whose jobs are all terminal, archive
-- their history, delete their gates and jobs (dependencies and outbox rows go with them),
-- delete the archived history, mark them archived. The ledger is never touched.

-- name: pick_finished
SELECT w.id FROM workflow w
WHERE w.finished_at IS NOT NULL AND w.archived_at IS NULL
  AND w.finished_at < now() - make_interval(secs => %(retention_s)s)
  AND NOT EXISTS (
      SELECT 1 FROM job j
      WHERE j.workflow_id = w.id
        AND j.state IN ('ready', 'leased', 'awaiting_human', 'awaiting_capacity'))
ORDER BY w.finished_at
LIMIT %(batch)s
FOR UPDATE OF w SKIP LOCKED

-- name: archive_history
INSERT INTO workflow_archive (workflow_id, last_seq, history, jobs)
SELECT w.id, w.last_seq,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'seq', h.seq, 'event', h.event, 'commands', h.commands,
                        'recorded_at', h.recorded_at) ORDER BY h.seq)
                 FROM workflow_history h WHERE h.workflow_id = w.id), '[]'::jsonb),
       (SELECT count(*) FROM job j WHERE j.workflow_id = w.id)
FROM workflow w
WHERE w.id = ANY(%(ids)s)
ON CONFLICT (workflow_id) DO NOTHING

-- name: delete_history
DELETE FROM workflow_history WHERE workflow_id = ANY(%(ids)s)

-- name: delete_workflow_gates
DELETE FROM gate WHERE workflow_id = ANY(%(ids)s)

-- name: delete_job_gates
DELETE FROM gate g USING job j WHERE g.job_id = j.id AND j.workflow_id = ANY(%(ids)s)

-- name: delete_dependencies
DELETE FROM job_dependency d USING job j
WHERE d.depends_on = j.id AND j.workflow_id = ANY(%(ids)s)

-- name: delete_jobs
DELETE FROM job WHERE workflow_id = ANY(%(ids)s)

-- name: mark_archived
UPDATE workflow SET archived_at = now() WHERE id = ANY(%(ids)s)

-- name: archived_count
SELECT count(*) AS n FROM workflow WHERE archived_at IS NOT NULL

-- name: prune_events
-- Published domain events older than the retention, among the oldest `batch` rows (seq order is
-- time order), so a pass reads at most `batch` rows whatever the table holds. An unpublished
-- one is kept until the publisher has sent it.
DELETE FROM domain_event
WHERE seq IN (
    SELECT seq FROM (
        SELECT seq, occurred_at, published_at FROM domain_event ORDER BY seq LIMIT %(batch)s
    ) oldest
    WHERE published_at IS NOT NULL
      AND occurred_at < now() - make_interval(secs => %(retention_s)s)
)
