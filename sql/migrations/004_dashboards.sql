-- Views for support and finance dashboards, in a schema of their own. ledger_reader may read
-- these views and nothing else: the views read the tables with their owner's rights.
CREATE SCHEMA dashboards;

-- Orders with their current state and age.
CREATE VIEW dashboards.orders AS
    SELECT order_id, user_id, product_id, quantity, price, currency, state, transaction_id,
           created_at, updated_at, now() - created_at AS age, now() - updated_at AS time_in_state
      FROM public.orders;

-- The unmatched pool, oldest first, with age.
CREATE VIEW dashboards.unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           now() - received_at AS age
      FROM public.apple_transactions
     WHERE order_id IS NULL
     ORDER BY received_at;

-- Orders created per day (UTC), product and current state.
CREATE VIEW dashboards.daily_orders AS
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day, product_id, state, count(*) AS orders,
           sum(price * quantity) AS amount, currency
      FROM public.orders
     GROUP BY 1, 2, 3, currency;

REVOKE ALL ON SCHEMA dashboards FROM PUBLIC;
GRANT USAGE ON SCHEMA dashboards TO ledger_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA dashboards TO ledger_reader;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM ledger_reader;
