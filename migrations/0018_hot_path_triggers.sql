-- vibey: serves code from 0017
-- A workflow step writes no trigger's work and sends no NOTIFY (issue 21).
--
-- The domain-event publisher polls (actors/event_publisher.py: every publish interval, a
-- tenth of a second by default) instead of being woken by a notification at every commit
-- that wrote an event. A NOTIFY holds PostgreSQL's notification-queue lock from the commit
-- until its WAL flush, so concurrent steps committed one after another instead of in a
-- group. Code from 0017 still runs: its publisher waits for the notification or its
-- interval (a second by default), whichever comes first, so its events go out within it.
DROP TRIGGER domain_event_notify ON domain_event;
DROP FUNCTION domain_event_notify();

-- The outbox statements of the step path (a job's insert, a dependent's release) write the
-- pointer's priority and workflow themselves; the trigger that copies them from the job now
-- runs only for a row written without them (the other statements, and code from 0017), where
-- it does what it always did.
DROP TRIGGER job_outbox_pointer_fields ON job_outbox;
CREATE TRIGGER job_outbox_pointer_fields BEFORE INSERT ON job_outbox
    FOR EACH ROW WHEN (NEW.workflow_id IS NULL AND NEW.priority = 0)
    EXECUTE FUNCTION job_outbox_pointer_fields();
