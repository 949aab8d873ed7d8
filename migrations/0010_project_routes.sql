-- Which projects have dedicated queues: one truth every publisher reads (the outbox relay in
-- every worker, the CLI's client, the reconciler), instead of each process's own settings.
-- A row is written when a dedicated worker (`vibey worker --project P`) starts or by
-- `vibey project dedicate P`, and deleted by `vibey project undedicate P`. Every change
-- notifies vibey_project_routes (payload: the project id) so cached routers refresh at once.
-- Keep store/models_routes.py in step (the drift test).
CREATE TABLE project_route (
    project_id text PRIMARY KEY,
    dedicated_at timestamptz NOT NULL DEFAULT now(),
    dedicated_by text NOT NULL,
    CONSTRAINT project_route_project_id CHECK (project_id <> '')
);

CREATE FUNCTION project_route_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vibey_project_routes', COALESCE(NEW.project_id, OLD.project_id));
    RETURN NULL;
END
$$;

CREATE TRIGGER project_route_notify AFTER INSERT OR UPDATE OR DELETE ON project_route
    FOR EACH ROW EXECUTE FUNCTION project_route_changed();

-- A dispatch pointer carries its job's priority (published as the AMQP message priority on
-- queues that honour one) and its workflow (the message's correlation_id). Filled from the job
-- row by a trigger, so every statement that writes an outbox row keeps its column list.
ALTER TABLE job_outbox ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE job_outbox ADD COLUMN workflow_id uuid;

CREATE FUNCTION job_outbox_pointer_fields() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT j.priority, j.workflow_id INTO NEW.priority, NEW.workflow_id
    FROM job j WHERE j.id = NEW.job_id;
    NEW.priority := COALESCE(NEW.priority, 0);
    RETURN NEW;
END
$$;

CREATE TRIGGER job_outbox_pointer_fields BEFORE INSERT ON job_outbox
    FOR EACH ROW EXECUTE FUNCTION job_outbox_pointer_fields();
