-- The idempotent consumer (store/event_inbox.py).

-- name: consume
INSERT INTO event_consumed (consumer, event_id) VALUES (%(consumer)s, %(event_id)s)
ON CONFLICT DO NOTHING
RETURNING event_id

-- name: seen
SELECT 1 AS seen FROM event_consumed WHERE consumer = %(consumer)s AND event_id = %(event_id)s

-- name: payload
SELECT payload FROM domain_event WHERE event_id = %(event_id)s

-- name: dead_letter
INSERT INTO dead_letter (queue, routing_key, reason, detail, body, headers, message_id)
VALUES (%(queue)s, %(routing_key)s, %(reason)s, %(detail)s, %(body)s, %(headers)s,
        %(message_id)s)
RETURNING id
