-- Restores pay no order (docs/subscriptions.md): StoreKit's restore of a non-consumable is a later
-- transaction of a purchase that is no subscription's (its originalTransactionId names another),
-- which gives the customer again what the original purchase paid for. It is kept with the status
-- `restore`, which the pool, the reconciler and every pairing skip, as they skip `renewal` and
-- `shared`. Rows the pool took in before are left as they are: a rebuild of the log makes them
-- what they were.
ALTER TABLE apple_transactions DROP CONSTRAINT apple_transactions_status_check;
ALTER TABLE apple_transactions ADD CONSTRAINT apple_transactions_status_check
    CHECK (status IN ('unmatched', 'refunded', 'claimed', 'renewal', 'shared', 'conflict', 'restore'));
