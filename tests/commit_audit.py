"""Counting commits where they happen: a trigger inserts a row, in the ack's own transaction,
each time a job becomes succeeded. The row's primary key is the job id, so a second commit of
one job fails loudly instead of being counted twice. Tests install it in their own database."""

COMMIT_AUDIT = """
CREATE TABLE audit_commit (job_id uuid PRIMARY KEY, committed_at timestamptz DEFAULT now());
CREATE FUNCTION audit_count_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_commit (job_id) VALUES (NEW.id);  -- a second commit fails loudly
    RETURN NEW;
END $$;
CREATE TRIGGER audit_count_commit AFTER UPDATE OF state ON job
    FOR EACH ROW WHEN (NEW.state = 'succeeded' AND OLD.state <> 'succeeded')
    EXECUTE FUNCTION audit_count_commit();
"""
