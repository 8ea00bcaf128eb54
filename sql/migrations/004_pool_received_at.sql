-- The reconciler's view of the pool gains when the ledger recorded each transaction (a pass waits
-- until a user's orphans of one product have all settled, LEDGER_RECONCILE_SETTLE, so purchases
-- made together are aligned together) and the orders support undid a pairing of it with (never
-- its candidates again). docs/reconciliation.md, "The rule" and "Undo".
CREATE OR REPLACE VIEW pool_with_users AS
    SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
           coalesce(t.user_id,
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.app_transaction_id = t.app_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.original_transaction_id = t.original_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1)) AS resolved_user_id,
           t.received_at, t.verification -> 'undoneOrderIds' AS undone_order_ids
      FROM apple_transactions t
     WHERE t.order_id IS NULL AND t.status = 'unmatched';
