-- Whether a job's previous attempt ended with its lease expiring (its worker died or stalled):
-- the step runner runs such an attempt solo. Set by the reaper and by a takeover of an expired
-- lease; cleared by every other settle. Was read from the prose of last_error.
-- Keep store/models.py in step: tests/integration/test_migrations.py fails on any drift.
ALTER TABLE job ADD COLUMN lease_expired boolean NOT NULL DEFAULT false;
UPDATE job SET lease_expired = true WHERE last_error LIKE 'lease expired%';
