-- The W3C trace context a dispatch pointer continues (actors/tracing.py): the traceparent of
-- the span whose transaction wrote the row (a workflow event traced outside a step: a start,
-- a gate answered, a cancel, a gate's deadline), sent with every publish of the pointer, a
-- reconciler's drain included; the lost-dispatch sweep copies it from the job's last row that
-- had one. NULL: written untraced (a traced relay then sends a publish span of its own).
-- Keep store/models.py in step (the drift test).

ALTER TABLE job_outbox ADD COLUMN traceparent text;
