-- The reconciler's view of the pool: each unmatched transaction with the user it belongs to,
-- its own or, when it came without one, the user of an earlier transaction of the same Apple
-- account (appTransactionId) or subscription (originalTransactionId) that the ledger has tied
-- to a user.
CREATE VIEW pool_with_users AS
    SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
           coalesce(t.user_id,
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.app_transaction_id = t.app_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.original_transaction_id = t.original_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1)) AS resolved_user_id
      FROM apple_transactions t
     WHERE t.order_id IS NULL AND t.status = 'unmatched';

-- Open orders of one user and product, the reconciler's candidates.
CREATE INDEX orders_open_by_user ON orders (user_id, product_id, created_at)
    WHERE state IN ('created', 'payment-added') AND transaction_id IS NULL;
