-- Everything belongs to an app (issue 39, "Everything belongs to an app" and "Upgrade without
-- loss"; docs/apps.md). Orders, Apple transactions and products carry the bundle id of their app;
-- user ids and product ids are per app, so the app leads every key a user or product id is in.
-- An order's app is set when it is created (its `created` event names it) and never changes; a
-- transaction's is the bundle id Apple signed or, claimed straight from a `receipt-received`,
-- the one that event names, else its order's.
--
-- Rows whose events name no app (written before this migration, or while the ledger held none)
-- belong to the ledger's first app: the first row `apps` ever had, recorded once in
-- ledger_first_app. This migration assigns today's rows to it, and when a ledger that holds no
-- app gets its first, the trigger below assigns them then; the append routine and the rebuild
-- (LedgerCore's `Projection.firstApp`) apply the same rule, so `ledger projections verify`
-- stays clean. A bundle id stays NULL only in a ledger that holds no app.

CREATE TABLE ledger_first_app (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    bundle_id text    NOT NULL REFERENCES apps (bundle_id)
);
INSERT INTO ledger_first_app (bundle_id) SELECT bundle_id FROM apps ORDER BY created_at, bundle_id LIMIT 1;

ALTER TABLE orders ADD COLUMN bundle_id text;
ALTER TABLE apple_transactions ADD COLUMN bundle_id text;
ALTER TABLE products ADD COLUMN bundle_id text REFERENCES apps (bundle_id);

-- A pool entry's app is what Apple signed (its `transaction-unmatched` body); a transaction
-- claimed straight from a receipt takes its order's.
UPDATE orders SET bundle_id = (SELECT f.bundle_id FROM ledger_first_app f);
UPDATE apple_transactions
   SET bundle_id = coalesce(verification -> 'transaction' ->> 'bundleId', (SELECT f.bundle_id FROM ledger_first_app f));
UPDATE products SET bundle_id = (SELECT f.bundle_id FROM ledger_first_app f);

-- The app joins the keys after the user and product: the search route and the reconciler ask for
-- one app's user and product, and the reconciler's batches and the history sweep for users
-- alone, which a key led by the app would make a full scan. NULL (a ledger without apps) is
-- found by `bundle_id IS NULL` through the same index. The orders index holds only columns no
-- order event changes, so updates stay HOT.
DROP INDEX orders_user_product;
CREATE INDEX orders_user_product ON orders (user_id, product_id, bundle_id, created_at);
DROP INDEX apple_transactions_pool;
CREATE INDEX apple_transactions_pool ON apple_transactions (user_id, product_id, bundle_id, purchase_date) WHERE order_id IS NULL;

-- Product ids are per app.
ALTER TABLE products DROP CONSTRAINT products_pkey;
CREATE UNIQUE INDEX products_app_product_key ON products ((coalesce(bundle_id, '')), product_id);

-- The app's first row: recorded once, and the rows of a ledger that held no app become its. The
-- tables are locked against writers first, so no row without an app commits after the update.
CREATE FUNCTION apps_record_first_app() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO ledger_first_app (bundle_id) VALUES (NEW.bundle_id) ON CONFLICT DO NOTHING;
    IF FOUND THEN
        LOCK TABLE orders, apple_transactions, products IN SHARE MODE;
        UPDATE orders SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
        UPDATE apple_transactions SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
        UPDATE products SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER apps_first_app AFTER INSERT ON apps FOR EACH ROW EXECUTE FUNCTION apps_record_first_app();

-- The append routine checks a new order's app (known, not retired) and that no transaction pays
-- an order of another app: it reads these columns of `apps`, never the app's other settings.
GRANT SELECT ON ledger_first_app TO ledger_writer;
GRANT SELECT (bundle_id, retired) ON apps TO ledger_writer;

-- The views, each with `bundle_id` after its columns of before.

CREATE OR REPLACE VIEW unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           app_account_token, original_transaction_id, app_transaction_id, verification, bundle_id
      FROM apple_transactions
     WHERE order_id IS NULL AND status = 'unmatched';

-- 005's view: a transaction that came without a user takes the user of an earlier transaction of
-- the same Apple account or subscription in the same app, else the user who linked the account.
CREATE OR REPLACE VIEW pool_with_users AS
    SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
           coalesce(t.user_id,
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.app_transaction_id = t.app_transaction_id AND k.user_id IS NOT NULL
                        AND k.bundle_id IS NOT DISTINCT FROM t.bundle_id
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.original_transaction_id = t.original_transaction_id AND k.user_id IS NOT NULL
                        AND k.bundle_id IS NOT DISTINCT FROM t.bundle_id
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT e.data->>'userId' FROM events e
                      WHERE e.stream_id = 'apple-account-' || t.app_transaction_id AND e.stream_version = 0)) AS resolved_user_id,
           t.received_at, t.verification -> 'undoneOrderIds' AS undone_order_ids, t.bundle_id
      FROM apple_transactions t
     WHERE t.order_id IS NULL AND t.status = 'unmatched';

CREATE OR REPLACE VIEW dashboards.orders AS
    SELECT order_id, user_id, product_id, quantity, price, currency, state, transaction_id,
           created_at, updated_at, now() - created_at AS age, now() - updated_at AS time_in_state,
           (SELECT t.environment FROM public.apple_transactions t WHERE t.transaction_id = orders.transaction_id) AS environment,
           bundle_id
      FROM public.orders;

CREATE OR REPLACE VIEW dashboards.unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           now() - received_at AS age, bundle_id
      FROM public.apple_transactions
     WHERE order_id IS NULL AND status = 'unmatched'
     ORDER BY received_at;

-- The share of an order's amount a `refunded` event (its body) gives back: a prorated refund's
-- percentage (Apple's thousandths of a percent, held to 0...100000; a full refund without one),
-- nothing for a family member's revoked access, else all. One statement of the rule for
-- dashboards.daily_orders and LedgerStore's ReconciliationReport.
CREATE FUNCTION refund_share(refund jsonb) RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE refund->>'revocationType'
                WHEN 'REFUND_PRORATED' THEN
                    CASE WHEN jsonb_typeof(refund->'revocationPercentage') = 'number'
                         THEN least(greatest((refund->>'revocationPercentage')::numeric, 0), 100000) / 100000
                         ELSE 1 END
                WHEN 'FAMILY_REVOKE' THEN 0
                ELSE 1 END
$$;

-- 012's view, one row per app too.
CREATE OR REPLACE VIEW dashboards.daily_orders AS
    SELECT (o.created_at AT TIME ZONE 'UTC')::date AS day, o.product_id, o.state, count(*) AS orders,
           sum(o.price * o.quantity) AS amount, o.currency,
           trim_scale(sum(o.price * o.quantity * coalesce(r.share, 0))) AS refunded_amount,
           oe.environment, o.bundle_id
      FROM public.orders o
      JOIN public.order_environments oe ON oe.order_id = o.order_id
      LEFT JOIN LATERAL (
            SELECT public.refund_share(e.data) AS share
              FROM public.events e
             WHERE o.state = 'refunded' AND e.stream_id = 'order-' || o.order_id AND e.type = 'refunded'
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     GROUP BY 1, 2, 3, o.currency, oe.environment, o.bundle_id;

CREATE OR REPLACE VIEW dashboards.products AS
    SELECT product_id, status, price, currency, updated_at, bundle_id FROM public.products;

-- An account link's app: the one its event names, else (linked before this migration) the first app.
CREATE OR REPLACE VIEW dashboards.apple_accounts AS
    SELECT substr(l.stream_id, length('apple-account-') + 1) AS app_transaction_id,
           l.data->>'userId' AS user_id, l.recorded_at AS linked_at,
           (SELECT count(*) FROM public.events c WHERE c.stream_id = l.stream_id AND c.stream_version > 0) AS conflicts,
           h.swept_at, h.found, l.data->>'environment' AS environment,
           coalesce(l.data->>'bundleId', (SELECT f.bundle_id FROM public.ledger_first_app f)) AS bundle_id
      FROM public.events l
      LEFT JOIN public.apple_history_cursors h ON h.account_id = substr(l.stream_id, length('apple-account-') + 1)
     WHERE l.type = 'account-linked';
