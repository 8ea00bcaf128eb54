-- A renewal is weighed against its subscription's latest period by purchase date
-- (`SubscriptionStore.subscriptions(_:periodKeys:in:)`, one read for a group of renewals). The
-- primary key finds a subscription's periods but not its latest: the read fetched and sorted
-- every period, one heap page each, so a renewal cost more the older its subscription was. This
-- index answers the latest period of a subscription in one descent.
CREATE INDEX subscription_periods_latest
    ON subscription_periods (original_transaction_id, purchase_date DESC, period_key DESC);
