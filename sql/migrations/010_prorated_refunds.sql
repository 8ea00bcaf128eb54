-- Refunds as Apple states them: a `refunded` event carries Apple's `revocationType` and
-- `revocationPercentage` (thousandths of a percent). A prorated refund takes back its share of the
-- order's amount, a full one (or one stored before, whose `revocationType` held the notification's
-- type, `REFUND` or `REVOKE`) the whole, a family revocation nothing. The reconciliation report
-- (LedgerStore's ReconciliationReport) states the same rule in its query.

-- Orders created per day (UTC), product and current state, as before, and what Apple took back of
-- the refunded ones: the share of price × quantity its latest `refunded` event says.
CREATE OR REPLACE VIEW dashboards.daily_orders AS
    SELECT (o.created_at AT TIME ZONE 'UTC')::date AS day, o.product_id, o.state, count(*) AS orders,
           sum(o.price * o.quantity) AS amount, o.currency,
           trim_scale(sum(o.price * o.quantity * coalesce(r.share, 0))) AS refunded_amount
      FROM public.orders o
      LEFT JOIN LATERAL (
            SELECT CASE e.data->>'revocationType'
                        WHEN 'REFUND_PRORATED' THEN
                            CASE WHEN jsonb_typeof(e.data->'revocationPercentage') = 'number'
                                 THEN least(greatest((e.data->>'revocationPercentage')::numeric, 0), 100000) / 100000
                                 ELSE 1 END
                        WHEN 'FAMILY_REVOKE' THEN 0
                        ELSE 1 END AS share
              FROM public.events e
             WHERE o.state = 'refunded' AND e.stream_id = 'order-' || o.order_id AND e.type = 'refunded'
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     GROUP BY 1, 2, 3, o.currency;
