-- Engine health: descriptors, doctor passes, capacity and circuits, rotation's weights.
-- See store/engine_health.py and migrations/0006_engine_health.sql.

-- name: register
-- What an engine is (from its descriptor and the doctor's install check); capacity, circuit and
-- rotation are left as they are.
INSERT INTO engine_health (engine_id, installed, local, weight, capabilities)
VALUES (%(engine_id)s, %(installed)s, %(local)s, %(weight)s, %(capabilities)s)
ON CONFLICT (engine_id) DO UPDATE
SET installed = EXCLUDED.installed, local = EXCLUDED.local, weight = EXCLUDED.weight,
    capabilities = EXCLUDED.capabilities, updated_at = now()
RETURNING *

-- name: ensure
-- An engine heard of before it was registered gets a row that rotation never picks (not
-- installed, never authenticated).
INSERT INTO engine_health (engine_id) VALUES (%(engine_id)s)
ON CONFLICT (engine_id) DO NOTHING

-- name: lock_one
SELECT * FROM engine_health WHERE engine_id = %(engine_id)s FOR UPDATE

-- name: lock_all
-- Selections serialise on the engine rows, always locked in engine_id order.
SELECT * FROM engine_health ORDER BY engine_id FOR UPDATE

-- name: get_one
SELECT * FROM engine_health WHERE engine_id = %(engine_id)s

-- name: get_all
SELECT * FROM engine_health ORDER BY engine_id

-- name: save_doctor
UPDATE engine_health
SET last_doctor_at = %(at)s, authenticated_at = CASE WHEN %(passed)s THEN %(at)s END,
    updated_at = now()
WHERE engine_id = %(engine_id)s

-- name: save_circuit
UPDATE engine_health
SET capacity_state = %(capacity_state)s, resets_at = %(resets_at)s,
    capacity_detail = %(capacity_detail)s, circuit_state = %(circuit_state)s,
    consecutive_failures = %(consecutive_failures)s, opened_at = %(opened_at)s,
    probes = %(probes)s, probe_kind = %(probe_kind)s, probe_at = %(probe_at)s,
    updated_at = now()
WHERE engine_id = %(engine_id)s
RETURNING *

-- name: save_rotation
-- The current weights of the set a selection was made over; every other engine's is NULL.
UPDATE engine_health AS e
SET rotation_weight = s.weight
FROM engine_health AS x
LEFT JOIN unnest(%(engine_ids)s::text[], %(weights)s::integer[]) AS s (engine_id, weight)
    ON s.engine_id = x.engine_id
WHERE e.engine_id = x.engine_id AND e.rotation_weight IS DISTINCT FROM s.weight

-- name: request_rotation
-- An operator's rotation request for a project, away from the engine its latest engine-driven
-- job ran on (NULL when none has run yet); asking again replaces the open request.
INSERT INTO rotation_request (project_id, away_from, requested_by)
VALUES (
    %(project_id)s,
    (SELECT engine_id FROM job
     WHERE project_id = %(project_id)s AND engine_id IS NOT NULL
     ORDER BY updated_at DESC LIMIT 1),
    %(by)s)
ON CONFLICT (project_id) DO UPDATE
SET away_from = EXCLUDED.away_from, requested_by = EXCLUDED.requested_by,
    requested_at = now()
RETURNING project_id, away_from, requested_by, requested_at

-- name: take_rotation
-- The project's open rotation request, taken (deleted) by the attempt that honours it.
DELETE FROM rotation_request WHERE project_id = %(project_id)s
RETURNING project_id, away_from, requested_by, requested_at
