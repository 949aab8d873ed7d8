-- The PostgreSQL backend's drive loop (`vibey worker` on backend = "postgres") and the
-- KEDA postgresql trigger that scales it. Both select with the same arms:
--   claimable: state ready/awaiting_capacity, due (run_after <= now()), every dependency
--              succeeded; the claim takes these, FOR UPDATE SKIP LOCKED
--   lane:      %(kinds)s is the lane's kinds; %(exclude)s true means every kind but those
--              (the interactive lane is "not a BUILD kind"), NULL kinds means any kind
--   projects:  %(projects)s NULL means every project, else only those
-- The trigger counts the claimable rows plus the leased ones (running work keeps its pods).

-- name: claim_next
WITH candidate AS (
    SELECT j.id
    FROM job j
    WHERE j.state IN ('ready', 'awaiting_capacity')
      AND j.run_after <= now()
      AND (%(projects)s::text[] IS NULL OR j.project_id = ANY (%(projects)s::text[]))
      AND (%(kinds)s::text[] IS NULL OR (j.kind = ANY (%(kinds)s::text[])) <> %(exclude)s::boolean)
      AND NOT EXISTS (
          SELECT 1
          FROM job_dependency d
          JOIN job p ON p.id = d.depends_on
          WHERE d.job_id = j.id AND p.state <> 'succeeded'
      )
    ORDER BY j.priority DESC, j.run_after, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE job
SET state = 'leased',
    attempts = job.attempts + 1,
    lease_owner = %(owner)s,
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + job.lease_ms * interval '1 millisecond',
    updated_at = now()
FROM candidate
WHERE job.id = candidate.id
RETURNING job.*

-- name: scaler_count
SELECT count(*)
FROM job j
WHERE (%(projects)s::text[] IS NULL OR j.project_id = ANY (%(projects)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR (j.kind = ANY (%(kinds)s::text[])) <> %(exclude)s::boolean)
  AND (
      j.state = 'leased'
      OR (
          j.state IN ('ready', 'awaiting_capacity')
          AND j.run_after <= now()
          AND NOT EXISTS (
              SELECT 1
              FROM job_dependency d
              JOIN job p ON p.id = d.depends_on
              WHERE d.job_id = j.id AND p.state <> 'succeeded'
          )
      )
  )

-- name: claimable_count
-- The claim's arm alone (what `vibey queue stats` calls a lane's ready rows).
SELECT count(*)
FROM job j
WHERE (%(projects)s::text[] IS NULL OR j.project_id = ANY (%(projects)s::text[]))
  AND (%(kinds)s::text[] IS NULL OR (j.kind = ANY (%(kinds)s::text[])) <> %(exclude)s::boolean)
  AND j.state IN ('ready', 'awaiting_capacity')
  AND j.run_after <= now()
  AND NOT EXISTS (
      SELECT 1
      FROM job_dependency d
      JOIN job p ON p.id = d.depends_on
      WHERE d.job_id = j.id AND p.state <> 'succeeded'
  )
