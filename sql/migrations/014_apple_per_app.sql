-- Apple per app (issue 39, "Apple per app"; docs/apple.md, "Several apps"): the work that asks
-- the App Store Server API runs per app with that app's key, at the host of the environment of
-- the transaction it concerns. Each account's cursors and each call to make say which app and
-- environment they are for; the notification backfill keeps one request and position per app
-- and environment instead of one for the ledger.
--
-- A null bundle_id is the ledger's first app (`ledger_first_app`, migration 013; none while it
-- holds no app): rows written before this migration while the ledger held no app, and those it
-- writes while it knows no app for them. The rows already here are given the first app now when
-- the ledger has one.

-- The environment as Apple named the transaction's (`Production`, `Sandbox`); null: unknown,
-- asked at the host of the app's first accepted environment.
ALTER TABLE apple_history_cursors
    ADD COLUMN bundle_id   text,
    ADD COLUMN environment text;
ALTER TABLE apple_refund_cursors
    ADD COLUMN bundle_id   text,
    ADD COLUMN environment text;
ALTER TABLE apple_calls
    ADD COLUMN bundle_id   text,
    ADD COLUMN environment text;

UPDATE apple_history_cursors c
   SET bundle_id = (SELECT bundle_id FROM ledger_first_app),
       environment = (SELECT t.environment FROM apple_transactions t
                       WHERE (t.app_transaction_id = c.account_id OR t.transaction_id = c.account_id)
                         AND t.environment IN ('Production', 'Sandbox')
                       ORDER BY t.purchase_date LIMIT 1);
-- A refund cursor's account is an expression no index holds: the transactions are read once,
-- each account's earliest kept, and joined (a subquery per cursor would read them all per cursor).
UPDATE apple_refund_cursors SET bundle_id = (SELECT bundle_id FROM ledger_first_app);
UPDATE apple_refund_cursors c
   SET environment = f.environment
  FROM (SELECT DISTINCT ON (1) coalesce(t.app_transaction_id, t.original_transaction_id, t.transaction_id) AS account_id, t.environment
          FROM apple_transactions t
         WHERE t.environment IN ('Production', 'Sandbox')
         ORDER BY 1, t.purchase_date) f
 WHERE f.account_id = c.account_id;
UPDATE apple_calls c
   SET bundle_id = (SELECT bundle_id FROM ledger_first_app),
       environment = (SELECT t.environment FROM apple_transactions t
                       WHERE t.transaction_id = c.transaction_id AND t.environment IN ('Production', 'Sandbox'));

-- One backfill per app and environment, each row made on first use. The one row there, when a
-- backfill ran, asked the host the ledger asked then: production's when its app accepted
-- Production (or it held no app), else the sandbox's.
DELETE FROM apple_notification_backfill WHERE start_date IS NULL;
ALTER TABLE apple_notification_backfill DROP CONSTRAINT apple_notification_backfill_pkey;
ALTER TABLE apple_notification_backfill DROP COLUMN only_row;
ALTER TABLE apple_notification_backfill
    ADD COLUMN bundle_id   text,
    ADD COLUMN environment text NOT NULL DEFAULT 'Production' CHECK (environment IN ('Production', 'Sandbox'));
ALTER TABLE apple_notification_backfill ALTER COLUMN environment DROP DEFAULT;
UPDATE apple_notification_backfill
   SET bundle_id = (SELECT bundle_id FROM ledger_first_app),
       environment = coalesce((SELECT CASE WHEN 'Production' = ANY(a.environments) THEN 'Production' ELSE 'Sandbox' END
                                 FROM apps a JOIN ledger_first_app f ON f.bundle_id = a.bundle_id), 'Production');
-- Bundle ids are one app whatever their case, as in `apps`.
CREATE UNIQUE INDEX apple_notification_backfill_app ON apple_notification_backfill ((coalesce(lower(bundle_id), '')), environment);
