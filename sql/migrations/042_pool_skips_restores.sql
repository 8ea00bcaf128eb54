-- Restores pay no order (041): the pool the reconciler and recovery read leaves out every later
-- transaction of a purchase (its transaction id is not its original's), whatever its product's
-- type, where 030 left out those of products typed `auto-renewable` alone. A restore pooled
-- `unmatched` before 041 is so never paired; it stays in `dashboards.unmatched_transactions` for
-- support, as 022 left the untyped renewals. Otherwise 030's view.
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
               AND t.transaction_id = coalesce(t.original_transaction_id, t.transaction_id)) AS p
     WHERE p.known_user_id IS NULL OR p.resolved_user_id IS NULL OR p.known_user_id = p.resolved_user_id;
