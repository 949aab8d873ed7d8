-- The ledger: each project's append-only event log, with a gapless per-project seq.
-- Keep store/models_ledger.py in step: tests/integration/test_migrations.py fails on any drift.
--
-- seq is assigned in the writing transaction from ledger_head: the appender's
--   INSERT INTO ledger_head ... ON CONFLICT (project_id) DO UPDATE
--       SET last_seq = ledger_head.last_seq + <n> RETURNING last_seq
-- locks the project's head row until commit, so appenders of one project serialise and a
-- rolled-back transaction takes its seqs with it (store/sql/ledger.sql, append_*).
--
-- The database refuses UPDATE, DELETE and TRUNCATE on ledger_event: a trigger raises for
-- everyone (the table's owner included), and the privileges are revoked from PUBLIC. Grant the
-- application role SELECT, INSERT on ledger_event and SELECT, INSERT, UPDATE on ledger_head.

CREATE TABLE ledger_head (
    project_id text PRIMARY KEY,
    last_seq bigint NOT NULL,
    CONSTRAINT ledger_head_last_seq_positive CHECK (last_seq >= 1)
);

CREATE TABLE ledger_event (
    project_id text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    -- sha256 hex of the canonical JSON of {"kind", "payload"} (workflows/ledger.py)
    digest text NOT NULL,
    -- what caused the event (typically a job id) and what it belongs to (typically a
    -- workflow id); no foreign keys: the ledger is evidence, and names what it likes
    causation_id text,
    correlation_id text,
    job_id uuid,
    workflow_id uuid,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, seq),
    CONSTRAINT ledger_event_seq_positive CHECK (seq >= 1),
    CONSTRAINT ledger_event_digest_sha256 CHECK (digest ~ '^[0-9a-f]{64}$'),
    CONSTRAINT ledger_event_kind_name CHECK (kind ~ '^[A-Z][A-Za-z0-9]{0,99}$'),
    CONSTRAINT ledger_event_payload_object CHECK (jsonb_typeof(payload) = 'object')
);

CREATE INDEX ledger_event_by_workflow ON ledger_event (workflow_id, seq)
    WHERE workflow_id IS NOT NULL;
CREATE INDEX ledger_event_by_job ON ledger_event (job_id) WHERE job_id IS NOT NULL;

-- Append-only, for every role: no UPDATE, DELETE or TRUNCATE of an event, ever.
CREATE FUNCTION ledger_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_event is append-only (% refused)', TG_OP
        USING HINT = 'the ledger is never changed: append an event that corrects it';
END
$$;

CREATE TRIGGER ledger_event_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON ledger_event
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_event_append_only();

-- A head only moves forward, and is never removed.
CREATE FUNCTION ledger_head_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.project_id = OLD.project_id AND NEW.last_seq > OLD.last_seq THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'ledger_head of % only moves forward (% to % refused)',
            OLD.project_id, OLD.last_seq, NEW.last_seq;
    END IF;
    RAISE EXCEPTION 'ledger_head is never removed (% refused)', TG_OP;
END
$$;

CREATE TRIGGER ledger_head_forward_only BEFORE UPDATE OR DELETE ON ledger_head
    FOR EACH ROW EXECUTE FUNCTION ledger_head_forward_only();
CREATE TRIGGER ledger_head_no_truncate BEFORE TRUNCATE ON ledger_head
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_head_forward_only();

REVOKE UPDATE, DELETE, TRUNCATE ON ledger_event FROM PUBLIC;
REVOKE DELETE, TRUNCATE ON ledger_head FROM PUBLIC;
