-- A transaction held for an Apple-account conflict (status `conflict`, issue 41) is paid and not
-- delivered, as a pooled one is, and support decides it: support's search of the pool
-- (`GET /v1/transactions/unmatched`), the reconciliation report's pool counts and the pool's
-- dashboard left it out, so it showed in `dashboards.apple_account_conflicts` alone. The two
-- views now take it, with each row's status as a last column. The reconciler's
-- `pool_with_users` still leaves it out: no automatic path pairs it.
CREATE OR REPLACE VIEW unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           app_account_token, original_transaction_id, app_transaction_id, verification, bundle_id, status
      FROM apple_transactions
     WHERE order_id IS NULL AND status IN ('unmatched', 'conflict');

CREATE OR REPLACE VIEW dashboards.unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           now() - received_at AS age, bundle_id, status
      FROM public.apple_transactions
     WHERE order_id IS NULL AND status IN ('unmatched', 'conflict')
     ORDER BY received_at;
