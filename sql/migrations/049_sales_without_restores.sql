-- ledger_apple_sales (047's) leaves out the report lines of restored purchases (Apple's Product
-- Type Identifier IA3) and of free subscriptions (IAC), a Mac app's too (-M): Apple counts their
-- units, nobody paid for them, and 047 counted them as purchases the ledger never saw (each
-- then sent a history sweep after nothing).
-- The rest is 047's, whole; the signature is 028's, so dashboards.apple_sales keeps calling it.

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
           -- A restored purchase (IA3) and a free subscription (IAC), on any platform (a Mac
           -- app's type ends in -M), are no sale: Apple counts their units, nobody paid them.
           AND split_part(s.product_type, '-', 1) NOT IN ('IA3', 'IAC')
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
        -- Production purchases refunded while they waited in the pool, no order took them: Apple
        -- counts their sale and their refund.
        SELECT t.purchase_date, t.bundle_id, t.product_id, t.storefront,
               coalesce((t.verification -> 'transaction' ->> 'quantity')::integer, 1) AS n
          FROM apple_transactions t
         WHERE t.order_id IS NULL AND t.status = 'refunded' AND coalesce(t.environment, 'Production') = 'Production'
           AND coalesce(t.verification ->> 'reason', '') <> 'family-share-revoked'
           AND coalesce(t.verification -> 'transaction' ->> 'inAppOwnershipType', '') <> 'FAMILY_SHARED'
    ), pool_refunds AS (
        -- Each refund Apple made of a Production purchase while it waited in the pool, by its
        -- revocation date: one reversed since too (the purchase may wait again, or an order may
        -- have taken it since), as Apple counted it on its day; not one Apple had reversed before
        -- it arrived (`reversedBefore`); copies of one refund (told by two ways, or again after a
        -- reversal) once; the units Apple refunded, as an order's refund counts them. Never a
        -- renewal's, a family member's share's or a restore's (their refunds are counted apart,
        -- or are no sale's).
        SELECT DISTINCT ON (t.transaction_id, date_trunc('second', coalesce(e.data -> 'refund' ->> 'revocationDate', e.data ->> 'signedDate')::timestamptz))
               coalesce(e.data -> 'refund' ->> 'revocationDate', e.data ->> 'signedDate')::timestamptz AS refunded_at,
               t.bundle_id, t.product_id, t.storefront,
               greatest(round(coalesce((t.verification -> 'transaction' ->> 'quantity')::integer, 1)
                              * refund_share(coalesce(e.data -> 'refund', '{}'::jsonb))), 1)::integer AS n
          FROM apple_transactions t
          JOIN events e ON e.stream_id = 'transaction-' || t.transaction_id
         WHERE e.type = 'notification-received' AND e.data ->> 'notificationType' IN ('REFUND', 'REVOKE')
           AND NOT coalesce((e.data ->> 'reversedBefore')::boolean, false)
           AND coalesce(t.environment, 'Production') = 'Production'
           AND t.status NOT IN ('renewal', 'shared', 'restore')
           AND coalesce(t.verification ->> 'reason', '') <> 'family-share-revoked'
           AND coalesce(t.verification -> 'transaction' ->> 'inAppOwnershipType', '') <> 'FAMILY_SHARED'
         ORDER BY t.transaction_id, date_trunc('second', coalesce(e.data -> 'refund' ->> 'revocationDate', e.data ->> 'signedDate')::timestamptz), e.global_position
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
        -- An order's refunds, each by its revocation date: its `refunded` events, and the refunds
        -- its state did not take, kept on their `notification-received` (a later refund that
        -- arrived first, another of an order refunded already); copies of one refund (told again
        -- after the reversal of an earlier one, or by two ways) once.
        SELECT * FROM (
            SELECT DISTINCT ON (x.stream_id, date_trunc('second', (x.refund->>'revocationDate')::timestamptz))
                   ((x.refund->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date AS day,
                   o.bundle_id, o.product_id, t.storefront, greatest(round(o.quantity * refund_share(x.refund)), 1)::integer AS n
              FROM (SELECT e.stream_id, e.stream_version, CASE e.type WHEN 'refunded' THEN e.data ELSE e.data->'refund' END AS refund
                      FROM events e
                     WHERE e.stream_id LIKE 'order-%'
                       AND (e.type = 'refunded'
                            OR e.type = 'notification-received' AND e.data ? 'refund'
                               AND NOT coalesce((e.data->>'reversedBefore')::boolean, false))) x
              JOIN orders o ON x.stream_id = 'order-' || o.order_id
              JOIN apple_transactions t ON t.transaction_id = o.transaction_id
             WHERE coalesce(t.environment, 'Production') = 'Production'
               AND coalesce(x.refund->>'revocationType', '') <> 'FAMILY_REVOKE'
               AND ((x.refund->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to
             ORDER BY x.stream_id, date_trunc('second', (x.refund->>'revocationDate')::timestamptz), x.stream_version) AS order_refunds
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
          FROM pool_refunds r
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
                   AND sum(t.apple_refunds) OVER w = sum(t.ledger_refunds) OVER w AS day_agrees,
               -- The day's purchases Apple counted more are all in the pool, once the ledger's
               -- storefront-less sales are counted with the rest.
               sum(t.apple_purchases) OVER w > sum(t.ledger_purchases) OVER w
                   AND sum(t.apple_purchases) OVER w <= sum(t.ledger_purchases) OVER w + sum(t.pooled) OVER w
                   AND sum(t.apple_refunds) OVER w = sum(t.ledger_refunds) OVER w AS day_pooled
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
                WHEN j.apple_purchases > j.ledger_purchases AND j.unplaced AND j.day_pooled
                     THEN 'purchases the ledger holds in its pool, paid to no order yet'
                WHEN j.apple_purchases > j.ledger_purchases THEN 'purchases Apple counted that the ledger never saw'
                WHEN j.ledger_purchases > j.apple_purchases THEN 'purchases the ledger holds that Apple did not count'
                WHEN j.apple_refunds > j.ledger_refunds THEN 'refunds Apple counted that the ledger did not record'
                ELSE 'refunds the ledger recorded that Apple did not count' END,
           CASE WHEN NOT j.reported THEN 'ledger sales fetch'
                WHEN j.country = '' AND j.day_agrees THEN ''
                WHEN j.country = '' THEN 'compare the product''s day across its storefronts'
                WHEN j.apple_purchases = j.ledger_purchases AND j.apple_refunds = j.ledger_refunds THEN ''
                WHEN j.unplaced AND j.day_agrees THEN ''
                WHEN j.apple_purchases > j.ledger_purchases AND (j.apple_purchases <= j.ledger_purchases + j.pooled
                     AND j.apple_refunds = j.ledger_refunds OR j.unplaced AND j.day_pooled)
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
