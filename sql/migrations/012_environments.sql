-- Both App Store environments (issue 39, "Both environments"): a ledger accepts Sandbox-signed
-- transactions beside Production ones (App Review buys in the sandbox against the production
-- build) and keeps them apart. A transaction's environment is already projected
-- (`apple_transactions.environment`, as Apple signed it); the orders projection has no column of
-- its own, so nothing is rebuilt: an order takes its environment from its transaction.

-- The environment an order counts under in reports: its transaction's; with none now (its
-- pairing undone), the one its last `receipt-received` named; else `Production` (an order not
-- paid through Apple has no Apple revenue to mislead). LedgerStore's ReconciliationReport and
-- dashboards.daily_orders read it, so both keep the sandbox apart by the same rule.
CREATE VIEW order_environments AS
    SELECT o.order_id,
           coalesce(t.environment,
                    (SELECT r.data->>'environment' FROM events r
                      WHERE o.transaction_id IS NULL AND r.stream_id = 'order-' || o.order_id AND r.type = 'receipt-received'
                      ORDER BY r.stream_version DESC LIMIT 1),
                    'Production') AS environment
      FROM orders o
      LEFT JOIN apple_transactions t ON t.transaction_id = o.transaction_id;

GRANT SELECT ON order_environments TO ledger_writer;

-- The dashboards, each with `environment` after its columns of before.

-- An order's transaction's environment, null while it has none (as the API answers it). A
-- subquery rather than a join: the view keeps one table in FROM, so a write through it is still
-- refused for want of the privilege (DashboardTests), not for the view's shape.
CREATE OR REPLACE VIEW dashboards.orders AS
    SELECT order_id, user_id, product_id, quantity, price, currency, state, transaction_id,
           created_at, updated_at, now() - created_at AS age, now() - updated_at AS time_in_state,
           (SELECT t.environment FROM public.apple_transactions t WHERE t.transaction_id = orders.transaction_id) AS environment
      FROM public.orders;

-- 010's view, one row per environment too: the sandbox's amounts are never in production's rows.
CREATE OR REPLACE VIEW dashboards.daily_orders AS
    SELECT (o.created_at AT TIME ZONE 'UTC')::date AS day, o.product_id, o.state, count(*) AS orders,
           sum(o.price * o.quantity) AS amount, o.currency,
           trim_scale(sum(o.price * o.quantity * coalesce(r.share, 0))) AS refunded_amount,
           oe.environment
      FROM public.orders o
      JOIN public.order_environments oe ON oe.order_id = o.order_id
      LEFT JOIN LATERAL (
            SELECT CASE e.data->>'revocationType'
                        WHEN 'REFUND_PRORATED' THEN
                            CASE WHEN jsonb_typeof(e.data->'revocationPercentage') = 'number'
                                 THEN least(greatest((e.data->>'revocationPercentage')::numeric, 0), 100000) / 100000
                                 ELSE 1 END
                        WHEN 'FAMILY_REVOKE' THEN 0
                        ELSE 1 END AS share
              FROM public.events e
             WHERE o.state = 'refunded' AND e.stream_id = 'order-' || o.order_id AND e.type = 'refunded'
             ORDER BY e.stream_version DESC
             LIMIT 1) r ON true
     GROUP BY 1, 2, 3, o.currency, oe.environment;

-- The environment the account's app transaction was signed in.
CREATE OR REPLACE VIEW dashboards.apple_accounts AS
    SELECT substr(l.stream_id, length('apple-account-') + 1) AS app_transaction_id,
           l.data->>'userId' AS user_id, l.recorded_at AS linked_at,
           (SELECT count(*) FROM public.events c WHERE c.stream_id = l.stream_id AND c.stream_version > 0) AS conflicts,
           h.swept_at, h.found, l.data->>'environment' AS environment
      FROM public.events l
      LEFT JOIN public.apple_history_cursors h ON h.account_id = substr(l.stream_id, length('apple-account-') + 1)
     WHERE l.type = 'account-linked';

-- 009's view, with the environment of the transaction each call concerns (the App Store Server
-- API's host it belongs to).
CREATE OR REPLACE VIEW dashboards.apple_calls AS
    SELECT c.kind, c.transaction_id, c.order_id, c.attempts, c.last_error, c.due_at, c.deadline, c.age, c.time_left,
           c.apple_error_code, c.outcome, t.environment
      FROM (
        SELECT kind, transaction_id, order_id, attempts, last_error, due_at, deadline,
               now() - created_at AS age, deadline - now() AS time_left,
               last_apple_error_code AS apple_error_code, NULL::text AS outcome
          FROM public.apple_calls
        UNION ALL
        SELECT CASE e.type WHEN 'consumption-answer' THEN 'consumption' WHEN 'apple-transaction-finished' THEN 'finish' ELSE 'set-token' END,
               e.data->>'transactionId',
               CASE WHEN e.type = 'consumption-answer' THEN
                        CASE WHEN e.stream_id LIKE 'order-%' THEN substr(e.stream_id, 7) END
                    ELSE e.data->>'orderId' END,
               (e.data->>'attempts')::integer, e.data->>'error', NULL::timestamptz, NULL::timestamptz,
               now() - e.recorded_at, NULL::interval,
               (e.data->>'appleErrorCode')::integer, e.data->>'outcome'
          FROM public.events e
         WHERE e.type IN ('consumption-answer', 'apple-transaction-finished', 'apple-account-token-set')
           AND e.data->>'outcome' <> 'sent') c
      LEFT JOIN public.apple_transactions t ON t.transaction_id = c.transaction_id;
