-- Apple's own errorCode where support looks, and a notification backfill that stops repeating a
-- refused request (issue 38). A call waiting for another try keeps the errorCode of its last
-- failure, and dashboards.apple_calls lists, besides the calls still to make, the calls that
-- ended without Apple taking them (refused, too-late, given-up), read from the events that
-- recorded them, with Apple's errorCode. Before, a refused consumption answer left the queue and
-- only its order's stream said why.

ALTER TABLE apple_calls ADD COLUMN last_apple_error_code integer;

-- The ended calls: few, so the view finds them without reading the log.
CREATE INDEX events_apple_calls_ended ON events (global_position)
    WHERE type IN ('consumption-answer', 'apple-transaction-finished', 'apple-account-token-set')
      AND data->>'outcome' <> 'sent';

-- The columns of 007 in their order, then apple_error_code and outcome (empty for a call still
-- to make).
CREATE OR REPLACE VIEW dashboards.apple_calls AS
    SELECT kind, transaction_id, order_id, attempts, last_error, due_at, deadline,
           now() - created_at AS age, deadline - now() AS time_left,
           last_apple_error_code AS apple_error_code, NULL::text AS outcome
      FROM public.apple_calls
    UNION ALL
    SELECT CASE e.type WHEN 'consumption-answer' THEN 'consumption' WHEN 'apple-transaction-finished' THEN 'finish' ELSE 'set-token' END,
           e.data->>'transactionId',
           CASE WHEN e.type = 'consumption-answer' THEN
                    CASE WHEN e.stream_id LIKE 'order-%' THEN substr(e.stream_id, 7) END
                ELSE e.data->>'orderId' END,
           (e.data->>'attempts')::integer, e.data->>'error', NULL::timestamptz, NULL::timestamptz,
           now() - e.recorded_at, NULL::interval,
           (e.data->>'appleErrorCode')::integer, e.data->>'outcome'
      FROM public.events e
     WHERE e.type IN ('consumption-answer', 'apple-transaction-finished', 'apple-account-token-set')
       AND e.data->>'outcome' <> 'sent';

-- The notification backfill's request that Apple refused (issue 38): kept for support, never
-- resumed, so the next run asks afresh instead of repeating a request that can only fail.
ALTER TABLE apple_notification_backfill
    ADD COLUMN abandoned_at      timestamptz,
    ADD COLUMN abandoned_because text;
