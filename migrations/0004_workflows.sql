-- Workflows: an instance row per run of a definition, its append-only history, and the links
-- from jobs (steps) and gates (questions) back to it.
-- Keep store/models.py in step: tests/integration/test_migrations.py fails on any drift.

CREATE TYPE workflow_status AS ENUM ('running', 'blocked', 'completed', 'failed', 'cancelled');

CREATE TABLE workflow (
    id uuid PRIMARY KEY,
    project_id text NOT NULL,
    definition text NOT NULL,
    version integer NOT NULL,
    phase text NOT NULL,
    cycle integer NOT NULL DEFAULT 0,
    status workflow_status NOT NULL DEFAULT 'running',
    completion_mode text,
    reason text,
    input jsonb NOT NULL DEFAULT '{}'::jsonb,
    state jsonb NOT NULL,
    -- history: events 1..last_seq are recorded, 1..applied_seq went through decide()
    last_seq integer NOT NULL DEFAULT 0,
    applied_seq integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CONSTRAINT workflow_seq_order CHECK (0 <= applied_seq AND applied_seq <= last_seq),
    CONSTRAINT workflow_completion_mode CHECK ((status = 'completed') = (completion_mode IS NOT NULL)),
    CONSTRAINT workflow_finished CHECK (
        (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)
    )
);

-- One live workflow per project: a second start finds the first.
CREATE UNIQUE INDEX workflow_one_live_per_project ON workflow (project_id)
    WHERE status IN ('running', 'blocked');
CREATE INDEX workflow_by_project ON workflow (project_id, created_at DESC);
CREATE INDEX workflow_live ON workflow (updated_at) WHERE status IN ('running', 'blocked');

CREATE TABLE workflow_history (
    workflow_id uuid NOT NULL REFERENCES workflow (id),
    seq integer NOT NULL,
    event jsonb NOT NULL,
    -- the commands decide() gave for this event; NULL while the event waits to be applied
    commands jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, seq),
    CONSTRAINT workflow_history_seq_positive CHECK (seq >= 1)
);

-- History is append-only: an event is never changed or removed; its decision is written once.
CREATE FUNCTION workflow_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'workflow_history is append-only (DELETE refused)';
    END IF;
    IF NEW.workflow_id <> OLD.workflow_id OR NEW.seq <> OLD.seq OR NEW.event <> OLD.event
       OR NEW.recorded_at <> OLD.recorded_at OR OLD.commands IS NOT NULL THEN
        RAISE EXCEPTION 'workflow_history is append-only (event #% of %)', OLD.seq, OLD.workflow_id;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER workflow_history_append_only BEFORE UPDATE OR DELETE ON workflow_history
    FOR EACH ROW EXECUTE FUNCTION workflow_history_append_only();

-- A step is a job that names its workflow and its step name, once for all time.
ALTER TABLE job ADD COLUMN workflow_id uuid REFERENCES workflow (id);
ALTER TABLE job ADD COLUMN step text;
ALTER TABLE job ADD CONSTRAINT job_step_of_workflow CHECK ((workflow_id IS NULL) = (step IS NULL));
CREATE UNIQUE INDEX job_workflow_step ON job (workflow_id, step) WHERE workflow_id IS NOT NULL;

-- A workflow's gate is named within its workflow (its answer is a GateAnswered event); a
-- parked job's gate carries the job's workflow for the inbox, and no name.
ALTER TABLE gate ADD COLUMN workflow_id uuid REFERENCES workflow (id);
ALTER TABLE gate ADD COLUMN name text;
ALTER TABLE gate ADD COLUMN schema jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE gate ADD COLUMN evidence jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE gate ADD CONSTRAINT gate_named_in_workflow CHECK (name IS NULL OR workflow_id IS NOT NULL);
ALTER TABLE gate ADD CONSTRAINT gate_owner CHECK (name IS NULL OR job_id IS NULL);
CREATE UNIQUE INDEX gate_workflow_name ON gate (workflow_id, name) WHERE name IS NOT NULL;
CREATE INDEX gate_open_by_workflow ON gate (workflow_id) WHERE answered_at IS NULL;
