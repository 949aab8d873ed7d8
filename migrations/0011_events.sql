-- Domain events, their consumers, webhooks, tenants, and gates with deadlines.
-- Keep store/models_events.py (and GateRow in store/models.py) in step:
-- tests/integration/test_migrations.py fails on any drift.

-- A project belongs to a tenant; a project without a row belongs to 'default'.
CREATE TABLE project_tenant (
    project_id text PRIMARY KEY,
    tenant_id text NOT NULL DEFAULT 'default',
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT project_tenant_name CHECK (tenant_id ~ '^[a-z0-9][a-z0-9_-]*$')
);

-- The record of every domain event (workflows/events.py), written in the transaction of the
-- change it reports, and the outbox the event publisher drains to the vibey.events exchange:
-- published_at is NULL until the broker confirmed it. RabbitMQ is never the record.
CREATE TABLE domain_event (
    seq bigserial PRIMARY KEY,
    event_id uuid NOT NULL,
    event_type text NOT NULL,
    version integer NOT NULL DEFAULT 1,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    tenant_id text NOT NULL,
    project_id text NOT NULL,
    correlation_id text,
    causation_id text,
    payload jsonb NOT NULL,
    published_at timestamptz,
    CONSTRAINT domain_event_id UNIQUE (event_id),
    CONSTRAINT domain_event_payload_object CHECK (jsonb_typeof(payload) = 'object')
);
CREATE INDEX domain_event_unpublished ON domain_event (seq) WHERE published_at IS NULL;
CREATE INDEX domain_event_by_project ON domain_event (project_id, seq);
CREATE INDEX domain_event_by_type ON domain_event (event_type, seq);

-- Wake the publisher at commit (a statement trigger: one notification per transaction).
CREATE FUNCTION domain_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vibey_domain_event', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER domain_event_notify AFTER INSERT ON domain_event
    FOR EACH STATEMENT EXECUTE FUNCTION domain_event_notify();

-- The idempotent consumer's inbox: an event's effect commits with its row, once per consumer.
CREATE TABLE event_consumed (
    consumer text NOT NULL,
    event_id uuid NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Webhooks: one delivery per (webhook, event), every attempt recorded.
CREATE TABLE webhook_delivery (
    id bigserial PRIMARY KEY,
    webhook text NOT NULL,
    event_id uuid NOT NULL,
    event_type text NOT NULL,
    url text NOT NULL,
    body bytea NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CONSTRAINT webhook_delivery_once UNIQUE (webhook, event_id),
    CONSTRAINT webhook_delivery_state CHECK (state IN ('pending', 'delivered', 'failed')),
    CONSTRAINT webhook_delivery_finished CHECK ((state = 'pending') = (finished_at IS NULL))
);
CREATE INDEX webhook_delivery_due ON webhook_delivery (next_attempt_at) WHERE state = 'pending';

CREATE TABLE webhook_attempt (
    id bigserial PRIMARY KEY,
    delivery_id bigint NOT NULL REFERENCES webhook_delivery (id) ON DELETE CASCADE,
    attempt integer NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    status_code integer,
    error text,
    duration_ms integer NOT NULL,
    CONSTRAINT webhook_attempt_once UNIQUE (delivery_id, attempt)
);

-- Gates with a deadline: what happens when it passes, the default answer, reminder ages (in
-- seconds after opening) and how many were sent; who answered (a person, the default, the
-- workflow's wind-down).
ALTER TABLE gate ADD COLUMN deadline_at timestamptz;
ALTER TABLE gate ADD COLUMN on_deadline text;
ALTER TABLE gate ADD COLUMN default_answer text;
ALTER TABLE gate ADD COLUMN reminders jsonb NOT NULL DEFAULT '[]'::jsonb;
ALTER TABLE gate ADD COLUMN reminded integer NOT NULL DEFAULT 0;
ALTER TABLE gate ADD COLUMN escalated_at timestamptz;
ALTER TABLE gate ADD COLUMN answer_source text;
ALTER TABLE gate ADD CONSTRAINT gate_on_deadline
    CHECK (on_deadline IS NULL OR on_deadline IN ('answer', 'escalate', 'fail'));
ALTER TABLE gate ADD CONSTRAINT gate_deadline_complete
    CHECK ((deadline_at IS NULL) = (on_deadline IS NULL));
ALTER TABLE gate ADD CONSTRAINT gate_default_answer
    CHECK (on_deadline IS DISTINCT FROM 'answer' OR default_answer IS NOT NULL);
ALTER TABLE gate ADD CONSTRAINT gate_answer_source
    CHECK (answer_source IS NULL OR answer_source IN ('person', 'default', 'closed'));
CREATE INDEX gate_deadline_due ON gate (deadline_at)
    WHERE answered_at IS NULL AND deadline_at IS NOT NULL AND escalated_at IS NULL;
CREATE INDEX gate_reminder_due ON gate (opened_at)
    WHERE answered_at IS NULL AND jsonb_array_length(reminders) > reminded;
