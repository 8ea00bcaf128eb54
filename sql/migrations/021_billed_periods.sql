-- Billed periods in the finance view (issue 40; docs/reconciliation.md, "Subscriptions"): every
-- billed period counts in its day and currency, with a `kind` column, `purchase`,
-- `subscription-start` or `subscription-renewal`.
--
-- A subscription's first period is paid by the order its start transaction verified: that
-- order's row is its money (kind `subscription-start`), so the start period is not counted a
-- second time. Every later period pays no order and has rows of its own (kind
-- `subscription-renewal`, state `billed` or `refunded`, `orders` counting periods), dated by its
-- purchase date, its amount Apple's price of the period and its refunded amount the share
-- `refund_share` gives its latest `subscription-period-refunded` (the rule orders follow). A
-- family member's shared subscription is never revenue: none of its periods counts. Readers of
-- the view get no right on the tables: the kind is joined here, not read through a function,
-- which would read the table with the reader's rights.
CREATE OR REPLACE VIEW dashboards.daily_orders AS
    SELECT (o.created_at AT TIME ZONE 'UTC')::date AS day, o.product_id, o.state, count(*) AS orders,
           sum(o.price * o.quantity) AS amount, o.currency,
           trim_scale(sum(o.price * o.quantity * coalesce(r.share, 0))) AS refunded_amount,
           oe.environment, o.bundle_id,
           coalesce(k.kind, 'purchase') AS kind
      FROM public.orders o
      JOIN public.order_environments oe ON oe.order_id = o.order_id
      LEFT JOIN public.subscription_periods k ON k.transaction_id = o.transaction_id
      LEFT JOIN LATERAL (
            SELECT public.refund_share(e.data) AS share
              FROM public.events e
             WHERE o.state = 'refunded' AND e.stream_id = 'order-' || o.order_id AND e.type = 'refunded'
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     GROUP BY 1, 2, 3, o.currency, oe.environment, o.bundle_id, k.kind
    UNION ALL
    SELECT (p.purchase_date AT TIME ZONE 'UTC')::date, p.product_id,
           CASE WHEN p.refunded_at IS NULL THEN 'billed' ELSE 'refunded' END, count(*),
           sum(p.price), p.currency, trim_scale(sum(p.price * coalesce(r.share, 0))),
           s.environment, s.bundle_id, p.kind
      FROM public.subscription_periods p
      JOIN public.subscriptions s ON s.original_transaction_id = p.original_transaction_id
      LEFT JOIN LATERAL (
            SELECT public.refund_share(e.data) AS share
              FROM public.events e
             WHERE p.refunded_at IS NOT NULL AND e.stream_id = 'subscription-' || p.original_transaction_id
               AND e.type = 'subscription-period-refunded' AND e.data->>'periodKey' = p.period_key
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     WHERE p.kind = 'subscription-renewal' AND NOT s.family_shared
     GROUP BY 1, 2, 3, p.currency, s.environment, s.bundle_id, p.kind;
