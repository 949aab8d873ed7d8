-- The list commands' pages (store/listings.py): keyset pagination, filters in SQL.
--
-- A page is `WHERE <filters> AND (key) {cmp} (the last key shown) ORDER BY key {dir} LIMIT n`:
-- {cmp} and {dir} are `>`/ASC (oldest first) or `<`/DESC (newest first), put in by
-- store/listings.py from a fixed pair, never from input. A filter that is not given is a NULL
-- parameter; PostgreSQL plans each statement with its values, so `NULL IS NULL OR ...` folds
-- away and the page is an index scan on the index of the filter given
-- (migrations/0009_list_indexes.sql). Each *_count counts what the filters match, but no
-- further than %(cap)s rows: a count costs at most that many index entries, however many match.

-- name: gate_page
SELECT g.*, now() AS now FROM gate g
WHERE g.answered_at IS NULL
  AND (%(project_id)s::text IS NULL OR g.project_id = %(project_id)s::text)
  AND (%(kind)s::text IS NULL OR g.kind = %(kind)s::text)
  AND (%(older_than)s::interval IS NULL OR g.opened_at <= now() - %(older_than)s::interval)
  AND (%(newer_than)s::interval IS NULL OR g.opened_at > now() - %(newer_than)s::interval)
  AND (%(tenant)s::text IS NULL OR %(tenant)s::text = COALESCE(
       (SELECT t.tenant_id FROM project_tenant t WHERE t.project_id = g.project_id), 'default'))
  AND (%(after_at)s::timestamptz IS NULL
       OR (g.opened_at, g.id) {cmp} (%(after_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY g.opened_at {dir}, g.id {dir}
LIMIT %(limit)s

-- name: gate_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM gate g
    WHERE g.answered_at IS NULL
      AND (%(project_id)s::text IS NULL OR g.project_id = %(project_id)s::text)
      AND (%(kind)s::text IS NULL OR g.kind = %(kind)s::text)
      AND (%(older_than)s::interval IS NULL OR g.opened_at <= now() - %(older_than)s::interval)
      AND (%(newer_than)s::interval IS NULL OR g.opened_at > now() - %(newer_than)s::interval)
      AND (%(tenant)s::text IS NULL OR %(tenant)s::text = COALESCE(
           (SELECT t.tenant_id FROM project_tenant t WHERE t.project_id = g.project_id), 'default'))
    LIMIT %(cap)s
) AS matching

-- name: workflow_page
SELECT w.* FROM workflow w
WHERE (%(status)s::workflow_status IS NULL OR w.status = %(status)s::workflow_status)
  AND (%(project_id)s::text IS NULL OR w.project_id = %(project_id)s::text)
  AND (%(definition)s::text IS NULL OR w.definition = %(definition)s::text)
  AND (%(older_than)s::interval IS NULL OR w.updated_at <= now() - %(older_than)s::interval)
  AND (%(newer_than)s::interval IS NULL OR w.updated_at > now() - %(newer_than)s::interval)
  AND (%(tenant)s::text IS NULL OR %(tenant)s::text = COALESCE(
       (SELECT t.tenant_id FROM project_tenant t WHERE t.project_id = w.project_id), 'default'))
  AND (%(after_at)s::timestamptz IS NULL
       OR (w.updated_at, w.id) {cmp} (%(after_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY w.updated_at {dir}, w.id {dir}
LIMIT %(limit)s

-- name: workflow_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM workflow w
    WHERE (%(status)s::workflow_status IS NULL OR w.status = %(status)s::workflow_status)
      AND (%(project_id)s::text IS NULL OR w.project_id = %(project_id)s::text)
      AND (%(definition)s::text IS NULL OR w.definition = %(definition)s::text)
      AND (%(older_than)s::interval IS NULL OR w.updated_at <= now() - %(older_than)s::interval)
      AND (%(newer_than)s::interval IS NULL OR w.updated_at > now() - %(newer_than)s::interval)
      AND (%(tenant)s::text IS NULL OR %(tenant)s::text = COALESCE(
           (SELECT t.tenant_id FROM project_tenant t WHERE t.project_id = w.project_id), 'default'))
    LIMIT %(cap)s
) AS matching

-- name: history_page
SELECT h.seq, h.event, h.commands, h.recorded_at FROM workflow_history h
WHERE h.workflow_id = %(workflow_id)s
  AND (%(kind)s::text IS NULL OR h.event->>'type' = %(kind)s::text)
  AND (%(after_seq)s::bigint IS NULL OR h.seq {cmp} %(after_seq)s::bigint)
ORDER BY h.seq {dir}
LIMIT %(limit)s

-- name: history_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM workflow_history h
    WHERE h.workflow_id = %(workflow_id)s
      AND (%(kind)s::text IS NULL OR h.event->>'type' = %(kind)s::text)
    LIMIT %(cap)s
) AS matching

-- name: archived_history_page
-- An archived workflow's events (migrations/0016_workflow_retention.sql), paged as above.
SELECT h.seq, h.event, h.commands, h.recorded_at FROM workflow_history_all h
WHERE h.workflow_id = %(workflow_id)s
  AND (%(kind)s::text IS NULL OR h.event->>'type' = %(kind)s::text)
  AND (%(after_seq)s::bigint IS NULL OR h.seq {cmp} %(after_seq)s::bigint)
ORDER BY h.seq {dir}
LIMIT %(limit)s

-- name: archived_history_count
SELECT count(*) AS n FROM (
    SELECT 1 FROM workflow_history_all h
    WHERE h.workflow_id = %(workflow_id)s
      AND (%(kind)s::text IS NULL OR h.event->>'type' = %(kind)s::text)
    LIMIT %(cap)s
) AS matching

-- name: is_archived
SELECT archived_at IS NOT NULL AS archived FROM workflow WHERE id = %(workflow_id)s

-- name: ledger_page
SELECT e.* FROM ledger_event e
WHERE e.project_id = %(project_id)s
  AND (%(kind)s::text IS NULL OR e.kind = %(kind)s::text)
  AND (%(after_seq)s::bigint IS NULL OR e.seq {cmp} %(after_seq)s::bigint)
ORDER BY e.seq {dir}
LIMIT %(limit)s

-- name: ledger_count
-- Without a kind the count is the head (exact, never capped): a project's seqs run
-- 1..last_seq with no gap.
SELECT CASE WHEN %(kind)s::text IS NULL
            THEN (SELECT coalesce(max(last_seq), 0) FROM ledger_head
                  WHERE project_id = %(project_id)s)
            ELSE (SELECT count(*) FROM (
                      SELECT 1 FROM ledger_event
                      WHERE project_id = %(project_id)s AND kind = %(kind)s::text
                      LIMIT %(cap)s) AS matching)
       END AS n,
       %(kind)s::text IS NULL AS exact
