-- Webhook deliveries and their attempts (store/webhooks.py).

-- name: add_delivery
INSERT INTO webhook_delivery (webhook, event_id, event_type, url, body)
VALUES (%(webhook)s, %(event_id)s, %(event_type)s, %(url)s, %(body)s)
ON CONFLICT (webhook, event_id) DO NOTHING

-- name: claim_due
-- A webhook's due deliveries, pushed past the attempt's timeout so no other deliverer takes
-- them meanwhile (a deliverer that dies mid-attempt leaves them due again after it).
WITH due AS (
    SELECT id FROM webhook_delivery
    WHERE state = 'pending' AND webhook = %(webhook)s AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE webhook_delivery d
SET next_attempt_at = now() + make_interval(secs => %(hold_s)s), attempts = d.attempts + 1
FROM due WHERE d.id = due.id
RETURNING d.id, d.webhook, d.event_id, d.event_type, d.url, d.body, d.attempts

-- name: record_attempt
INSERT INTO webhook_attempt (delivery_id, attempt, status_code, error, duration_ms)
VALUES (%(delivery_id)s, %(attempt)s, %(status_code)s, %(error)s, %(duration_ms)s)
ON CONFLICT (delivery_id, attempt) DO NOTHING

-- name: delivered
UPDATE webhook_delivery SET state = 'delivered', finished_at = now() WHERE id = %(id)s

-- name: retry_later
UPDATE webhook_delivery
SET next_attempt_at = now() + make_interval(secs => %(delay_s)s)
WHERE id = %(id)s

-- name: given_up
UPDATE webhook_delivery SET state = 'failed', finished_at = now() WHERE id = %(id)s

-- name: deliveries
SELECT d.*, (SELECT count(*) FROM webhook_attempt a WHERE a.delivery_id = d.id) AS recorded
FROM webhook_delivery d
WHERE %(webhook)s::text IS NULL OR d.webhook = %(webhook)s
ORDER BY d.id

-- name: attempts
SELECT a.* FROM webhook_attempt a JOIN webhook_delivery d ON d.id = a.delivery_id
WHERE %(webhook)s::text IS NULL OR d.webhook = %(webhook)s
ORDER BY a.delivery_id, a.attempt
