-- Dispatch on RabbitMQ: a dispatch generation per job and a transactional outbox.
-- dispatch_seq is 0 until the job is first dispatched; every transition that starts a new
-- dispatch episode increments it and writes one job_outbox row in the same transaction. A
-- broker message names (job_id, dispatch_seq); one whose generation is not the row's current
-- one is stale and is dropped unread. The PostgreSQL backend's claim ignores both columns.

ALTER TABLE job ADD COLUMN dispatch_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE job ADD COLUMN dispatched_at timestamptz;
ALTER TABLE job ADD CONSTRAINT job_dispatch_seq_nonneg CHECK (dispatch_seq >= 0);

CREATE TABLE job_outbox (
    id bigserial PRIMARY KEY,
    -- dispatch:<job_id>:<seq>, or dispatch:<job_id>:<seq>:sweep:<n> for a lost-dispatch resend
    key text NOT NULL,
    job_id uuid NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    project_id text NOT NULL,
    dispatch_seq bigint NOT NULL,
    kind text NOT NULL,
    not_before timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_by text,
    claimed_at timestamptz,
    sent_at timestamptz,
    CONSTRAINT job_outbox_key UNIQUE (key),
    CONSTRAINT job_outbox_claim_complete CHECK ((claimed_by IS NULL) = (claimed_at IS NULL))
);

-- The relay's scan: unsent rows, oldest first. Never an id high-water mark: a lower id can
-- commit after a higher one.
CREATE INDEX job_outbox_unsent ON job_outbox (created_at, id) WHERE sent_at IS NULL;
