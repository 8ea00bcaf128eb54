-- dashboards.orders' time_in_state: the time since the order's state last changed. 013's view
-- took now() - updated_at, which every event of the order moves, the notifications and
-- consumption answers recorded on it too (they change no state): an order stuck in `verified` for
-- days left support's "paid but not delivered" list (docs/dashboards.md) for an hour whenever
-- Apple's CONSUMPTION_REQUEST or another notification about it came. The time is the event's own,
-- as the reports date it (an imported event's when it happened). Otherwise 013's view.
CREATE OR REPLACE VIEW dashboards.orders AS
    SELECT order_id, user_id, product_id, quantity, price, currency, state, transaction_id,
           created_at, updated_at, now() - created_at AS age,
           now() - coalesce((SELECT public.event_time(e.recorded_at, e.metadata) FROM public.events e
                              WHERE e.stream_id = 'order-' || orders.order_id
                                AND e.type NOT IN ('notification-received', 'consumption-answer')
                              ORDER BY e.stream_version DESC LIMIT 1), updated_at) AS time_in_state,
           (SELECT t.environment FROM public.apple_transactions t WHERE t.transaction_id = orders.transaction_id) AS environment,
           bundle_id
      FROM public.orders;
