-- appAccountTokens are per app (issue 39: user ids are per app, and a token names a user or an
-- order of one app). Apple documents the token as the UUID of the user's account on the
-- service: a studio whose games share one account system gives a user the same token in each,
-- and the second game's order with it was refused (409 app-account-token-taken), while a
-- transaction of one app carrying it took the other app's user as its known user. A token is now
-- unique within its app, and found within the app of the transaction that carries it.
--
-- Rows a ledger of no app wrote have no app; the first app takes them as it takes the orders
-- (013_app_columns.sql), which the trigger's function below now does for this table too.
UPDATE app_account_tokens k SET bundle_id = o.bundle_id
  FROM orders o
 WHERE k.bundle_id IS NULL AND k.order_id = o.order_id AND o.bundle_id IS NOT NULL;
UPDATE app_account_tokens SET bundle_id = (SELECT f.bundle_id FROM ledger_first_app f)
 WHERE bundle_id IS NULL AND EXISTS (SELECT 1 FROM ledger_first_app);

-- The token leads the key: lookups by token alone (a transaction whose app is not known yet)
-- still go by it. Its name is the one the writer maps to app-account-token-taken.
ALTER TABLE app_account_tokens DROP CONSTRAINT app_account_tokens_pkey;
CREATE UNIQUE INDEX app_account_tokens_key ON app_account_tokens (app_account_token, (coalesce(bundle_id, '')));

CREATE OR REPLACE FUNCTION apps_record_first_app() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO ledger_first_app (bundle_id) VALUES (NEW.bundle_id) ON CONFLICT DO NOTHING;
    IF FOUND THEN
        LOCK TABLE orders, apple_transactions, products, app_account_tokens IN SHARE MODE;
        UPDATE orders SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
        UPDATE apple_transactions SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
        UPDATE products SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
        UPDATE app_account_tokens SET bundle_id = NEW.bundle_id WHERE bundle_id IS NULL;
    END IF;
    RETURN NULL;
END
$fn$;

-- The user the ledger knows for a transaction (024's rule), with the token's owner found in the
-- transaction's app (whatever its case, as Apple signed it). A token of a ledger that held no app
-- (no app on its row) is any app's, and so is a transaction whose app the caller does not know;
-- the app's own row comes first.
CREATE OR REPLACE FUNCTION ledger_known_user(p_token uuid, p_account text, p_bundle text, p_transaction text)
RETURNS text LANGUAGE sql STABLE AS $fn$
    SELECT coalesce(
        (SELECT k.user_id FROM app_account_tokens k
          WHERE k.app_account_token = p_token
            AND (k.bundle_id IS NULL OR p_bundle IS NULL OR lower(k.bundle_id) = lower(p_bundle))
          ORDER BY k.bundle_id IS NULL LIMIT 1),
        (SELECT e.data->>'userId' FROM events e
          WHERE e.stream_id = 'apple-account-' || p_account AND e.stream_version = 0),
        (SELECT k.user_id FROM apple_transactions k
          WHERE k.app_transaction_id = p_account AND k.order_id IS NOT NULL AND k.transaction_id <> p_transaction
            AND k.bundle_id IS NOT DISTINCT FROM p_bundle
          ORDER BY k.purchase_date LIMIT 1))
$fn$;

-- The reconciler's pool (024's), a per-user token resolving to its user in the transaction's app
-- (by ledger_known_user's rule).
CREATE OR REPLACE VIEW pool_with_users AS
    SELECT p.transaction_id, p.user_id, p.product_id, p.purchase_date, p.resolved_user_id, p.received_at, p.undone_order_ids,
           p.bundle_id
      FROM (SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
                   coalesce(t.user_id,
                            (SELECT k.user_id FROM app_account_tokens k
                              WHERE k.app_account_token = t.app_account_token AND k.order_id IS NULL
                                AND (k.bundle_id IS NULL OR t.bundle_id IS NULL OR lower(k.bundle_id) = lower(t.bundle_id))
                              ORDER BY k.bundle_id IS NULL LIMIT 1),
                            (SELECT k.user_id FROM apple_transactions k
                              WHERE k.app_transaction_id = t.app_transaction_id AND k.user_id IS NOT NULL
                                AND k.bundle_id IS NOT DISTINCT FROM t.bundle_id AND k.status <> 'conflict'
                              ORDER BY k.purchase_date LIMIT 1),
                            (SELECT k.user_id FROM apple_transactions k
                              WHERE k.original_transaction_id = t.original_transaction_id AND k.user_id IS NOT NULL
                                AND k.bundle_id IS NOT DISTINCT FROM t.bundle_id AND k.status <> 'conflict'
                              ORDER BY k.purchase_date LIMIT 1),
                            (SELECT e.data->>'userId' FROM events e
                              WHERE e.stream_id = 'apple-account-' || t.app_transaction_id AND e.stream_version = 0)) AS resolved_user_id,
                   t.received_at, t.verification -> 'undoneOrderIds' AS undone_order_ids, t.bundle_id,
                   ledger_known_user(t.app_account_token, t.app_transaction_id, t.bundle_id, t.transaction_id) AS known_user_id
              FROM apple_transactions t
             WHERE t.order_id IS NULL AND t.status = 'unmatched'
               AND coalesce(t.verification -> 'transaction' ->> 'inAppOwnershipType', '') <> 'FAMILY_SHARED'
               AND NOT (t.transaction_id <> coalesce(t.original_transaction_id, t.transaction_id)
                        AND EXISTS (SELECT 1 FROM products p
                                     WHERE p.product_id = t.product_id AND p.type = 'auto-renewable'
                                       AND coalesce(p.bundle_id, '') IN (coalesce(t.bundle_id, ''), '')))) AS p
     WHERE p.known_user_id IS NULL OR p.resolved_user_id IS NULL OR p.known_user_id = p.resolved_user_id;
