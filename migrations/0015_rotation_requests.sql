-- `vibey engine rotate <project>`: an operator's request that the project's next engine-driven
-- attempt rotate away from the engine the project last ran on (seed 004's operator-request
-- boundary; never mid-turn). One open request per project: asking again replaces it; the
-- attempt that honours it deletes it. Keep store/models_engines.py in step
-- (tests/integration/test_migrations.py).
CREATE TABLE rotation_request (
    project_id text PRIMARY KEY,
    away_from text,
    requested_by text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
