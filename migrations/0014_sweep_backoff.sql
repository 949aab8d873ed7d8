-- The lost-dispatch sweep backs off per job. A pointer that waits behind a backlog is not lost,
-- only late; resending it every redispatch_after multiplied the backlog it waited behind (a
-- congestion collapse under load). job.sweeps counts the resends of the job's current wait: the
-- sweep resends after redispatch_after x 2^min(sweeps, 3), and a claim starts the count again.
-- Keep store/models.py in step (tests/integration/test_migrations.py).
ALTER TABLE job ADD COLUMN sweeps integer NOT NULL DEFAULT 0;
