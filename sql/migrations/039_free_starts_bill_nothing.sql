-- A subscription started with a free trial (or a free offer) is bought through its order, but
-- Apple billed nothing for its first period: the start's signed `price` is 0. The report and
-- `dashboards.daily_orders` counted the order's price as its revenue (and its refund as money
-- given back), though the first billed period is the renewal after the trial, which counts its
-- own. "Every billed period once" (issue 40): an order paid by a start Apple priced 0 now counts
-- no money. A start without a signed price (a legacy receipt) still counts its order's.

-- The share of an order's price that is money: none for an order paid by a free start, else all.
CREATE FUNCTION order_billed_share(start_kind text, start_price numeric) RETURNS numeric
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN start_kind = 'subscription-start' AND start_price = 0 THEN 0 ELSE 1 END::numeric
$$;

-- 032's view, with the orders' money by that share.
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
            SELECT public.refund_share(e.data) AS share
              FROM public.events e
             WHERE o.state = 'refunded' AND e.stream_id = 'order-' || o.order_id AND e.type = 'refunded'
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     GROUP BY 1, 2, 3, o.currency, oe.environment, o.bundle_id, k.kind
    UNION ALL
    SELECT (p.purchase_date AT TIME ZONE 'UTC')::date, p.product_id,
           CASE WHEN p.refunded_at IS NULL THEN 'billed' ELSE 'refunded' END, count(*),
           sum(CASE WHEN EXISTS (SELECT 1 FROM public.apple_transactions h
                                  WHERE h.transaction_id = p.transaction_id AND h.order_id IS NOT NULL) THEN 0 ELSE p.price END),
           p.currency, trim_scale(sum(p.price * coalesce(r.share, 0))),
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
