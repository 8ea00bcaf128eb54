-- Apple's sales beside the ledger (issue 42; docs/finance.md, "The comparison").
-- An app's SKU, as App Store Connect reports name it in an in-app purchase's Parent Identifier.
ALTER TABLE apps ADD COLUMN sku text UNIQUE CHECK (length(sku) BETWEEN 1 AND 255);

-- Per day (the report's, in Pacific time as Apple counts), app and product, production only:
-- Apple's units (purchases; refunds are its negative units) from the latest revision of each
-- day's report, beside the ledger's purchases (transactions tied to orders, subscription
-- renewals), each order counting its quantity, and refunds (order refunds, by their revocation
-- date), the differences, and what
-- each likely means and what to do. A report line names its app by `Parent Identifier` (the
-- app's SKU); a line without one (an app's own download) is not an in-app purchase.
CREATE FUNCTION ledger_apple_sales(p_from date, p_to date)
RETURNS TABLE (day date, bundle_id text, product_id text, apple_purchases integer, ledger_purchases integer,
               apple_refunds integer, ledger_refunds integer, cause text, next_step text)
-- SECURITY DEFINER: dashboards.apple_sales calls it for ledger_reader, who reads no table here
-- (EXECUTE is granted below to the ledger's roles alone, not to PUBLIC).
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
    WITH latest AS (
        -- Each day's latest fetch (its revision of the version fetched last).
        SELECT DISTINCT ON (r.vendor_number, r.report_date) r.vendor_number, r.report_date, r.version, r.revision
          FROM apple_sales_reports r
         WHERE r.report_date BETWEEN p_from AND p_to
         ORDER BY r.vendor_number, r.report_date, r.fetched_at DESC, r.revision DESC
    ), apple AS (
        SELECT s.report_date AS day, a.bundle_id, s.sku AS product_id,
               sum(greatest(s.units, 0))::integer AS purchases, sum(greatest(-s.units, 0))::integer AS refunds
          FROM latest l
          JOIN apple_sales_rows s ON s.vendor_number = l.vendor_number AND s.report_date = l.report_date
                                 AND s.version = l.version AND s.revision = l.revision
          JOIN apps a ON a.sku = s.parent_identifier
         WHERE s.parent_identifier <> ''
         GROUP BY 1, 2, 3
    ), bought AS (
        SELECT (t.purchase_date AT TIME ZONE 'America/Los_Angeles')::date AS day, t.bundle_id, t.product_id, o.quantity AS n
          FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
         WHERE coalesce(t.environment, 'Production') = 'Production'
           AND t.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND t.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
        UNION ALL
        SELECT (p.purchase_date AT TIME ZONE 'America/Los_Angeles')::date, s.bundle_id, p.product_id, 1
          FROM subscription_periods p JOIN subscriptions s ON s.original_transaction_id = p.original_transaction_id
         WHERE p.kind = 'subscription-renewal' AND NOT s.family_shared AND s.environment = 'Production'
           AND p.purchase_date >= (p_from::timestamp AT TIME ZONE 'America/Los_Angeles')
           AND p.purchase_date < ((p_to + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
    ), purchases AS (
        SELECT b.day, b.bundle_id, b.product_id, sum(b.n)::integer AS n FROM bought b GROUP BY 1, 2, 3
    ), refunds AS (
        SELECT ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date AS day, o.bundle_id, o.product_id,
               sum(o.quantity)::integer AS n
          FROM events e
          JOIN orders o ON e.stream_id = 'order-' || o.order_id
          JOIN apple_transactions t ON t.transaction_id = o.transaction_id
         WHERE e.type = 'refunded' AND coalesce(t.environment, 'Production') = 'Production'
           AND coalesce(e.data->>'revocationType', '') <> 'FAMILY_REVOKE'
           AND ((e.data->>'revocationDate')::timestamptz AT TIME ZONE 'America/Los_Angeles')::date BETWEEN p_from AND p_to
         GROUP BY 1, 2, 3
    ), together AS (
        -- Each side summed first, then joined once on the key.
        SELECT coalesce(a.day, p.day, r.day) AS day, coalesce(a.bundle_id, p.bundle_id, r.bundle_id) AS bundle_id,
               coalesce(a.product_id, p.product_id, r.product_id) AS product_id,
               coalesce(a.purchases, 0) AS apple_purchases, coalesce(p.n, 0) AS ledger_purchases,
               coalesce(a.refunds, 0) AS apple_refunds, coalesce(r.n, 0) AS ledger_refunds
          FROM apple a
          FULL JOIN purchases p ON p.day = a.day AND p.bundle_id IS NOT DISTINCT FROM a.bundle_id AND p.product_id = a.product_id
          FULL JOIN refunds r ON r.day = coalesce(a.day, p.day) AND r.bundle_id IS NOT DISTINCT FROM coalesce(a.bundle_id, p.bundle_id)
                             AND r.product_id = coalesce(a.product_id, p.product_id)
    )
    SELECT t.day, t.bundle_id, t.product_id, t.apple_purchases, t.ledger_purchases, t.apple_refunds, t.ledger_refunds,
           CASE WHEN NOT EXISTS (SELECT 1 FROM latest l WHERE l.report_date = t.day) THEN 'no report of Apple''s for the day yet'
                WHEN t.apple_purchases > t.ledger_purchases THEN 'purchases Apple counted that the ledger never saw'
                WHEN t.ledger_purchases > t.apple_purchases THEN 'purchases the ledger holds that Apple did not count'
                WHEN t.apple_refunds > t.ledger_refunds THEN 'refunds Apple counted that the ledger did not record'
                WHEN t.ledger_refunds > t.apple_refunds THEN 'refunds the ledger recorded that Apple did not count'
                ELSE 'agrees' END,
           CASE WHEN NOT EXISTS (SELECT 1 FROM latest l WHERE l.report_date = t.day) THEN 'ledger sales fetch'
                WHEN t.apple_purchases > t.ledger_purchases THEN 'recover: a history sweep of the users with open orders of the product (ledger recover)'
                WHEN t.ledger_purchases > t.apple_purchases THEN 'check for sandbox or test purchases counted as production, or fraud'
                WHEN t.apple_refunds > t.ledger_refunds THEN 'refund catch-up (ledger backfill refunds)'
                WHEN t.ledger_refunds > t.apple_refunds THEN 'check the refund''s date: Apple may count it on another day'
                ELSE '' END
      FROM together t
     ORDER BY t.day, t.bundle_id, t.product_id
$fn$;
REVOKE EXECUTE ON FUNCTION ledger_apple_sales(date, date) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_apple_sales(date, date) TO ledger_reader, ledger_writer;

-- Every day the ledger has sales or Apple's reports for.
CREATE VIEW dashboards.apple_sales AS
    SELECT * FROM public.ledger_apple_sales('-infinity'::date, 'infinity'::date);
GRANT SELECT ON dashboards.apple_sales TO ledger_reader;
