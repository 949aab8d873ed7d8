-- Domain events (store/events.py): written in the transaction of the change they report, read
-- by `vibey events tail`, drained to RabbitMQ by the event publisher.

-- name: insert_events
-- One row per draft; the tenant is the project's (none recorded: 'default'). %(events)s is
-- one JSON array of {event_id, event_type, payload}, in draft order (store.events.drafted):
-- one parameter, where three arrays cost the client a typed array's adaptation each.
INSERT INTO domain_event (
    event_id, event_type, tenant_id, project_id, correlation_id, causation_id, payload
)
SELECT (e.doc ->> 'event_id')::uuid, e.doc ->> 'event_type',
       COALESCE((SELECT tenant_id FROM project_tenant WHERE project_id = %(project_id)s), 'default'),
       %(project_id)s, %(correlation_id)s, %(causation_id)s, e.doc -> 'payload'
FROM jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e (doc, n)
ORDER BY e.n

-- name: claim_unpublished
-- The publisher's batch, held until it marks them (another publisher skips them).
SELECT * FROM domain_event
WHERE published_at IS NULL
ORDER BY seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: mark_published
UPDATE domain_event SET published_at = now() WHERE seq = ANY(%(seqs)s) AND published_at IS NULL

-- name: recent_events
-- The newest events after a seq, filtered; `vibey events tail` pages forward from them.
SELECT * FROM (
    SELECT * FROM domain_event
    WHERE seq > %(after)s
      AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
      AND (%(project)s::text IS NULL OR project_id = %(project)s)
      AND (%(type)s::text IS NULL OR event_type = %(type)s OR event_type LIKE %(type)s || '.%%')
    ORDER BY seq DESC
    LIMIT %(limit)s
) newest
ORDER BY seq

-- name: events_after
SELECT * FROM domain_event
WHERE seq > %(after)s
  AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
  AND (%(project)s::text IS NULL OR project_id = %(project)s)
  AND (%(type)s::text IS NULL OR event_type = %(type)s OR event_type LIKE %(type)s || '.%%')
ORDER BY seq
LIMIT %(limit)s

-- name: event_payload
SELECT payload FROM domain_event WHERE event_id = %(event_id)s

-- name: set_tenant
INSERT INTO project_tenant (project_id, tenant_id) VALUES (%(project_id)s, %(tenant_id)s)
ON CONFLICT (project_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id

-- name: tenant_of
SELECT COALESCE((SELECT tenant_id FROM project_tenant WHERE project_id = %(project_id)s), 'default')
    AS tenant_id
