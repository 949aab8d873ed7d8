-- The job queue: jobs, their dependencies, and the gates parked jobs wait behind.
-- Keep store/models.py in step: tests/integration/test_migrations.py fails on any drift.

CREATE TYPE job_state AS ENUM (
    'ready', 'leased', 'succeeded', 'failed', 'awaiting_human', 'awaiting_capacity', 'cancelled'
);

CREATE TYPE failure_class AS ENUM ('capacity', 'engine', 'work', 'vibey');

CREATE TABLE job (
    id uuid PRIMARY KEY,
    project_id text NOT NULL,
    cycle integer NOT NULL DEFAULT 0,
    kind text NOT NULL,
    subject text NOT NULL DEFAULT '',
    idempotency_key text NOT NULL,
    state job_state NOT NULL DEFAULT 'ready',
    priority integer NOT NULL DEFAULT 0,
    payload jsonb NOT NULL DEFAULT '{}'::jsonb,
    result jsonb,
    run_after timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 5,
    lease_ms integer NOT NULL,
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamptz,
    engine_id text,
    last_error text,
    failure_class failure_class,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz,
    -- Idempotent enqueue: one job per logical piece of work, for all time.
    CONSTRAINT job_idempotency UNIQUE (project_id, idempotency_key),
    CONSTRAINT job_attempts_bounds CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT job_lease_positive CHECK (lease_ms > 0),
    -- A leased row carries its whole fence; no other row carries any of it.
    CONSTRAINT job_lease_fence CHECK (
        (state = 'leased') = (lease_owner IS NOT NULL)
        AND (state = 'leased') = (lease_token IS NOT NULL)
        AND (state = 'leased') = (lease_expires_at IS NOT NULL)
    )
);

-- A queue table churns: every claim and settle leaves a dead row version behind, and dead
-- versions slow the claim's index scan. Vacuum it far more eagerly than the default 20%.
ALTER TABLE job SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);

-- The claim's scan: one project's claimable rows in claim order.
CREATE INDEX job_claimable ON job (project_id, priority DESC, run_after, id)
    WHERE state IN ('ready', 'awaiting_capacity');
-- The reaper's scan.
CREATE INDEX job_lease_expiry ON job (lease_expires_at) WHERE state = 'leased';
CREATE INDEX job_project_cycle ON job (project_id, cycle);

CREATE TABLE job_dependency (
    job_id uuid NOT NULL REFERENCES job (id) ON DELETE CASCADE,
    depends_on uuid NOT NULL REFERENCES job (id),
    PRIMARY KEY (job_id, depends_on),
    CONSTRAINT job_dependency_not_self CHECK (job_id <> depends_on)
);

CREATE INDEX job_dependency_depends_on ON job_dependency (depends_on);

CREATE TABLE gate (
    id uuid PRIMARY KEY,
    project_id text NOT NULL,
    job_id uuid REFERENCES job (id),
    kind text NOT NULL,
    prompt text NOT NULL,
    answers jsonb NOT NULL DEFAULT '[]'::jsonb,
    context jsonb NOT NULL DEFAULT '{}'::jsonb,
    opened_at timestamptz NOT NULL DEFAULT now(),
    answer text,
    answered_by text,
    answered_at timestamptz,
    CONSTRAINT gate_answer_complete CHECK (
        (answer IS NULL) = (answered_at IS NULL) AND (answer IS NULL) = (answered_by IS NULL)
    )
);

-- A parked job waits behind at most one open gate.
CREATE UNIQUE INDEX gate_one_open_per_job ON gate (job_id) WHERE answered_at IS NULL;
CREATE INDEX gate_open ON gate (project_id, opened_at) WHERE answered_at IS NULL;
