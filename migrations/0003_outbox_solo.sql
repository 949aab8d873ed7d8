-- A pointer for a job whose last attempt died with its process (its lease expired) is marked
-- solo: a worker runs it with nothing else in flight in that process. A job that kills its
-- process then dies alone and is charged alone; the jobs that merely ran beside it the first
-- time run again alone and succeed, instead of dying with it until their attempts are spent.
ALTER TABLE job_outbox ADD COLUMN solo boolean NOT NULL DEFAULT false;
