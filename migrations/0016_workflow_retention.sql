-- Retention for finished workflows: after `[workflow] archive_after_seconds` the reconciler
-- moves a finished workflow's history into one workflow_archive row and deletes its jobs
-- (their dependencies and outbox rows go with them) and its gates, a batch at a time. The
-- workflow row itself stays (one per run), and `vibey workflow history` reads the archived
-- events through workflow_history_all. The ledger is never pruned.
-- Keep store/models.py and store/models_ops.py in step (the drift test).

ALTER TABLE workflow ADD COLUMN archived_at timestamptz;
ALTER TABLE workflow ADD CONSTRAINT workflow_archived_finished
    CHECK (archived_at IS NULL OR finished_at IS NOT NULL);

-- The retention scan: finished workflows not yet archived, oldest first.
CREATE INDEX workflow_to_archive ON workflow (finished_at)
    WHERE finished_at IS NOT NULL AND archived_at IS NULL;

-- A finished workflow's history, events 1..last_seq as one JSON array of
-- {seq, event, commands, recorded_at}, in seq order.
CREATE TABLE workflow_archive (
    workflow_id uuid PRIMARY KEY REFERENCES workflow (id),
    last_seq integer NOT NULL,
    history jsonb NOT NULL,
    jobs integer NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workflow_archive_history_array CHECK (jsonb_typeof(history) = 'array'),
    CONSTRAINT workflow_archive_counts CHECK (last_seq >= 0 AND jobs >= 0)
);

-- History stays append-only: an event may be deleted only once its archive holds it.
CREATE OR REPLACE FUNCTION workflow_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM workflow_archive a
                   WHERE a.workflow_id = OLD.workflow_id AND a.last_seq >= OLD.seq) THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'workflow_history is append-only (DELETE refused)';
    END IF;
    IF NEW.workflow_id <> OLD.workflow_id OR NEW.seq <> OLD.seq OR NEW.event <> OLD.event
       OR NEW.recorded_at <> OLD.recorded_at OR OLD.commands IS NOT NULL THEN
        RAISE EXCEPTION 'workflow_history is append-only (event #% of %)', OLD.seq, OLD.workflow_id;
    END IF;
    RETURN NEW;
END
$$;

-- Every workflow's events, live or archived: what the history reads select from.
CREATE VIEW workflow_history_all AS
SELECT workflow_id, seq, event, commands, recorded_at FROM workflow_history
UNION ALL
SELECT a.workflow_id, (e.value->>'seq')::integer, e.value->'event', e.value->'commands',
       (e.value->>'recorded_at')::timestamptz
FROM workflow_archive a CROSS JOIN LATERAL jsonb_array_elements(a.history) AS e(value);

-- What deleting a batch of jobs looks up per row (the foreign keys' checks and cascades):
-- a job's outbox rows and its gates. Without these each deleted job scans both tables.
CREATE INDEX job_outbox_by_job ON job_outbox (job_id);
CREATE INDEX gate_by_job ON gate (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX gate_by_workflow ON gate (workflow_id) WHERE workflow_id IS NOT NULL;
