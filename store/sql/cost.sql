-- What a workflow has cost, from the ledger's BudgetSpent events of it (the source of truth),
-- and where it stands against its budget (store/cost.py). A payload value that is not a JSON
-- number counts as nothing; dollars an engine did not report stay NULL (no price), never 0.
-- A step's phase and name come from its job; a finished workflow's jobs are deleted once it
-- is archived, and its spend is then still counted, under an unknown phase and step.

-- name: workflow_cost
-- One row per engine, per phase, per (phase, step), and the total: GROUPING says which.
WITH spent AS (
    SELECT e.payload->>'engine' AS engine,
           j.payload->'input'->>'phase' AS phase,
           j.step AS step,
           CASE WHEN jsonb_typeof(e.payload->'turns') = 'number'
                THEN (e.payload->>'turns')::numeric ELSE 0 END AS turns,
           CASE WHEN jsonb_typeof(e.payload->'input_tokens') = 'number'
                THEN (e.payload->>'input_tokens')::numeric ELSE 0 END AS input_tokens,
           CASE WHEN jsonb_typeof(e.payload->'output_tokens') = 'number'
                THEN (e.payload->>'output_tokens')::numeric ELSE 0 END AS output_tokens,
           CASE WHEN jsonb_typeof(e.payload->'dollars') = 'number'
                THEN (e.payload->>'dollars')::numeric END AS dollars
    FROM ledger_event e
    LEFT JOIN job j ON j.id = e.job_id
    WHERE e.workflow_id = %(workflow_id)s AND e.kind = 'BudgetSpent'
)
SELECT engine, phase, step,
       GROUPING(engine) = 0 AS by_engine,
       GROUPING(phase) = 0 AND GROUPING(step) = 1 AS by_phase,
       GROUPING(step) = 0 AS by_step,
       count(*) AS events,
       sum(turns) AS turns,
       sum(input_tokens) AS input_tokens,
       sum(output_tokens) AS output_tokens,
       sum(dollars) AS dollars,
       count(dollars) AS priced
FROM spent
GROUP BY GROUPING SETS ((engine), (phase), (phase, step), ())
ORDER BY GROUPING(engine), GROUPING(phase), GROUPING(step), phase, step, engine

-- name: budget_of_workflow
-- The workflow's (by its id, or the workflow of %(job_id)s) budget (its input's), what its BudgetSpent events add up to, what the
-- answers to its budget_exhausted gates granted, and its open budget gate if any. The sums
-- run only for a workflow with a budget (a one-time filter: no scan for one without).
SELECT w.id AS workflow_id,
       w.input->'budget' AS budget,
       s.dollars, s.tokens, g.granted_dollars, g.granted_tokens, g.open_gate
FROM workflow w
LEFT JOIN LATERAL (
    SELECT coalesce(sum(CASE WHEN jsonb_typeof(e.payload->'dollars') = 'number'
                             THEN (e.payload->>'dollars')::numeric END), 0) AS dollars,
           coalesce(sum(CASE WHEN jsonb_typeof(e.payload->'input_tokens') = 'number'
                             THEN (e.payload->>'input_tokens')::numeric ELSE 0 END
                        + CASE WHEN jsonb_typeof(e.payload->'output_tokens') = 'number'
                               THEN (e.payload->>'output_tokens')::numeric ELSE 0 END), 0)
               AS tokens
    FROM ledger_event e
    WHERE w.input ? 'budget' AND e.workflow_id = w.id AND e.kind = 'BudgetSpent'
) s ON true
LEFT JOIN LATERAL (
    SELECT coalesce(sum(split_part(answer, ' ', 1)::numeric)
                    FILTER (WHERE answer ~ '^[0-9.]+ dollars$'), 0) AS granted_dollars,
           coalesce(sum(split_part(answer, ' ', 1)::numeric)
                    FILTER (WHERE answer ~ '^[0-9]+ tokens$'), 0) AS granted_tokens,
           (array_agg(id ORDER BY opened_at) FILTER (WHERE answered_at IS NULL))[1] AS open_gate
    FROM gate
    WHERE w.input ? 'budget' AND workflow_id = w.id AND kind = 'budget_exhausted'
) g ON true
WHERE w.id = coalesce(%(workflow_id)s::uuid,
                      (SELECT j.workflow_id FROM job j WHERE j.id = %(job_id)s::uuid))
