-- A renewal an order holds (a backend's own receipt-received of it, verified; an imported history's)
-- is that order's sale, and Apple's refund of it now refunds the order too (NotificationLedger):
-- its money goes back once, with the order. Until now only the period was refunded, and the order
-- stayed verified.
-- - dashboards.daily_orders (039's): such a period's refund gives back nothing of its own once its
--   order has a `refunded`.
-- - ledger_apple_sales (035's): such a period's refunds are its order's, counted with the order.
--   Two more changes, from comparing it with Apple's reports by hand:
--   * An order's refund counts the units Apple refunded: a REFUND_PRORATED of 33333 thousandths
--     of a percent of an order of 3 is 1 unit (Apple's report: -1), not 3; at least 1.
--   * A renewal period counts each refund Apple made of it, one per revocation date to the second
--     (a copy of one refund recorded twice, even a millisecond apart as older logs may hold it,
--     counts once), as an order counts each of its `refunded` events:
--     a refund reversed since still counts on its day, as it did for orders. Before, a period
--     counted only the refund it holds now, so a reversed renewal refund Apple counted was
--     "not recorded" and sent finance to the refund catch-up.
-- The rest is 035's, whole (a migration never changes once released); the function's signature
-- is 028's, so dashboards.apple_sales keeps calling it.

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
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     WHERE p.kind = 'subscription-renewal' AND NOT s.family_shared
     GROUP BY 1, 2, 3, p.currency, s.environment, s.bundle_id, p.kind;

CREATE OR REPLACE FUNCTION ledger_apple_sales(p_from date, p_to date)
RETURNS TABLE (day date, bundle_id text, product_id text, country text, apple_purchases integer, ledger_purchases integer,
               apple_refunds integer, ledger_refunds integer, cause text, next_step text, sweep text)
-- SECURITY DEFINER: dashboards.apple_sales calls it for ledger_reader, who reads no table here
-- (EXECUTE stays granted, as 028 granted it, to the ledger's roles alone, not to PUBLIC).
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
    -- Every side is keyed by day, app, product and country with '' for an unknown app or
    -- country, so that each join is on plain equality (hashed) and each row is joined once.
    WITH latest AS (
        -- Each day's latest fetch (its revision of the version fetched last).
        SELECT DISTINCT ON (r.vendor_number, r.report_date) r.vendor_number, r.report_date, r.version, r.revision
          FROM apple_sales_reports r
         WHERE r.report_date BETWEEN p_from AND p_to
         ORDER BY r.vendor_number, r.report_date, r.fetched_at DESC, r.revision DESC
    ), reported AS (
        SELECT DISTINCT l.report_date AS day FROM latest l
    ), apple AS (
        SELECT s.report_date AS day, a.bundle_id, s.sku AS product_id, s.country_code AS country,
               sum(greatest(s.units, 0))::integer AS apple_purchases, sum(greatest(-s.units, 0))::integer AS apple_refunds
          FROM latest l
          JOIN apple_sales_rows s ON s.vendor_number = l.vendor_number AND s.report_date = l.report_date
                                 AND s.version = l.version AND s.revision = l.revision
          JOIN apps a ON a.sku = s.parent_identifier
         WHERE s.parent_identifier <> ''
         GROUP BY 1, 2, 3, 4
    ), renewals AS (
        -- The renewals bought or refunded in the period, each with its storefront: its own
        -- transaction's, else its subscription's first.
        SELECT p.purchase_date, p.refunded_at, s.bundle_id, p.product_id,
               coalesce((SELECT x.storefront FROM apple_transactions x WHERE x.transaction_id = p.transaction_id),
                        (SELECT x.storefront FROM apple_transactions x WHERE x.transaction_id = p.original_transaction_id))
                   AS storefront,
               -- Held by an order: its sale is the order's (counted with the orders). Asked of
               -- its transaction's row, by its key (orders have no index on transaction_id).
               EXISTS (SELECT 1 FROM apple_transactions h WHERE h.transaction_id = p.transaction_id AND h.order_id IS NOT NULL) AS held
          FROM subscription_periods p JOIN subscriptions s ON s.original_transaction_id = p.original_transaction_id
         WHERE p.kind = 'subscription-renewal' AND NOT s.family_shared AND s.environment = 'Production'
           AND ((p.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
                 AND p.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles'))
                OR (p.refunded_at AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to)
    ), pool_refunded AS (
        -- Production purchases refunded while they waited in the pool (no order took them), each
        -- with the revocation date of the latest refund on its stream that took it back (not one
        -- Apple had reversed before it arrived, `reversedBefore`).
        SELECT t.purchase_date, t.bundle_id, t.product_id, t.storefront,
               coalesce((t.verification -> 'transaction' ->> 'quantity')::integer, 1) AS n,
               (SELECT coalesce(e.data -> 'refund' ->> 'revocationDate', e.data ->> 'signedDate')::timestamptz
                  FROM events e
                 WHERE e.stream_id = 'transaction-' || t.transaction_id AND e.type = 'notification-received'
                   AND e.data ->> 'notificationType' IN ('REFUND', 'REVOKE')
                   AND NOT coalesce((e.data ->> 'reversedBefore')::boolean, false)
                 ORDER BY e.stream_version DESC
                 LIMIT 1) AS refunded_at
          FROM apple_transactions t
         WHERE t.order_id IS NULL AND t.status = 'refunded' AND coalesce(t.environment, 'Production') = 'Production'
           AND coalesce(t.verification ->> 'reason', '') <> 'family-share-revoked'
           AND coalesce(t.verification -> 'transaction' ->> 'inAppOwnershipType', '') <> 'FAMILY_SHARED'
    ), bought AS (
        SELECT (t.purchase_date AT TIME ZONE 'America/Los_Angeles')::date AS day, t.bundle_id, t.product_id, t.storefront,
               o.quantity AS n
          FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
         WHERE coalesce(t.environment, 'Production') = 'Production'
           AND t.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND t.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
        UNION ALL
        SELECT (r.purchase_date AT TIME ZONE 'America/Los_Angeles')::date, r.bundle_id, r.product_id, r.storefront, 1
          FROM renewals r
         WHERE NOT r.held AND r.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND r.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
        UNION ALL
        SELECT (r.purchase_date AT TIME ZONE 'America/Los_Angeles')::date, r.bundle_id, r.product_id, r.storefront, r.n
          FROM pool_refunded r
         WHERE r.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND r.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
    ), purchases AS (
        SELECT b.day, coalesce(b.bundle_id, '') AS bundle_id, b.product_id, coalesce(c.alpha2, '') AS country,
               sum(b.n)::integer AS ledger_purchases
          FROM bought b LEFT JOIN storefront_countries c ON c.alpha3 = b.storefront
         GROUP BY 1, 2, 3, 4
    ), refunded AS (
        SELECT ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date AS day,
               o.bundle_id, o.product_id, t.storefront, greatest(round(o.quantity * refund_share(e.data)), 1)::integer AS n
          FROM events e
          JOIN orders o ON e.stream_id = 'order-' || o.order_id
          JOIN apple_transactions t ON t.transaction_id = o.transaction_id
         WHERE e.type = 'refunded' AND coalesce(t.environment, 'Production') = 'Production'
           AND coalesce(e.data->>'revocationType', '') <> 'FAMILY_REVOKE'
           AND ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to
        UNION ALL
        -- A renewal's refunds are its period's (it pays no order; one an order holds has them
        -- counted with that order's above), each by its revocation date, in the renewal's
        -- storefront as its purchase counts.
        SELECT DISTINCT ON (p.original_transaction_id, p.period_key, date_trunc('second', (e.data->>'revocationDate')::timestamptz))
               ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date, s.bundle_id, p.product_id,
               coalesce((SELECT x.storefront FROM apple_transactions x WHERE x.transaction_id = p.transaction_id),
                        (SELECT x.storefront FROM apple_transactions x WHERE x.transaction_id = p.original_transaction_id)),
               1
          FROM events e
          JOIN subscription_periods p ON p.original_transaction_id = substr(e.stream_id, 14) AND p.period_key = e.data->>'periodKey'
          JOIN subscriptions s ON s.original_transaction_id = p.original_transaction_id
         WHERE e.stream_id LIKE 'subscription-%' AND e.type = 'subscription-period-refunded'
           AND p.kind = 'subscription-renewal' AND NOT s.family_shared AND s.environment = 'Production'
           AND ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to
           AND NOT EXISTS (SELECT 1 FROM apple_transactions h JOIN events v ON v.stream_id = 'order-' || h.order_id AND v.type = 'refunded'
                            WHERE h.transaction_id = p.transaction_id)
        UNION ALL
        SELECT (r.refunded_at AT TIME ZONE 'America/Los_Angeles')::date, r.bundle_id, r.product_id, r.storefront, r.n
          FROM pool_refunded r
         WHERE (r.refunded_at AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to
    ), refunds AS (
        SELECT r.day, coalesce(r.bundle_id, '') AS bundle_id, r.product_id, coalesce(c.alpha2, '') AS country,
               sum(r.n)::integer AS ledger_refunds
          FROM refunded r LEFT JOIN storefront_countries c ON c.alpha3 = r.storefront
         GROUP BY 1, 2, 3, 4
    ), pooled AS (
        -- Production purchases of the period the ledger holds with no order: waiting in the pool,
        -- or held there for support (an Apple-account conflict). Seen, not paid to an order.
        SELECT (t.purchase_date AT TIME ZONE 'America/Los_Angeles')::date AS day, coalesce(t.bundle_id, '') AS bundle_id,
               t.product_id, coalesce(c.alpha2, '') AS country,
               sum(coalesce((t.verification -> 'transaction' ->> 'quantity')::integer, 1))::integer AS pooled
          FROM apple_transactions t LEFT JOIN storefront_countries c ON c.alpha3 = t.storefront
         WHERE t.order_id IS NULL AND t.status IN ('unmatched', 'conflict')
           AND coalesce(t.environment, 'Production') = 'Production'
           AND t.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND t.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
         GROUP BY 1, 2, 3, 4
    ), together AS (
        SELECT day, bundle_id, product_id, country,
               coalesce(apple_purchases, 0) AS apple_purchases, coalesce(ledger_purchases, 0) AS ledger_purchases,
               coalesce(apple_refunds, 0) AS apple_refunds, coalesce(ledger_refunds, 0) AS ledger_refunds,
               coalesce(pooled, 0) AS pooled
          FROM apple FULL JOIN purchases USING (day, bundle_id, product_id, country)
                     FULL JOIN refunds USING (day, bundle_id, product_id, country)
                     LEFT JOIN pooled USING (day, bundle_id, product_id, country)
    ), judged AS (
        -- Each row with its product's day: whether the ledger holds rows of it without a
        -- storefront, and whether the day agrees once those are counted.
        SELECT t.*, r.day IS NOT NULL AS reported,
               bool_or(t.country = '') OVER w AS unplaced,
               sum(t.apple_purchases) OVER w = sum(t.ledger_purchases) OVER w
                   AND sum(t.apple_refunds) OVER w = sum(t.ledger_refunds) OVER w AS day_agrees
          FROM together t LEFT JOIN reported r ON r.day = t.day
        WINDOW w AS (PARTITION BY t.day, t.bundle_id, t.product_id)
    )
    SELECT j.day, nullif(j.bundle_id, ''), j.product_id, nullif(j.country, ''), j.apple_purchases, j.ledger_purchases,
           j.apple_refunds, j.ledger_refunds,
           CASE WHEN NOT j.reported THEN 'no report of Apple''s for the day yet'
                WHEN j.country = '' THEN 'sales the ledger holds without a storefront (legacy receipts, imports)'
                WHEN j.apple_purchases = j.ledger_purchases AND j.apple_refunds = j.ledger_refunds THEN 'agrees'
                WHEN j.unplaced AND j.day_agrees THEN 'sales the ledger holds without a storefront account for it'
                WHEN j.apple_purchases > j.ledger_purchases AND j.apple_purchases <= j.ledger_purchases + j.pooled
                     AND j.apple_refunds = j.ledger_refunds THEN 'purchases the ledger holds in its pool, paid to no order yet'
                WHEN j.apple_purchases > j.ledger_purchases THEN 'purchases Apple counted that the ledger never saw'
                WHEN j.ledger_purchases > j.apple_purchases THEN 'purchases the ledger holds that Apple did not count'
                WHEN j.apple_refunds > j.ledger_refunds THEN 'refunds Apple counted that the ledger did not record'
                ELSE 'refunds the ledger recorded that Apple did not count' END,
           CASE WHEN NOT j.reported THEN 'ledger sales fetch'
                WHEN j.country = '' AND j.day_agrees THEN ''
                WHEN j.country = '' THEN 'compare the product''s day across its storefronts'
                WHEN j.apple_purchases = j.ledger_purchases AND j.apple_refunds = j.ledger_refunds THEN ''
                WHEN j.unplaced AND j.day_agrees THEN ''
                WHEN j.apple_purchases > j.ledger_purchases AND j.apple_purchases <= j.ledger_purchases + j.pooled
                     AND j.apple_refunds = j.ledger_refunds
                     THEN 'the reconciler pairs them with their users'' orders, or support does (GET /v1/transactions/unmatched)'
                WHEN j.apple_purchases > j.ledger_purchases THEN 'recover: a history sweep of the users with open orders of the product (run after each fetch; ledger sales sweep)'
                WHEN j.ledger_purchases > j.apple_purchases THEN 'check for sandbox or test purchases counted as production, or fraud'
                WHEN j.apple_refunds > j.ledger_refunds THEN 'refund catch-up (ledger backfill refunds)'
                ELSE 'check the refund''s date: Apple may count it on another day' END,
           CASE WHEN w.day IS NULL THEN ''
                ELSE format('swept %s user(s), %s Apple account(s) at %s: %s transaction(s) new to the ledger%s',
                            w.users, w.accounts, to_char(w.swept_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI"Z"'), w.found,
                            CASE WHEN w.failed > 0 THEN format(', %s account(s) not read', w.failed) ELSE '' END) END
      FROM judged j
      LEFT JOIN apple_sales_sweeps w ON w.day = j.day AND w.bundle_id = j.bundle_id AND w.product_id = j.product_id
     ORDER BY j.day, j.bundle_id, j.product_id, j.country = '', j.country
$fn$;
