-- Per-user appAccountTokens (issue 41; docs/apple.md, "appAccountToken: per order or per user").
-- Apple documents the token as the UUID of the user's account on the service, and many apps
-- send one token for all of a user's purchases. An app says which it does: `order` (the
-- default: the token names one order) or `user` (the token names its user; several of the
-- user's orders carry it, and a transaction with it resolves the user, never an order by
-- itself).
ALTER TABLE apps ADD COLUMN app_account_tokens text NOT NULL DEFAULT 'order'
    CHECK (app_account_tokens IN ('order', 'user'));

-- Who each token belongs to: the order it names (order_id set), or, for a per-user token, its
-- user alone (order_id NULL). One row per token, so a token is never two orders' nor two users'
-- (the append routine refuses the order that would make it so: LE396). Written by the append
-- routine with each new order, from its `created` event (`appAccountTokenScope`); a projection
-- rebuild adds what the log holds and the table lacks. It replaces the unique index on
-- orders.app_account_token.
CREATE TABLE app_account_tokens (
    app_account_token uuid PRIMARY KEY,
    user_id           text NOT NULL,
    bundle_id         text,
    order_id          text
);
INSERT INTO app_account_tokens (app_account_token, user_id, bundle_id, order_id)
    SELECT app_account_token, user_id, bundle_id, order_id FROM orders;
-- A user's token, for an order created without one in an app of per-user tokens.
CREATE INDEX app_account_tokens_user ON app_account_tokens (bundle_id, user_id) WHERE order_id IS NULL;
DROP INDEX orders_app_account_token_key;

GRANT SELECT, INSERT ON app_account_tokens TO ledger_writer;

-- The user the ledger knows for a transaction (023's rule), with the token's owner read from
-- app_account_tokens: the user of the order its token names, or the token's user.
CREATE OR REPLACE FUNCTION ledger_known_user(p_token uuid, p_account text, p_bundle text, p_transaction text)
RETURNS text LANGUAGE sql STABLE AS $fn$
    SELECT coalesce(
        (SELECT k.user_id FROM app_account_tokens k WHERE k.app_account_token = p_token),
        (SELECT e.data->>'userId' FROM events e
          WHERE e.stream_id = 'apple-account-' || p_account AND e.stream_version = 0),
        (SELECT k.user_id FROM apple_transactions k
          WHERE k.app_transaction_id = p_account AND k.order_id IS NOT NULL AND k.transaction_id <> p_transaction
            AND k.bundle_id IS NOT DISTINCT FROM p_bundle
          ORDER BY k.purchase_date LIMIT 1))
$fn$;

-- The reconciler's pool (023's), where a transaction with a per-user token and no claimed user
-- resolves to the token's user first: the reconciler's rules then choose among that user's open
-- orders of its product.
CREATE OR REPLACE VIEW pool_with_users AS
    SELECT p.transaction_id, p.user_id, p.product_id, p.purchase_date, p.resolved_user_id, p.received_at, p.undone_order_ids,
           p.bundle_id
      FROM (SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
                   coalesce(t.user_id,
                            (SELECT k.user_id FROM app_account_tokens k
                              WHERE k.app_account_token = t.app_account_token AND k.order_id IS NULL),
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
