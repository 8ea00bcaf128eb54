-- A subscription in Apple's billing retry is `billing-retry` for at most Apple's 60 days (1440
-- hours, as Swift counts them) after its period ended (LedgerCore `Subscription.status(at:)`, the
-- same rule): Apple says `EXPIRED` (`BILLING_RETRY`) by then, and a lost `EXPIRED` must not keep
-- it retrying for ever.
CREATE OR REPLACE FUNCTION subscription_status(s subscriptions, at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
    SELECT CASE WHEN s.revoked_at IS NOT NULL THEN 'revoked'
                WHEN NOT s.expired AND s.expires_at IS NOT NULL AND at < s.expires_at THEN 'active'
                WHEN NOT s.expired AND s.grace_period_expires_at IS NOT NULL AND at < s.grace_period_expires_at THEN 'grace-period'
                WHEN NOT s.expired AND s.in_billing_retry AND s.expires_at IS NOT NULL
                     AND at < s.expires_at + interval '1440 hours' THEN 'billing-retry'
                ELSE 'expired' END
$fn$;
