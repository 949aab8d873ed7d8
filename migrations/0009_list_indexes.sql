-- The list commands page by keyset (WHERE (key) > (last key shown) ORDER BY key LIMIT n, never
-- OFFSET), so each page of `vibey gate list` / `vibey workflow list`, filtered or not, is an
-- index scan that stops after n rows, in either order (store/sql/listings.sql). Keep
-- store/models.py and store/models_ledger.py in step: tests/integration/test_migrations.py.

-- gate list: open gates by age; across projects, within one project, of one kind.
DROP INDEX gate_open;  -- (project_id, opened_at): gate_inbox_by_project pages it with the id
CREATE INDEX gate_inbox ON gate (opened_at, id) WHERE answered_at IS NULL;
CREATE INDEX gate_inbox_by_project ON gate (project_id, opened_at, id) WHERE answered_at IS NULL;
CREATE INDEX gate_inbox_by_kind ON gate (kind, opened_at, id) WHERE answered_at IS NULL;

-- workflow list: by last update; all, of one status, one project, one definition.
DROP INDEX workflow_live;  -- (updated_at) of live workflows: nothing reads by it
CREATE INDEX workflow_by_update ON workflow (updated_at, id);
CREATE INDEX workflow_by_status_update ON workflow (status, updated_at, id);
CREATE INDEX workflow_by_project_update ON workflow (project_id, updated_at, id);
CREATE INDEX workflow_by_definition_update ON workflow (definition, updated_at, id);

-- ledger show --kind: one kind of a project's events in seq order (the open findings too).
CREATE INDEX ledger_event_by_kind ON ledger_event (project_id, kind, seq);
