-- Calls to Apple that events call for (docs/apple.md, "Calls to Apple after delivery and
-- pairing"): finishing a delivered order's transaction at Apple, and setting an order's
-- appAccountToken on a transaction the reconciler or support paired with it. Each is queued in
-- the transaction of the change that calls for it, by a trigger, so none is lost; servers with an
-- App Store Server API key take them with a lease, call Apple, record the outcome as an event,
-- and delete the row. Both are off unless the operator turns them on (ledger_switches, which
-- `ledger serve` writes at start from its settings).

CREATE TABLE ledger_switches (
    only_row                 boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    finish_after_delivery    boolean NOT NULL DEFAULT false,
    set_token_after_pairing  boolean NOT NULL DEFAULT false
);
INSERT INTO ledger_switches DEFAULT VALUES;

CREATE TABLE apple_calls (
    call_id                 text        PRIMARY KEY,
    kind                    text        NOT NULL CHECK (kind IN ('finish', 'set-token')),
    transaction_id          text        NOT NULL,
    original_transaction_id text,
    order_id                text        NOT NULL,
    app_account_token       uuid,
    due_at                  timestamptz NOT NULL DEFAULT now(),
    attempts                integer     NOT NULL DEFAULT 0,
    last_error              text,
    claimed_until           timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX apple_calls_due ON apple_calls (due_at);

-- An order that becomes delivered: finish its transaction at Apple.
CREATE FUNCTION queue_finish_after_delivery() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF (SELECT finish_after_delivery FROM ledger_switches) THEN
        INSERT INTO apple_calls (call_id, kind, transaction_id, order_id)
        VALUES ('finish:' || NEW.transaction_id, 'finish', NEW.transaction_id, NEW.order_id)
        ON CONFLICT (call_id) DO NOTHING;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER orders_delivered
    AFTER UPDATE OF state ON orders
    FOR EACH ROW WHEN (NEW.state = 'delivered' AND OLD.state IS DISTINCT FROM 'delivered' AND NEW.transaction_id IS NOT NULL)
    EXECUTE FUNCTION queue_finish_after_delivery();

-- A pooled transaction the reconciler or support pairs with an order: set the order's token on
-- it at Apple, so that Apple's later notifications about it carry the token.
CREATE FUNCTION queue_set_token_after_pairing() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF (SELECT set_token_after_pairing FROM ledger_switches) THEN
        INSERT INTO apple_calls (call_id, kind, transaction_id, original_transaction_id, order_id, app_account_token)
        SELECT 'set-token:' || NEW.transaction_id, 'set-token', NEW.transaction_id,
               coalesce(NEW.original_transaction_id, NEW.transaction_id), o.order_id, o.app_account_token
          FROM orders o WHERE o.order_id = NEW.order_id
        ON CONFLICT (call_id) DO NOTHING;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER apple_transactions_paired
    AFTER UPDATE OF order_id ON apple_transactions
    FOR EACH ROW WHEN (OLD.order_id IS NULL AND NEW.order_id IS NOT NULL AND NEW.matched_by IN ('reconciler', 'support'))
    EXECUTE FUNCTION queue_set_token_after_pairing();

-- For support and alerts: the calls still to make, and how they have gone so far.
CREATE VIEW dashboards.apple_calls AS
    SELECT kind, transaction_id, order_id, attempts, last_error, due_at, now() - created_at AS age
      FROM public.apple_calls;
GRANT SELECT ON dashboards.apple_calls TO ledger_reader;

GRANT SELECT, INSERT, UPDATE, DELETE ON apple_calls TO ledger_writer;
GRANT SELECT, UPDATE ON ledger_switches TO ledger_writer;
