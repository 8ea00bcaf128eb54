-- Apple-account conflicts held for support (issue 41; docs/apple.md, "The Apple account link").
-- A transaction whose client claimed another user than the one the ledger knows for its Apple
-- account (its link, an earlier transaction of it tied to that user's order) or for its
-- appAccountToken waits in the pool with the status `conflict`: the pool the reconciler and
-- recovery read takes `unmatched` alone, so no automatic path pairs it; support does, with a reason.
ALTER TABLE apple_transactions DROP CONSTRAINT apple_transactions_status_check;
ALTER TABLE apple_transactions ADD CONSTRAINT apple_transactions_status_check
    CHECK (status IN ('unmatched', 'refunded', 'claimed', 'renewal', 'shared', 'conflict'));

-- The accounts' conflicts: a second user's claim on a linked account (`source` account-link, as
-- before), and each transaction held for support (`source` transaction: the user its client
-- claimed, the user the ledger knows, the transaction, while it waits).
CREATE OR REPLACE VIEW dashboards.apple_account_conflicts AS
    SELECT recorded_at, data->>'appTransactionId' AS app_transaction_id,
           data->>'userId' AS claimed_by, data->>'ownerUserId' AS owner_user_id,
           NULL::text AS transaction_id, 'account-link'::text AS source, NULL::text AS bundle_id
      FROM public.events
     WHERE type = 'account-link-conflict'
    UNION ALL
    SELECT received_at, app_transaction_id, user_id, verification->>'knownUserId', transaction_id, 'transaction', bundle_id
      FROM public.apple_transactions
     WHERE status = 'conflict' AND order_id IS NULL;

-- The user the ledger knows for a transaction (the one rule; LedgerStore's TransactionPool and
-- the append routine's LE395 ask it too): the user of the order its appAccountToken names, else
-- its Apple account's owner (the link), else the user of the account's earliest transaction tied
-- to an order, other than `p_transaction`. NULL when it knows none.
CREATE FUNCTION ledger_known_user(p_token uuid, p_account text, p_bundle text, p_transaction text)
RETURNS text LANGUAGE sql STABLE AS $fn$
    SELECT coalesce(
        (SELECT o.user_id FROM orders o WHERE o.app_account_token = p_token),
        (SELECT e.data->>'userId' FROM events e
          WHERE e.stream_id = 'apple-account-' || p_account AND e.stream_version = 0),
        (SELECT k.user_id FROM apple_transactions k
          WHERE k.app_transaction_id = p_account AND k.order_id IS NOT NULL AND k.transaction_id <> p_transaction
            AND k.bundle_id IS NOT DISTINCT FROM p_bundle
          ORDER BY k.purchase_date LIMIT 1))
$fn$;

-- The reconciler's pool: an earlier transaction held for a conflict lends no user (its user is a
-- claim in dispute), and a transaction whose user (claimed, else resolved) is not the one the
-- ledger knows for it (`ledger_known_user`) is left out, as the intake now holds such a one for
-- support (and the append routine would refuse the pairing: LE395). Otherwise as 022 made it.
CREATE OR REPLACE VIEW pool_with_users AS
    SELECT p.transaction_id, p.user_id, p.product_id, p.purchase_date, p.resolved_user_id, p.received_at, p.undone_order_ids,
           p.bundle_id
      FROM (SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
                   coalesce(t.user_id,
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
