-- Operations: what the reconcilers report, what the dead-letter queue held, and the index
-- that prunes sent outbox rows. Keep store/models_ops.py in step (the drift test).

-- One row per reconciling process (a worker process or `vibey reconcile`), upserted after
-- every pass: `vibey doctor` and the metrics read the newest `at` (the reconcile heartbeat).
CREATE TABLE reconcile_heartbeat (
    owner text PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    duration_ms integer NOT NULL,
    report jsonb NOT NULL,
    CONSTRAINT reconcile_heartbeat_duration CHECK (duration_ms >= 0),
    CONSTRAINT reconcile_heartbeat_report_object CHECK (jsonb_typeof(report) = 'object')
);

-- A message the dead-letter queue held that names no job vibey can park (a malformed body, a
-- pointer rejected with its reason): kept, never only logged, until an operator removes it.
CREATE TABLE dead_letter (
    id bigserial PRIMARY KEY,
    queue text NOT NULL,
    routing_key text NOT NULL,
    reason text NOT NULL,
    detail text,
    body bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}',
    message_id text,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letter_received ON dead_letter (received_at, id);

-- The pruning scan: sent rows, oldest first.
CREATE INDEX job_outbox_sent ON job_outbox (sent_at) WHERE sent_at IS NOT NULL;
