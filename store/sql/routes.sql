-- Project routes: which projects have dedicated queues (migrations/0010_project_routes.sql).
-- Every change fires project_route_notify, which notifies vibey_project_routes.

-- name: dedicate
-- A new route, or nothing when the project has one already; created tells which.
INSERT INTO project_route (project_id, dedicated_by)
VALUES (%(project_id)s, %(by)s)
ON CONFLICT (project_id) DO NOTHING
RETURNING project_id

-- name: undedicate
DELETE FROM project_route WHERE project_id = %(project_id)s RETURNING project_id

-- name: routes
SELECT project_id, dedicated_at, dedicated_by FROM project_route ORDER BY project_id

-- name: resend_project
-- After a project's route changed, its claimable pointers are sent again at once (same
-- generation: the copies already on the old route are harmless duplicates), so they need not
-- wait for the lost-dispatch sweep. Rows with an unsent outbox row are the relay's already.
WITH moved AS (
    SELECT j.id, j.project_id, j.dispatch_seq, j.kind, j.run_after
    FROM job j
    WHERE j.project_id = %(project_id)s
      AND j.state IN ('ready', 'awaiting_capacity')
      AND j.dispatch_seq > 0
      AND NOT EXISTS (SELECT 1 FROM job_outbox o WHERE o.job_id = j.id AND o.sent_at IS NULL)
    ORDER BY j.run_after, j.id
    LIMIT %(limit)s
)
INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before)
SELECT 'dispatch:' || m.id || ':' || m.dispatch_seq || ':route:'
           || floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
       m.id, m.project_id, m.dispatch_seq, m.kind, m.run_after
FROM moved m
ON CONFLICT (key) DO NOTHING
RETURNING id
