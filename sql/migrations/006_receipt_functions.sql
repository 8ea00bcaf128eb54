-- The receipt path's two statements as functions: PL/pgSQL keeps their plans per session, and
-- each statement in a function sees what committed before it started (READ COMMITTED), so the
-- holder is read after the transaction's lock is granted, in the same round trip.

-- Takes the Apple transaction's advisory lock, then locks the order row and answers it with
-- the transaction's holder (order id or NULL, and status; no row when the order is unknown).
CREATE FUNCTION lock_order_for_receipt(p_order_id text, p_transaction_id text)
RETURNS TABLE (
    tx_time timestamptz, order_id text, user_id text, product_id text, quantity integer, price text, currency text,
    app_account_token uuid, state text, version bigint, transaction_id text, created_at timestamptz,
    updated_at timestamptz, queued_at timestamptz, state_before_refund text, failure_reason text, holder text
)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('apple-transaction:' || p_transaction_id, 0));
    RETURN QUERY
        SELECT now(), o.order_id, o.user_id, o.product_id, o.quantity, o.price::text, o.currency, o.app_account_token,
               o.state, o.version, o.transaction_id, o.created_at, o.updated_at, o.queued_at, o.state_before_refund,
               o.failure_reason,
               (SELECT row_to_json(h)::text FROM (SELECT t.order_id, t.status FROM apple_transactions t
                                                   WHERE t.transaction_id = p_transaction_id) h)
          FROM orders o WHERE o.order_id = p_order_id FOR UPDATE OF o;
END
$$;

-- Writes an order's row and claims its transaction: a new row, or the pool's row taken over
-- (keeping what the pool knew). Answers false, writing nothing of the claim, when another order
-- holds the transaction; the primary key decides, whatever the concurrency.
CREATE FUNCTION save_order_and_claim(
    p_order_id text, p_user_id text, p_product_id text, p_quantity integer, p_price numeric, p_currency text,
    p_token uuid, p_state text, p_version bigint, p_transaction_id text, p_created_at timestamptz,
    p_updated_at timestamptz, p_queued_at timestamptz, p_state_before_refund text, p_failure_reason text,
    p_claim_product_id text, p_purchase_date timestamptz, p_environment text, p_status text, p_at timestamptz,
    p_original_transaction_id text, p_app_transaction_id text, p_claim_token uuid, p_matched_by text
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
    VALUES (p_order_id, p_user_id, p_product_id, p_quantity, p_price, p_currency, p_token, p_state, p_version,
            p_transaction_id, p_created_at, p_updated_at, p_queued_at, p_state_before_refund, p_failure_reason)
    ON CONFLICT (order_id) DO UPDATE SET
        state = EXCLUDED.state, version = EXCLUDED.version, transaction_id = EXCLUDED.transaction_id,
        updated_at = EXCLUDED.updated_at, queued_at = EXCLUDED.queued_at,
        state_before_refund = EXCLUDED.state_before_refund, failure_reason = EXCLUDED.failure_reason;
    INSERT INTO apple_transactions AS a (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
        received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by)
    VALUES (p_transaction_id, p_order_id, p_user_id, p_claim_product_id, p_purchase_date, p_environment, p_status, p_at, p_at,
            p_original_transaction_id, p_app_transaction_id, p_claim_token, p_matched_by)
    ON CONFLICT (transaction_id) DO UPDATE SET
        order_id = EXCLUDED.order_id, user_id = EXCLUDED.user_id, status = EXCLUDED.status, matched_by = EXCLUDED.matched_by,
        updated_at = EXCLUDED.updated_at,
        environment = coalesce(a.environment, EXCLUDED.environment),
        original_transaction_id = coalesce(a.original_transaction_id, EXCLUDED.original_transaction_id),
        app_transaction_id = coalesce(a.app_transaction_id, EXCLUDED.app_transaction_id),
        app_account_token = coalesce(a.app_account_token, EXCLUDED.app_account_token)
    WHERE a.order_id IS NULL AND a.status = 'unmatched';
    RETURN FOUND;
END
$$;
