-- An order event's append and, only if every event was appended, the order's row as `evolve` left
-- it and the status of the Apple transaction the order holds, in one function. The same writes as
-- one statement with data-modifying CTEs were parsed and planned on every call (a third of the
-- database's time per HTTP append); PL/pgSQL keeps its plans for the session.
--
-- Answers append_to_stream's rows. The caller holds the order's row lock (it read the order FOR
-- UPDATE), so the version the events take, and so the row written, are known beforehand.
CREATE FUNCTION append_and_save_order(
    p_stream_id text, p_expected_version bigint,
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[],
    p_order_id text, p_user_id text, p_product_id text, p_quantity integer, p_price numeric, p_currency text,
    p_token uuid, p_state text, p_version bigint, p_transaction_id text, p_created_at timestamptz,
    p_updated_at timestamptz, p_queued_at timestamptz, p_state_before_refund text, p_failure_reason text,
    p_at timestamptz)
RETURNS TABLE (r_status text, r_detail text, r_event_id uuid, r_stream_version bigint, r_global_position bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_rows     integer := 0;
    v_appended integer := 0;
BEGIN
    FOR r_status, r_detail, r_event_id, r_stream_version, r_global_position IN
        SELECT a.r_status, a.r_detail, a.r_event_id, a.r_stream_version, a.r_global_position
          FROM append_to_stream(p_stream_id, p_expected_version, p_event_ids, p_types, p_data, p_metadata) AS a
    LOOP
        v_rows := v_rows + 1;
        IF r_status = 'appended' THEN v_appended := v_appended + 1; END IF;
        RETURN NEXT;
    END LOOP;
    IF v_rows = 0 OR v_appended <> v_rows THEN
        RETURN;
    END IF;
    INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
    VALUES (p_order_id, p_user_id, p_product_id, p_quantity, p_price, p_currency, p_token, p_state, p_version,
            p_transaction_id, p_created_at, p_updated_at, p_queued_at, p_state_before_refund, p_failure_reason)
    ON CONFLICT (order_id) DO UPDATE SET
        state = EXCLUDED.state, version = EXCLUDED.version, transaction_id = EXCLUDED.transaction_id,
        updated_at = EXCLUDED.updated_at, queued_at = EXCLUDED.queued_at,
        state_before_refund = EXCLUDED.state_before_refund, failure_reason = EXCLUDED.failure_reason;
    IF p_transaction_id IS NOT NULL THEN
        UPDATE apple_transactions SET status = p_state, updated_at = p_at WHERE transaction_id = p_transaction_id;
    END IF;
END
$$;
