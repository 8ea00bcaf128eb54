-- Transactions pooled before the ledger knew subscriptions (issue 40): a later period of an
-- auto-renewable subscription, or a family member's share, that entered the pool before then
-- is `unmatched` with no Apple type recorded, and the reconciler would pair it with an open order
-- of its user and product. The pool the reconciler and recovery read leaves out a later period
-- (its transaction id is not its original's) of a product the catalog types `auto-renewable`,
-- and a transaction Apple signed as `FAMILY_SHARED`. They stay in `dashboards.unmatched_transactions`
-- for support. What the intake records now never needs this: it marks them `renewal` and `shared`.
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
     WHERE t.order_id IS NULL AND t.status = 'unmatched'
       AND coalesce(t.verification -> 'transaction' ->> 'inAppOwnershipType', '') <> 'FAMILY_SHARED'
       AND NOT (t.transaction_id <> coalesce(t.original_transaction_id, t.transaction_id)
                AND EXISTS (SELECT 1 FROM products p
                             WHERE p.product_id = t.product_id AND p.type = 'auto-renewable'
                               AND coalesce(p.bundle_id, '') IN (coalesce(t.bundle_id, ''), '')));
