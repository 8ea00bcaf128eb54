-- A refunded order's refund in dashboards.daily_orders is Apple's latest by revocation date among
-- all the order's refunds: its `refunded` events and the refunds its state did not take, kept on
-- their `notification-received` (a full refund after a prorated one, the order refunded already;
-- not one Apple had reversed before it arrived), as ledger_apple_sales reads them (047). 044's
-- view read the `refunded` events alone, and counted the prorated share of such an order.
-- Otherwise 044's view.
CREATE OR REPLACE VIEW dashboards.daily_orders AS
    SELECT (o.created_at AT TIME ZONE 'UTC')::date AS day, o.product_id, o.state, count(*) AS orders,
           sum(o.price * o.quantity * public.order_billed_share(k.kind, k.price)) AS amount, o.currency,
           trim_scale(sum(o.price * o.quantity * public.order_billed_share(k.kind, k.price) * coalesce(r.share, 0))) AS refunded_amount,
           oe.environment, o.bundle_id,
           coalesce(k.kind, 'purchase') AS kind
      FROM public.orders o
      JOIN public.order_environments oe ON oe.order_id = o.order_id
      LEFT JOIN public.subscription_periods k ON k.transaction_id = o.transaction_id
      LEFT JOIN LATERAL (
            SELECT public.refund_share(x.refund) AS share
              FROM (SELECT e.stream_version, e.recorded_at, CASE e.type WHEN 'refunded' THEN e.data ELSE e.data->'refund' END AS refund
                      FROM public.events e
                     WHERE o.state = 'refunded' AND e.stream_id = 'order-' || o.order_id
                       AND (e.type = 'refunded'
                            OR e.type = 'notification-received' AND e.data ? 'refund'
                               AND NOT coalesce((e.data->>'reversedBefore')::boolean, false))) x
             ORDER BY coalesce((x.refund->>'revocationDate')::timestamptz, x.recorded_at) DESC, x.stream_version
             LIMIT 1) r ON true
     GROUP BY 1, 2, 3, o.currency, oe.environment, o.bundle_id, k.kind
    UNION ALL
    SELECT (p.purchase_date AT TIME ZONE 'UTC')::date, p.product_id,
           CASE WHEN p.refunded_at IS NULL THEN 'billed' ELSE 'refunded' END, count(*),
           sum(CASE WHEN h.order_id IS NOT NULL THEN 0 ELSE p.price END),
           p.currency, trim_scale(sum(CASE WHEN h.refunded THEN 0 ELSE p.price * coalesce(r.share, 0) END)),
           s.environment, s.bundle_id, p.kind
      FROM public.subscription_periods p
      JOIN public.subscriptions s ON s.original_transaction_id = p.original_transaction_id
      -- The order holding the period, if any (its key: one order holds a transaction at most),
      -- and whether it has a `refunded`: the period's refund is then that order's, by the rule
      -- ledger_apple_sales and the reconciliation report apply.
      LEFT JOIN LATERAL (
            SELECT t.order_id,
                   EXISTS (SELECT 1 FROM public.events v WHERE v.stream_id = 'order-' || t.order_id AND v.type = 'refunded') AS refunded
              FROM public.apple_transactions t
             WHERE t.transaction_id = p.transaction_id AND t.order_id IS NOT NULL) h ON true
      LEFT JOIN LATERAL (
            SELECT public.refund_share(e.data) AS share
              FROM public.events e
             WHERE p.refunded_at IS NOT NULL AND e.stream_id = 'subscription-' || p.original_transaction_id
               AND e.type = 'subscription-period-refunded' AND e.data->>'periodKey' = p.period_key
             ORDER BY coalesce((e.data->>'revocationDate')::timestamptz, e.recorded_at) DESC, e.stream_version
             LIMIT 1) r ON true
     WHERE p.kind = 'subscription-renewal' AND NOT s.family_shared
     GROUP BY 1, 2, 3, p.currency, s.environment, s.bundle_id, p.kind;
